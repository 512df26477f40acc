"""Schedules, stragglers and backup workers under real mpiexec: the server's replies carry
its progress, the sleeps are real, the drops agreed."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from clients.stragglers import Failures, Stragglers, client_speeds
from experiments.cli import main
from runconfig.settings import RunConfig
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


def failures_of(run: Path) -> tuple[list, list]:
    """(client, step) of each failure, and of each lost minibatch, as the run recorded them."""
    found = sorted((r["client"], r["step"]) for r in rows(run) if r.get("failed"))
    return found, sorted((r["client"], r["step"]) for r in rows(run) if r.get("lost"))


def test_speeds_and_failures_under_mpi_are_those_the_seed_draws_in_the_simulator(tmp_path, tiny_npz):
    """The same seed draws the same speeds and failures on both backends: the MPI run's
    clients sleep them, the simulator's clock has them; the recorded speeds, failures and
    lost minibatches agree with each other and with the pure schedule."""
    flags = ["--data", str(tiny_npz), "--clients", "2", "--steps", "16", "--n-sync", "2", "--speed-spread", "0.3",
             "--mtbf", "6", "--failure-length", "1", "--seed", "3", "--budget", "client", *TINY]  # steps alike
    real, simulated = tmp_path / "mpi", tmp_path / "sim"
    result = mpi_train(3, "--out", str(real), *flags)
    assert result.returncode == 0, result.stderr
    assert main(["train", "--backend", "sim", "--sim-step-time", "0.01", "--quiet", "--out", str(simulated),
                 *flags]) == 0
    config = json.loads((real / "config.json").read_text())
    assert config["speeds_used"] == json.loads((simulated / "config.json").read_text())["speeds_used"] == \
        client_speeds(3, 2, 0.3)
    cfg = RunConfig(mtbf=6, failure_length=1, speed_spread=0.3, seed=3)
    failures = Failures.for_run(cfg, Stragglers.for_run(cfg, 2))
    drawn = sorted((c, step) for c in range(2) for step in failures.schedule(c, 16))
    assert failures_of(real) == failures_of(simulated) and failures_of(real)[0] == drawn and drawn
    summary = json.loads((real / "summary.json").read_text())
    assert summary["failures"] == len(drawn) and summary["goodput"] < 1 and summary["minibatches"] == 32


@pytest.mark.parametrize("mode", ["sync", "local-sgd"])
def test_a_sync_job_waits_for_the_failures_the_seed_draws_in_the_simulator(tmp_path, tiny_npz, mode):
    """Without backup workers each failed try costs the step its outage (the rank sleeps
    it, and the allreduce waits): every step still averages both clients' work, and the
    lost tries are those the simulator draws for the seed; in local-sgd (rounds of 4)
    so are the rows of each failed client's round before its failure. The losses are
    the simulator's (local-sgd's float for float)."""
    flags = ["--data", str(tiny_npz), "--mode", mode, "--clients", "2", "--steps", "12", "--n-sync", "4",
             "--mtbf", "5", "--failure-length", "1", "--seed", "1", *TINY]
    real, simulated = tmp_path / "mpi", tmp_path / "sim"
    result = mpi_train(2, "--out", str(real), *flags)
    assert result.returncode == 0, result.stderr
    assert main(["train", "--backend", "sim", "--sim-step-time", "0.01", "--quiet", "--out", str(simulated),
                 *flags]) == 0
    assert failures_of(real) == failures_of(simulated) and failures_of(real)[0]
    def losses(run: Path) -> list:
        return sorted((r["step"], r["client"], bool(r.get("lost")), r["loss"]) for r in rows(run))
    if mode == "local-sgd":  # each failed client computed again from the same weights
        assert losses(real) == losses(simulated)
    else:  # the allreduce sums the gradients in another order than the simulator's mean: ulps apart
        assert [r[:3] for r in losses(real)] == [r[:3] for r in losses(simulated)]
        assert [r[3] for r in losses(real)] == pytest.approx([r[3] for r in losses(simulated)], rel=1e-5)
    kept = [r["step"] for r in rows(real) if not r.get("failed")]
    assert sorted(kept) == sorted(list(range(1, 13)) * 2)
    summary = json.loads((real / "summary.json").read_text())
    assert summary["minibatches_in_steps"] == 24 - (mode == "local-sgd") * (len(failures_of(real)[1]) -
                                                                           len(failures_of(real)[0]))
    assert summary["failures"] == len(failures_of(real)[0])


@pytest.mark.long
def test_dylu_windows_travel_in_the_replies_and_every_minibatch_is_run_once(tmp_path, tiny_npz):
    """Asynchronous DiLoCo with dynamic local updates: the server's replies set each
    client's window over the wire (the frame's window field). Client 2 sleeps four times
    its compute, so once measured (its first push comes about a quarter of the way through
    the fast clients' 80 steps; with 40 one try in ten here gave it no window under 4) it
    pushes fewer than n_sync minibatches; every (client, step) is still logged once, every
    push applied."""
    run = tmp_path / "run"
    result = mpi_train(4, "--data", str(tiny_npz), "--out", str(run), "--clients", "3", "--steps", "80",
                       "--n-sync", "4", *TINY, "--rule", "nesterov", "--optimizer", "adamw", "--dylu",
                       "--slow-clients", "1", "--slow-factor", "5", "--budget", "client")  # each its 80
    assert result.returncode == 0, result.stderr
    client_rows = rows(run)
    assert sorted((r["client"], r["step"]) for r in client_rows) == [(c, s) for c in range(3) for s in range(1, 81)]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["pushes_sent"] == summary["pushes_applied"]
    applied = [json.loads(line)["version"] for line in (run / "server.jsonl").read_text().splitlines()]
    assert applied == list(range(1, summary["pushes_applied"] + 1))
    slow = [r["step"] for r in client_rows if r["client"] == 2 and "staleness" in r]
    assert np.diff([0, *slow]).max() <= 4 and np.diff([0, *slow])[1:].min() < 4 and slow[-1] == 80


def test_a_run_wide_budget_over_mpi_stops_every_client_once_the_runs_minibatches_are_in(tmp_path, tiny_npz):
    """Speeds 1 and 0.25, 30 steps, the run's budget: the server's reply tells each client
    to stop once 60 minibatches are in or under way (exactly 60), and the fast client
    computed most of them."""
    run = tmp_path / "run"
    result = mpi_train(3, "--out", str(run), "--data", str(tiny_npz), "--clients", "2", "--client-speeds", "1,0.25",
                       "--steps", "30", "--budget", "run", *TINY)
    assert result.returncode == 0, result.stderr
    computed = [sum(1 for r in rows(run) if r["client"] == c) for c in range(2)]
    assert sum(computed) == 60 and computed[0] > 30 > computed[1]
    assert json.loads((run / "summary.json").read_text())["status"] == "complete"
