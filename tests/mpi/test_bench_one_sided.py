"""The one-sided measurement (bench/studies/one_sided.py) under real mpiexec: both of its
sides push, and its one-sided pushes are neither lost nor applied twice, by 2 clients at
once, in memory MPI shares between the ranks and in the server's own array."""
from __future__ import annotations

import json

import pytest

from tests.conftest import BIN, MPIEXEC, run_command

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("window, server", [("shared", "sleeps"), ("private", "spins")])
def test_every_one_sided_push_lands_once_beside_our_server(tmp_path, window, server):
    out = tmp_path / "one_sided.json"
    result = run_command([MPIEXEC, "-n", "3", str(BIN / "python"), "-m", "bench.studies.one_sided",
                          "--sizes", "1000", "--trials", "1", "--seconds", "0.2", "--torn-checks", "50",
                          "--window", window, "--server", server, "--json", str(out)], timeout=120)
    assert result.returncode == 0, result.stderr
    [row] = json.loads(out.read_text())
    print(json.dumps(row))  # the numbers, for the record (pytest -s)
    assert (row["window"], row["server"], row["clients"]) == (window, server, 2)
    assert row["ours_vs_one_sided"]["ours_median"] > 0 and row["ours_vs_one_sided"]["other_median"] > 0
    assert row["pushes_counted"] == row["pushes_sent"] > 100  # the windows' pushes and the 2 x 50 torn checks
    assert row["every_weight_equals_the_count"]  # each push added 1.0 to every weight, exactly once
    assert row["torn_checks"] == 100 and 0 <= row["torn"] <= 100
