"""The cluster tier's live jobs (`tests.cluster.conftest.Job`) start again where the
launcher lost Open MPI's startup race, as `asgd train` does: a retry that never happened
would turn CI's rare race (docs/reliability.md) into a red run."""
from __future__ import annotations

import os
import time

from experiments.parent.supervise import LAUNCH_TRIES, LAUNCHER_RACE
from tests.cluster.conftest import Job


def launcher(tmp_path, races: int) -> list[str]:
    """A launcher that loses the race its first `races` launches (each a line in `tried`),
    then says ok."""
    tried = tmp_path / "tried"
    script = (f'echo x >> {tried}; [ "$(wc -l < {tried})" -le {races} ] && '
              f'{{ echo "The {LAUNCHER_RACE}." >&2; exit 213; }}; echo ok')
    return ["sh", "-c", script]


def test_a_live_job_that_lost_the_race_is_launched_again_and_shows_only_the_launch_that_ran(tmp_path):
    job = Job(launcher(tmp_path, LAUNCH_TRIES - 1), dict(os.environ))
    while job.poll() is None:
        time.sleep(0.01)
    assert job.returncode == 0 and job.communicate(timeout=10) == ("ok\n", "")
    assert (tmp_path / "tried").read_text().count("x") == LAUNCH_TRIES


def test_communicate_launches_again_and_the_last_lost_race_is_the_jobs_end(tmp_path):
    job = Job(launcher(tmp_path, LAUNCH_TRIES), dict(os.environ))
    out, err = job.communicate(timeout=30)
    assert job.returncode == 213 and LAUNCHER_RACE in err and out == ""
    assert (tmp_path / "tried").read_text().count("x") == LAUNCH_TRIES


def test_a_job_that_fails_otherwise_is_not_launched_again(tmp_path):
    tried = tmp_path / "tried"
    job = Job(["sh", "-c", f"echo x >> {tried}; echo failed >&2; exit 3"], dict(os.environ))
    assert job.communicate(timeout=10) == ("", "failed\n") and job.returncode == 3
    assert tried.read_text().count("x") == 1
