"""Open MPI's launcher sometimes fails before any rank starts (PMIx's startup race,
docs/reliability.md): `asgd train`, which launches its own job, starts it once more."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from experiments.parent.supervise import LAUNCH_TRIES
from rundir.status import finished
from tests.conftest import BIN, LAUNCHER, MPIEXEC

pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(LAUNCHER.kind != "openmpi", reason="the race is Open MPI's launcher's")]

RACE = "The PMIx server's listener thread failed to start. We cannot"


def test_a_launcher_that_lost_the_startup_race_is_started_once_more(tmp_path, tiny_npz):
    """A launcher that says PMIx's line and exits before any rank ran, the first time
    only: the run completes (the real launcher may lose the real race at the retry too:
    CI saw it, hence more than one retry); one that says it every time fails, tried
    `LAUNCH_TRIES` times."""
    tried = tmp_path / "tried"
    wrapper = tmp_path / "mpiexec"
    wrapper.write_text(f'#!/bin/sh\nif [ "$1" != "--version" ] && [ ! -e {tried} -o -e {tmp_path / "always"} ]; then\n'
                       f'  echo x >> {tried}; echo "{RACE}" >&2; exit 213\nfi\nexec {MPIEXEC} "$@"\n')
    wrapper.chmod(0o755)
    env = {**os.environ, "ASGD_MPIEXEC": str(wrapper)}

    def train(out: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "asgd"), "train", "--quiet", "--data", str(tiny_npz), "--clients", "2",
                               "--steps", "4", "--batch-size", "32", "--eval-samples", "50", "--out",
                               str(tmp_path / out)], env=env, capture_output=True, text=True, timeout=180)
    result = train("run")
    assert result.returncode == 0, result.stderr
    assert "starting the job once more" in result.stderr and tried.read_text().count("x") == 1
    assert finished(json.loads((tmp_path / "run" / "summary.json").read_text())["status"])  # 4 steps: untrained
    (tmp_path / "always").touch()
    result = train("again")
    assert result.returncode == 213 and tried.read_text().count("x") == 1 + LAUNCH_TRIES
    assert result.stderr.count("starting the job once more") == LAUNCH_TRIES - 1
