"""Schedules, stragglers and backup workers in whole simulated runs: one client follows
torch's LambdaLR step by step, sync follows the large-batch loop, a resume continues the
schedule exactly, the straggler model's times reproduce, backup workers drop b a step."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from clients.data import load_dataset
from experiments.cli import main
from rundir.durable import load_arrays
from tests.conftest import each_logged_once
from tests.reference import assert_steps_close, plain_sgd
from tests.sim.test_sim import TIMED, checkpoint_weights, rows, sim

BATCH = 32  # TIMED's


def cosine_after_warmup(warmup: int, planned: int, floor: float):
    """Written out from the docs' formula, in steps: the multiplier after e steps of BATCH."""
    def factor(e: int) -> float:
        s = e * BATCH
        warm = min(1.0, (s + BATCH) / warmup)
        p = min(1.0, max(0.0, (s - warmup) / (planned - warmup)))
        return warm * (floor + (1 - floor) * (1 + math.cos(math.pi * p)) / 2)
    return factor


@pytest.mark.parametrize("n_sync", [1, 3])
def test_one_client_with_warmup_and_cosine_is_torch_lambdalr(tmp_path, tiny_npz, n_sync):
    """At n_sync 1 the weights of every step follow LambdaLR; at n_sync 3 the window
    trains at the lr of the weights it pulled, which the rows say."""
    steps, warmup = 12, 5 * BATCH
    run = sim(tmp_path / "run", tiny_npz, "--clients", "1", "--rule", "add", "--steps", str(steps),
              "--n-sync", str(n_sync), "--lr-warmup", str(warmup), "--lr-schedule", "cosine", "--lr-floor", "0.1")
    factor = cosine_after_warmup(warmup, steps * BATCH, 0.1)
    lrs = [r["lr"] for r in rows(run, "clients")]
    pulled = [e - e % n_sync for e in range(steps)]  # steps done when the window's weights were pulled
    assert lrs == pytest.approx([0.01 * factor(e) for e in pulled], rel=1e-12)
    if n_sync == 1:
        expected = plain_sgd(load_dataset(str(tiny_npz)), steps, batch_size=BATCH, lr=0.01, lr_lambda=factor)
        assert_steps_close(checkpoint_weights(run), expected, steps)


def test_adascale_with_one_client_is_torch_sgd_on_its_schedule(tmp_path, tiny_npz):
    """The default rule under adascale at one client and n_sync 1: every step's gain is 1,
    so its progress is the samples pushed and the run is torch's SGD under LambdaLR."""
    steps, warmup = 12, 5 * BATCH
    run = sim(tmp_path / "run", tiny_npz, "--clients", "1", "--steps", str(steps), "--lr-scaling", "adascale",
              "--lr-warmup", str(warmup), "--lr-schedule", "cosine", "--lr-floor", "0.1")
    factor = cosine_after_warmup(warmup, steps * BATCH, 0.1)
    expected = plain_sgd(load_dataset(str(tiny_npz)), steps, batch_size=BATCH, lr=0.01, lr_lambda=factor)
    assert_steps_close(checkpoint_weights(run), expected, steps)
    assert [r["lr"] for r in rows(run, "clients")] == pytest.approx([0.01 * factor(e) for e in range(steps)],
                                                                     rel=1e-12)


def test_adascale_resumes_its_gain_weighted_progress(tmp_path, tiny_npz):
    """Killed past a checkpoint and resumed: the progress the noise rows state goes on from
    the checkpoint's gains (b x rule_scalar.gained), neither from zero nor from the
    samples pushed (each step of 2 minibatches counts its r, about 1.1 on these blobs)."""
    run = tmp_path / "run"
    flags = ["--clients", "2", "--steps", "12", "--eval-every", "4", "--lr-scaling", "adascale", "--lr-warmup", "400"]
    assert main(["train", "--backend", "sim", "--data", str(tiny_npz), "--out", str(run), *TIMED, *flags,
                 "--inject-fault", "0:7"]) == 1
    gained = float(load_arrays(run / "checkpoint" / "latest.npz")["rule_scalar.gained"])
    assert gained > 0
    assert main(["train", "--resume", str(run), "--quiet"]) == 0
    noise = [r for r in rows(run, "server") if "noise_scale" in r]
    assert len(noise) == 12 and all(1 <= r["gain"] <= 2 for r in noise)  # a window of 2 pushes a step
    samples = [r["samples"] for r in noise]
    assert samples == sorted(samples) and round(BATCH * gained) in samples
    assert all(BATCH * (i + 1) <= s <= 2 * BATCH * (i + 1) for i, s in enumerate(samples))
    assert samples[0] == BATCH and samples[-1] < 1.5 * BATCH * 12  # r = 1 at the first step; 768 pushed


