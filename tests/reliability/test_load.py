"""Load: 16 clients (oversubscribed) push a 1e6-float model as fast as they can for 10 s
through the real server loop, under real mpiexec (a client rank of the bench imports no
torch, so the test's time is the load's). What it measured: docs/reliability.md (load)."""
from __future__ import annotations

import json

import pytest

from tests.conftest import BIN, MPIEXEC, run_command

pytestmark = [pytest.mark.mpi, pytest.mark.slow]


@pytest.mark.long
def test_sixteen_clients_under_load_lose_nothing_and_the_server_memory_stays_flat(tmp_path):
    out = tmp_path / "load.json"
    result = run_command([MPIEXEC, "-n", "17", str(BIN / "python"), "-m", "bench.wire",
                          "load", "--size", "1e6", "--seconds", "10", "--json", str(out)], timeout=240)
    assert result.returncode == 0, result.stderr
    load = json.loads(out.read_text())
    print(json.dumps(load))  # the numbers, for the record (pytest -s)
    assert load["clients_stopped"] == 16  # every client finished
    # none lost, none twice; over 1000 so that the memory is sampled (every 100 pushes) often
    assert load["pushes"] == load["pushes_sent"] > 1000 and load["rejected"] == 0
    assert load["rss_mb_max"] - load["rss_mb_after_warmup"] < 8  # 8 MB: two copies of the model
