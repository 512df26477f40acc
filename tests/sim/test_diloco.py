"""Synchronous DiLoCo (`--mode local-sgd` with an outer step, clients/outer.py): plain
averaging at outer lr 1 and momentum 0, DiLoCo's pseudocode otherwise, resumed exactly."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.sim.test_sim import rows, sim

# 3 clients, 3 rounds of H = 4 of the tool's default SGD (momentum 0.9 kept across rounds)
ROUNDS = ["--mode", "local-sgd", "--clients", "3", "--n-sync", "4", "--steps", "12", "--lr-scaling", "none"]
PUBLISHED = ["--outer-lr", "0.7", "--nesterov-momentum", "0.9"]


def weights(run: Path) -> np.ndarray:
    return np.load(run / "checkpoint" / "latest.npz")["weights"]


def test_outer_lr_1_and_momentum_0_are_todays_local_sgd_bit_for_bit(tmp_path, tiny_npz):
    """Plain averaging is no outer step (a step of lr 1 would round global - (global -
    mean) otherwise than the mean), and it stays the default in local-sgd."""
    today = sim(tmp_path / "today", tiny_npz, *ROUNDS)
    plain = sim(tmp_path / "plain", tiny_npz, *ROUNDS, "--outer-lr", "1", "--nesterov-momentum", "0")
    np.testing.assert_array_equal(weights(plain), weights(today))
    assert [r["loss"] for r in rows(plain, "clients")] == [r["loss"] for r in rows(today, "clients")]
    config = json.loads((today / "config.json").read_text())
    assert config["nesterov_momentum"] is None and (config["outer_lr_used"], config["outer_momentum_used"]) == (1.0, 0.0)
    assert not any(key.startswith("outer.") for key in np.load(today / "checkpoint" / "latest.npz").files)


def test_the_outer_step_is_dilocos_pseudocode_in_float64(tmp_path, tiny_npz):
    """Against tests/reference.py's float64 loop of DiLoCo's Algorithm 1 (each worker's own
    SGD kept across rounds, outer Nesterov SGD on the mean of global - local). 12 float32
    steps leave the weights (|w| < 0.5) within a few ulps (3e-8 at 0.33; measured 1.4e-7)
    of the exact arithmetic: 1e-6, as the project's other plain loops of 12 steps. Plain
    averaging ends 2e-2 from it, and so would a wrong momentum, lr or pseudo-gradient sign."""
    from clients.data import load_dataset
    from tests.reference import plain_diloco

    run = sim(tmp_path / "diloco", tiny_npz, *ROUNDS, *PUBLISHED)
    expected = plain_diloco(load_dataset(str(tiny_npz)), 3, 4, clients=3, outer_lr=0.7, outer_momentum=0.9)
    np.testing.assert_allclose(weights(run), expected, atol=1e-6, rtol=0)
    plain = sim(tmp_path / "plain", tiny_npz, *ROUNDS)
    assert np.abs(weights(plain) - expected).max() > 1e-3
    assert json.loads((run / "config.json").read_text())["outer_momentum_used"] == 0.9


def test_synchronous_diloco_resumes_with_its_outer_momentum(tmp_path, tiny_npz):
    """Stopped at step 7 (back to its averaging step 4) and resumed, it ends with the very
    weights of a run that never stopped: the momentum is in the checkpoint."""
    flags = [*ROUNDS, *PUBLISHED, "--eval-every", "2", "--optimizer", "adamw"]
    whole = sim(tmp_path / "whole", tiny_npz, *flags)
    from experiments.cli import main
    from tests.sim.test_sim import TIMED
    resumed = tmp_path / "resumed"
    assert main(["train", "--backend", "sim", "--data", str(tiny_npz), "--out", str(resumed), *TIMED, *flags,
                 "--inject-fault", "1:7"]) == 1
    assert "outer.momentum" in np.load(resumed / "checkpoint" / "latest.npz").files
    assert main(["train", "--backend", "sim", *TIMED, "--resume", str(resumed)]) == 0
    np.testing.assert_array_equal(weights(resumed), weights(whole))


@pytest.mark.parametrize("reply", ["round", "auto"])
def test_delayed_nesterov_holding_each_round_is_synchronous_diloco_at_equal_speeds(tmp_path, tiny_npz, reply):
    """`--rule nesterov` with N = K equal-speed clients, the round's early pushers held
    for its momentum step (`nesterov_reply = "round"`, paramserver/reply/policy.py; and
    by the default `auto`, whose pace sees every push of a round come together): every
    client starts each round from the same weights, and the run is the sync mode's
    DiLoCo but for the order of float32 additions (the server adds eps d / N push by
    push, the outer step the mean): measured 1.5e-7, a few ulps of |w| < 0.5, within the
    1e-6 of test_the_outer_step_is_dilocos_pseudocode_in_float64. Answered at once (the
    paper's `now`), K - 1 clients run each round from weights without its momentum step,
    and the run ends 3e-3 away."""
    sync = sim(tmp_path / "sync", tiny_npz, *ROUNDS, *PUBLISHED)
    delayed = ["--rule", "nesterov", *ROUNDS[2:], *PUBLISHED]
    held = sim(tmp_path / "held", tiny_npz, *delayed, "--nesterov-reply", reply)
    np.testing.assert_allclose(weights(held), weights(sync), atol=1e-6, rtol=0)
    pushes = rows(held, "server")
    assert len(pushes) == 9 and {r["staleness"] for r in pushes[3:]} == {0, 1, 2}  # all pulled after each round
    now = sim(tmp_path / "now", tiny_npz, *delayed, "--nesterov-reply", "now")
    assert np.abs(weights(now) - weights(sync)).max() > 1e-3


def test_held_rounds_that_cannot_complete_are_answered(tmp_path, tiny_npz):
    """Uneven speeds under the run's budget: a client stops while the others are held for
    a round that needed its push, and they are answered as the weights are (the run
    ends), never left waiting."""
    run = sim(tmp_path / "run", tiny_npz, "--rule", "nesterov", "--nesterov-reply", "round", "--clients", "3",
              "--n-sync", "2", "--steps", "7", "--speed-jitter", "0.5", "--lr-scaling", "none", *PUBLISHED)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["minibatches"] >= 21  # the budget's, in whole windows
    assert len(rows(run, "server")) % 3 != 0  # the last round was cut short: answered without its N-th push


def test_auto_answers_at_once_where_a_straggler_keeps_the_round_open(tmp_path, tiny_npz):
    """One client 3x slower, the run's budget: `round` makes every round wait for it (the
    pushes go 0, 1, 2 in turn, synchronous), `auto` holds only the first round (the
    clients not yet timed) and then answers the fast clients at once, as `now` does, so
    they push more often than the slow one and the run's minibatches are in sooner."""
    flags = ["--rule", "nesterov", "--clients", "3", "--n-sync", "2", "--steps", "12", "--slow-clients", "1",
             "--slow-factor", "3"]
    runs = {reply: sim(tmp_path / reply, tiny_npz, *flags, "--nesterov-reply", reply) for reply in ("round", "auto")}
    order = {reply: [r["client"] for r in rows(run, "server")] for reply, run in runs.items()}
    assert order["round"] == [0, 1, 2] * 6
    assert order["auto"][:3] == [0, 1, 2] and order["auto"].count(2) < order["auto"].count(0)
    end = {reply: json.loads((run / "summary.json").read_text())["time_s"] for reply, run in runs.items()}
    assert end["auto"] < 0.75 * end["round"]  # measured 0.24 against 0.36 virtual s


def test_auto_answers_held_clients_when_a_failed_client_starts_its_window_afresh(tmp_path, tiny_npz):
    """Failures at equal speeds (a window of 4 minibatch times, each failure 10 long): a
    failed client is counted out only after 3 windows, so `auto` held a round's early
    pushers through each failure as `round` does, then through the failed client's fresh
    window. Its PULL tells the pace that push is a window away, and the held clients are
    answered then: the run's time is `now`'s (measured 0.603 against 0.601 virtual s,
    `round` 0.883; 0.643 while the PULL re-decided nothing)."""
    flags = ["--rule", "nesterov", "--clients", "4", "--n-sync", "4", "--steps", "40", "--mtbf", "20",
             "--failure-length", "10"]
    end = {reply: json.loads((sim(tmp_path / reply, tiny_npz, *flags, "--nesterov-reply", reply)
                              / "summary.json").read_text())["time_s"] for reply in ("now", "round", "auto")}
    assert end["auto"] < 1.03 * end["now"] and end["auto"] < 0.8 * end["round"]
