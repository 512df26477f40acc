"""Resume: a run that died part-way finishes with every minibatch and push logged once."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.cli import main
from paramserver.config import InjectedFault
from paramserver.runlog import load_arrays
from tests.sim.test_sim import TIMED, rows


def train(*flags: str) -> int:
    return main(["train", "--backend", "sim", *TIMED, *flags])


def assert_logged_once(run: Path, clients: int, steps: int, versions: int) -> None:
    assert sorted((r["client"], r["step"]) for r in rows(run, "clients")) == \
        [(c, s) for c in range(clients) for s in range(1, steps + 1)]
    applied = [r["version"] for r in rows(run, "server") if "version" in r]
    assert applied == list(range(1, versions + 1))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["minibatches"] == clients * steps


def test_async_run_killed_by_a_fault_resumes_then_extends(tmp_path, tiny_npz):
    run = tmp_path / "run"
    with pytest.raises(InjectedFault):
        train("--data", str(tiny_npz), "--out", str(run), "--clients", "3", "--steps", "12", "--n-sync", "2",
              "--eval-every", "4", "--inject-fault", "0:10")
    assert json.loads((run / "summary.json").read_text())["status"].startswith("failed")
    assert len(rows(run, "server")) == 10  # logged past the checkpoint at version 8: cut back on resume
    assert train("--resume", str(run)) == 0
    assert_logged_once(run, clients=3, steps=12, versions=18)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["pushes_sent"] == summary["pushes_applied"] == 18
    assert sum(summary["staleness"]["histogram"].values()) == 18
    evals = [r["version"] for r in rows(run, "eval")]
    assert evals == sorted(set(evals)) and evals[0] == 0 and evals[-1] == 18
    config = json.loads((run / "config.json").read_text())
    assert len(config["resumed"]) == 1

    assert train("--resume", str(run), "--steps", "16") == 0  # extend the finished run
    assert_logged_once(run, clients=3, steps=16, versions=24)
    assert main(["train", "--resume", str(run)]) == 2  # complete, nothing to do


@pytest.mark.parametrize("mode", ["sync", "local-sgd"])
def test_collective_run_resumes_from_its_checkpoint(tmp_path, tiny_npz, mode):
    run = tmp_path / "run"
    with pytest.raises(InjectedFault):
        train("--data", str(tiny_npz), "--out", str(run), "--mode", mode, "--clients", "2", "--steps", "10",
              "--n-sync", "2", "--eval-every", "2", "--inject-fault", "1:7")
    assert train("--resume", str(run)) == 0
    assert sorted((r["client"], r["step"]) for r in rows(run, "clients")) == \
        [(c, s) for c in range(2) for s in range(1, 11)]
    assert json.loads((run / "summary.json").read_text())["status"] == "complete"


def test_resume_refuses_changed_settings(tmp_path, tiny_npz, capsys):
    run = tmp_path / "run"
    assert train("--data", str(tiny_npz), "--out", str(run), "--clients", "2", "--steps", "2") == 0
    assert main(["train", "--resume", str(run), "--lr", "0.5"]) == 2
    assert "resume: lr cannot change" in capsys.readouterr().err
    assert main(["train", "--resume", str(tmp_path / "nowhere")]) == 2


@pytest.mark.mpi
def test_mpi_job_killed_mid_run_resumes_with_every_minibatch_once(tmp_path, tiny_npz):
    """With DC-ASGD, whose state (each client's pulled weights, the mean square) the
    resumed server must take from the checkpoint."""
    import subprocess
    import time

    from tests.conftest import BIN, kill_tree, mpi_train

    run = tmp_path / "run"
    flags = ["--quiet", "--data", str(tiny_npz), "--batch-size", "32", "--lr", "0.01", "--steps", "1000",
             "--eval-every", "100", "--eval-samples", "50", "--rule", "dcasgd", "--out", str(run)]
    job = subprocess.Popen([str(BIN / "mpiexec"), "-n", "4", str(BIN / "asgd"), "train", *flags],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 90
    while not (run / "server.jsonl").exists() or (run / "server.jsonl").read_bytes().count(b"\n") < 450:
        assert job.poll() is None and time.monotonic() < deadline, "the job ended before it could be killed"
        time.sleep(0.05)
    kill_tree(job.pid)  # SIGKILL: mpiexec and every rank, mid-write perhaps
    job.wait()
    assert not (run / "summary.json").exists()
    saved = load_arrays(run / "checkpoint" / "latest.npz")
    assert {"rule.backup.0", "rule.backup.1", "rule.backup.2", "rule.meansquare"} <= set(saved)
    result = mpi_train(4, "--resume", str(run), timeout=120)
    assert result.returncode == 0, result.stderr
    assert_logged_once(run, clients=3, steps=1000, versions=3000)


def test_resume_from_a_corrupt_checkpoint_exits_2(tmp_path, tiny_npz, capsys):
    run = tmp_path / "run"
    assert train("--data", str(tiny_npz), "--out", str(run), "--clients", "2", "--steps", "2") == 0
    checkpoint = run / "checkpoint" / "latest.npz"
    data = bytearray(checkpoint.read_bytes())
    data[len(data) // 2] ^= 0xFF
    checkpoint.write_bytes(bytes(data))
    assert main(["train", "--resume", str(run), "--steps", "4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "resume:" in err and "latest.npz" in err
