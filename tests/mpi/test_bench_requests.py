"""The persistent-request measurement (bench/studies/requests.py) under real mpiexec:
both kinds of request carry every round trip's floats there and back."""
from __future__ import annotations

import re

import pytest

from tests.conftest import BIN, MPIEXEC, run_command

pytestmark = pytest.mark.mpi


def test_persistent_and_fresh_requests_both_bring_the_floats_back():
    result = run_command([MPIEXEC, "-n", "2", str(BIN / "python"), "-m", "bench.studies.requests",
                          "--size", "1000", "--trials", "2", "--repeats", "50"], timeout=120)
    assert result.returncode == 0, result.stderr  # it exits non-zero where a round trip lost its floats
    print(result.stdout)  # the numbers, for the record (pytest -s)
    match = re.search(r"fresh ([\d.]+) us, persistent ([\d.]+) us a round trip; persistent / fresh ([\d.]+) \(",
                      result.stdout)
    assert match and all(float(x) > 0 for x in match.groups())