def test_sync_with_linear_scaling_and_steps_is_the_large_batch_loop(tmp_path, tiny_npz):
    run = sim(tmp_path / "run", tiny_npz, "--mode", "sync", "--clients", "3", "--steps", "10", "--lr-scaling", "linear",
              "--lr-scale-warmup", "0", "--lr-schedule", "step", "--lr-milestones", str(4 * 3 * BATCH),
              "--lr-step-factor", "0.5")
    expected = plain_sgd(load_dataset(str(tiny_npz)), 10, batch_size=BATCH, lr=0.03, clients=3,
                         lr_lambda=lambda e: 0.5 if e >= 4 else 1.0)
    assert_steps_close(checkpoint_weights(run), expected, 10)
    assert [r["lr"] for r in rows(run, "clients")] == pytest.approx([0.03] * 12 + [0.015] * 18)


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_a_resumed_run_continues_the_schedule_exactly(tmp_path, tiny_npz, mode):
    """Killed past a checkpoint (async: at the server's version 14; sync: client 1's step 7).
    A sync run resumes at the same lr and virtual time each step (its losses differ: the
    clients' momentum is not checkpointed); an async one cannot (the clients pull afresh), but
    every row's lr is still the schedule's at the progress of the version it pulled
    (n_sync 1: version x batch), not one restarted from zero."""
    flags = ["--mode", mode, "--rule", "easgd", "--clients", "2", "--steps", "12", "--eval-every", "4",
             "--lr-warmup", "400", "--lr-schedule", "cosine", "--step-sigma", "0.5"]
    whole = sim(tmp_path / "whole", tiny_npz, *flags)
    broken = tmp_path / "broken"
    fault = "0:14" if mode == "async" else "1:7"
    assert main(["train", "--backend", "sim", "--data", str(tiny_npz), "--out", str(broken), *TIMED, *flags,
                 "--inject-fault", fault]) == 1
    assert main(["train", "--resume", str(broken), "--quiet"]) == 0

    def by_step(run):
        return sorted((r["client"], r["step"], r["lr"], r["time"]) for r in rows(run, "clients"))
    assert sum(each_logged_once([row[:2] for row in by_step(broken)], 2)) == 24  # the run's 2 x 12
    if mode == "sync":
        assert by_step(broken) == by_step(whole)
        return
    factor = cosine_after_warmup(400, 2 * 12 * BATCH, 0.0)
    for run in (whole, broken):
        assert [r["lr"] for r in rows(run, "clients")] == \
            pytest.approx([0.01 * factor(r["version_pulled"]) for r in rows(run, "clients")], rel=1e-12)
    assert max(r["version_pulled"] for r in rows(broken, "clients")) >= 20


def test_straggler_times_reproduce_and_a_slow_client_is_that_much_slower(tmp_path, tiny_npz):
    flags = ["--clients", "3", "--steps", "8", "--n-sync", "8", "--step-sigma", "0.5", "--pause-prob", "0.2",
             "--pause-time", "0.05"]
    a, b = sim(tmp_path / "a", tiny_npz, *flags), sim(tmp_path / "b", tiny_npz, *flags)
    assert (a / "clients.jsonl").read_bytes() == (b / "clients.jsonl").read_bytes()
    plain = sim(tmp_path / "plain", tiny_npz, *flags[:6])
    times = {r["client"]: [] for r in rows(a, "clients")}
    for r in rows(a, "clients"):
        times[r["client"]].append(r["time"])
    assert len({round(t[1] - t[0], 9) for t in times.values()}) == 3  # no two clients alike
    assert rows(plain, "clients") != rows(a, "clients")
    slow = sim(tmp_path / "slow", tiny_npz, *flags[:6], "--slow-clients", "1", "--slow-factor", "3")
    gaps = {c: np.diff([r["time"] for r in rows(slow, "clients") if r["client"] == c]) for c in range(3)}
    np.testing.assert_allclose(gaps[2], 0.03, rtol=1e-9)   # one window: step times only
    np.testing.assert_allclose(gaps[0], 0.01, rtol=1e-9)


def test_backup_workers_drop_exactly_b_gradients_a_step(tmp_path, tiny_npz):
    run = sim(tmp_path / "run", tiny_npz, "--mode", "sync", "--clients", "4", "--steps", "6", "--backup-workers", "1",
              "--step-sigma", "0.5", "--slow-clients", "1", "--slow-factor", "1.5")
    client_rows = rows(run, "clients")
    for step in range(1, 7):
        assert sum(bool(r.get("dropped")) for r in client_rows if r["step"] == step) == 1
    summary = json.loads((run / "summary.json").read_text())
    assert summary["gradients_dropped"] == 6 and summary["status"] == "complete"
    waiting = sim(tmp_path / "all", tiny_npz, "--mode", "sync", "--clients", "4", "--steps", "6", "--step-sigma", "0.5",
                  "--slow-clients", "1", "--slow-factor", "1.5")
    assert summary["time_s"] < json.loads((waiting / "summary.json").read_text())["time_s"]
