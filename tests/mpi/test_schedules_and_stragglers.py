"""Schedules, stragglers and backup workers under real mpiexec: the server's replies carry
its progress, the sleeps are real, the drops agreed."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import mpi_train

pytestmark = pytest.mark.mpi
TINY = ["--batch-size", "32", "--lr", "0.01", "--eval-samples", "50", "--rule", "easgd", "--lr-scale-warmup", "0"]


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "clients.jsonl").read_text().splitlines()]


def test_each_window_trains_at_the_lr_of_the_progress_its_weights_came_with(tmp_path, tiny_npz):
    """n_sync 1: a window's weights came after `version_pulled` pushes of one minibatch,
    so its lr is the warmup's at that many minibatches, whatever order the pushes took."""
    run = tmp_path / "run"
    result = mpi_train(3, "--data", str(tiny_npz), "--out", str(run), "--clients", "2", "--steps", "10",
                       "--lr-warmup", "640", *TINY)
    assert result.returncode == 0, result.stderr
    client_rows = rows(run)
    assert [r["lr"] for r in client_rows] == pytest.approx(
        [0.01 * min(1.0, (32 * r["version_pulled"] + 32) / 640) for r in client_rows], rel=1e-12)
    assert len({r["lr"] for r in client_rows}) > 5


def test_a_slow_client_really_takes_slow_factor_times_as_long(tmp_path, tiny_npz):
    """One window of 12 minibatches each (nothing but compute between rows): client 1
    sleeps four times what each of its steps computed. The ratio of the two clients'
    median step gaps is 5 up to how the two shared the cores (the slow client computes its
    last steps alone) and how late a loaded machine wakes a sleeper (17.6 was measured
    with steps of 1 ms on a 2-core machine running other jobs: minibatches of 128 make
    the sleeps long against that); bounds well outside both."""
    run = tmp_path / "run"
    result = mpi_train(3, "--data", str(tiny_npz), "--out", str(run), "--clients", "2", "--steps", "12",
                       "--n-sync", "12", "--slow-clients", "1", "--slow-factor", "5", *TINY, "--batch-size", "128")
    assert result.returncode == 0, result.stderr
    gaps = {c: np.median(np.diff([r["time"] for r in rows(run) if r["client"] == c])) for c in (0, 1)}
    assert 2 < gaps[1] / gaps[0] < 40


def test_backup_workers_over_mpi_drop_one_gradient_a_step_on_every_rank_alike(tmp_path, tiny_npz):
    run = tmp_path / "run"
    result = mpi_train(3, "--data", str(tiny_npz), "--out", str(run), "--mode", "sync", "--steps", "8",
                       "--backup-workers", "1", "--step-sigma", "0.5", "--lr-scaling", "linear", *TINY)
    assert result.returncode == 0, result.stderr
    client_rows = rows(run)
    for step in range(1, 9):
        assert sum(bool(r.get("dropped")) for r in client_rows if r["step"] == step) == 1
    assert {r["lr"] for r in client_rows} == {0.02}  # 0.01 x the 2 gradients a step averages
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["gradients_dropped"] == 8


def test_dylu_windows_travel_in_the_replies_and_every_minibatch_is_run_once(tmp_path, tiny_npz):
    """Asynchronous DiLoCo with dynamic local updates: the server's replies set each
    client's window over the wire (the frame's window field). Client 2 sleeps four times
    its compute, so once measured (its first push comes about half way through the fast
    clients' steps) it pushes fewer than n_sync minibatches; every (client, step) is still
    logged once, every push applied."""
    run = tmp_path / "run"
    result = mpi_train(4, "--data", str(tiny_npz), "--out", str(run), "--clients", "3", "--steps", "40",
                       "--n-sync", "4", *TINY, "--rule", "nesterov", "--optimizer", "adamw", "--dylu",
                       "--slow-clients", "1", "--slow-factor", "5")
    assert result.returncode == 0, result.stderr
    client_rows = rows(run)
    assert sorted((r["client"], r["step"]) for r in client_rows) == [(c, s) for c in range(3) for s in range(1, 41)]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["pushes_sent"] == summary["pushes_applied"]
    applied = [json.loads(line)["version"] for line in (run / "server.jsonl").read_text().splitlines()]
    assert applied == list(range(1, summary["pushes_applied"] + 1))
    slow = [r["step"] for r in client_rows if r["client"] == 2 and "staleness" in r]
    assert np.diff([0, *slow]).max() <= 4 and np.diff([0, *slow])[1:].min() < 4 and slow[-1] == 40
