"""What experiments.api.train hands back: an int, the exit status, carrying the run's result.

The simulator's result: tests/sim/test_your_model.py; rank 0's under mpiexec:
tests/mpi/test_your_model.py."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.api import TrainResult, train
from rundir.durable import write_json_atomic


def test_raise_systemexit_of_a_result_exits_with_its_status_and_prints_nothing():
    script = "from experiments.result import TrainResult\nraise SystemExit(TrainResult(3, '/r', {'status': 'x'}))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (3, "")


def test_a_result_is_read_only_and_says_what_the_summary_says():
    result = TrainResult(0, "/runs/a", {"status": "complete", "final_test_error": 0.1, "final_test_loss": 0.3})
    assert result == 0 and result.exit_status == 0 and (result.status, result.final_test_error,
                                                          result.final_test_loss) == ("complete", 0.1, 0.3)
    with pytest.raises(AttributeError, match="read-only"):
        result.summary = None
    assert (TrainResult(0).status, TrainResult(0).final_test_error) == (None, None)  # a rank that records nothing


def test_bad_input_hands_back_exit_status_2_and_no_run(capsys):
    result = train("cnn", "fashion-mnist", argv=[], not_a_setting=1)
    assert (result, result.run_dir, result.summary) == (2, None, None)
    assert capsys.readouterr().err.count("\n") == 1
    refused = train("cnn", "fashion-mnist", argv=["--n-sync", "0"])  # refused by asgd train's own checks
    assert (refused, refused.run_dir, refused.summary) == (2, None, None)


def test_launching_mpiexec_itself_train_reads_the_result_back_from_the_run_directory(tmp_path, tiny_npz,
                                                                                      monkeypatch):
    """The parent's side: the job (here a stand-in for mpiexec and its ranks) writes the
    summary into the run directory asgd chose (by default runs/<time>-...), read back after."""
    from experiments.parent import supervise

    jobs = []

    def job(command, env, out, lock_fd, forwarded=False):
        jobs.append(out)
        write_json_atomic(Path(out) / "summary.json", {"status": "complete", "final_test_error": 0.125})
        return 0

    monkeypatch.setattr(supervise, "supervise", job)
    monkeypatch.setenv("ASGD_MPIEXEC", "true")  # found, never run as a launcher
    monkeypatch.chdir(tmp_path)
    result = train("cnn", str(tiny_npz), argv=["--quiet"])
    [out] = jobs
    assert result == 0 and result.run_dir == str(tmp_path / out) and out.startswith("runs/")
    assert result.summary == json.loads((tmp_path / out / "summary.json").read_text())
    assert (result.status, result.final_test_error) == ("complete", 0.125)
    assert [p.name for p in (tmp_path / out).iterdir()] == ["summary.json"]  # the lock released and removed
