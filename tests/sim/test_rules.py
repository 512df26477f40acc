"""The fresh and nesterov rules in whole simulated runs: fresh at S = K, R = 0 and equal
speeds is sync; drops are logged and counted; the run ends however the clients finish;
the noise scale is logged, summarised and drives fresh_batch = auto; a resumed run
keeps the rule's state."""
from __future__ import annotations

import json

import numpy as np
import pytest

from experiments.cli import main
from rundir.durable import load_arrays
from tests.conftest import assert_logged_once, each_logged_once
from tests.reference import assert_steps_close
from tests.sim.test_sim import TIMED, checkpoint_weights, rows, sim


def summary(run) -> dict:
    return json.loads((run / "summary.json").read_text())


@pytest.mark.parametrize("reply", ["wait", "auto"])
def test_fresh_with_s_k_and_r_0_at_equal_speeds_is_sync(tmp_path, tiny_npz, reply):
    """Every loss of every client, and the final weights, as --mode sync at the same lr,
    with the linear lr rule, a warmup and the rule's own ramped in (the step's lr is the
    one of the progress its gradients were computed at). By its pace (auto) every client waits, as with wait."""
    flags = ["--clients", "3", "--steps", "8", "--lr-scaling", "linear", "--lr-warmup", "300",
             "--lr-scale-warmup", "4"]
    fresh = sim(tmp_path / "fresh", tiny_npz, "--rule", "fresh", "--server-momentum", "0.9",
                "--fresh-reply", reply, *flags)
    sync = sim(tmp_path / "sync", tiny_npz, "--mode", "sync", *flags)

    def losses(run):
        return sorted((r["client"], r["step"], r["loss"]) for r in rows(run, "clients"))
    for ours, theirs in zip(losses(fresh), losses(sync), strict=True):  # (the rows' lr is the clients' own)
        assert ours[:2] == theirs[:2] and ours[2] == pytest.approx(theirs[2], rel=1e-5)
    assert_steps_close(checkpoint_weights(fresh), checkpoint_weights(sync), 8)
    s = summary(fresh)
    assert s["version"] == 8 and s["pushes_applied"] == 24 and s["pushes_dropped"] == 0
    assert {r["version"] for r in rows(fresh, "server") if "version" in r} == set(range(0, 9))


@pytest.mark.parametrize("reply", ["wait", "again"])
def test_fresh_drops_are_logged_and_counted_not_rejected(tmp_path, tiny_npz, reply):
    """Wait at S = K - 1: the last pusher of each round is a version behind; again at S =
    K: the first K - 1 pushers' second gradients are. Either way the run ends (the last
    step is taken with what was gathered when every running client waits for it)."""
    batch = "2" if reply == "wait" else "3"
    run = sim(tmp_path / "run", tiny_npz, "--rule", "fresh", "--fresh-batch", batch, "--fresh-reply", reply,
              "--clients", "3", "--steps", "10", "--speed-jitter", "0.3")
    s, server = summary(run), rows(run, "server")
    dropped = [r for r in server if "dropped" in r]
    # 10 steps may leave the error at chance (`untrained`); refused pushes would make it `diverged`
    assert s["status"].split(":")[0] in ("complete", "untrained") and s["pushes_rejected"] == 0
    assert s["pushes_dropped"] == len(dropped) > 0
    assert s["pushes_sent"] == 30 == s["pushes_applied"] + s["pushes_dropped"]
    assert sum(s["dropped_per_client"].values()) == len(dropped)
    assert all(r["dropped"].startswith(f"staleness {r['staleness']} > max_staleness 0") for r in dropped)
    marked = [r for r in rows(run, "clients") if r.get("dropped")]
    assert len(marked) == len(dropped) and all(r["staleness"] >= 1 for r in marked)
    assert sum(each_logged_once([(r["client"], r["step"]) for r in rows(run, "clients")], 3)) == 30  # the run's


def test_by_their_pace_fast_clients_compute_again_while_a_straggler_keeps_the_step_open(tmp_path, tiny_npz):
    """One client of 4 is 4x slow: with wait every step waits for it (sync); by the pace
    (auto) the fast clients' second gradients complete the steps, the straggler's then
    late ones are dropped, and the run takes its steps sooner."""
    flags = ["--rule", "fresh", "--clients", "4", "--steps", "12", "--slow-clients", "1", "--slow-factor", "4"]
    runs = {reply: sim(tmp_path / reply, tiny_npz, *flags, "--fresh-reply", reply) for reply in ("wait", "auto")}
    s = {reply: summary(run) for reply, run in runs.items()}
    assert s["wait"]["pushes_dropped"] == 0
    assert s["auto"]["pushes_dropped"] > 0

    def reached(run, version):
        return next(r["time"] for r in rows(run, "server") if r.get("version") == version)
    assert reached(runs["auto"], 6) < 0.7 * reached(runs["wait"], 6)  # 0.14 against 0.24 s


def test_noise_scale_rows_summary_and_auto_fresh_batch(tmp_path, tiny_npz):
    run = sim(tmp_path / "run", tiny_npz, "--rule", "fresh", "--fresh-batch", "auto", "--clients", "2",
              "--steps", "24", "--max-staleness", "2", "--fresh-reply", "again", "--tensorboard")
    noise = [r for r in rows(run, "server") if "noise_scale" in r]
    assert len(noise) >= 6 and all("version" not in r for r in noise)
    assert all(1 <= r["fresh_batch"] <= 8 for r in noise)
    measured = [r for r in noise if r["noise_scale"] is not None]
    assert measured and all(r["fresh_batch"] == min(8, max(1, round(r["noise_scale"] / 32))) for r in measured)
    s = summary(run)["noise_scale"]
    assert s["windows"] == len(noise) and s["last"] == measured[-1]["noise_scale"]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(run / "tensorboard"))
    board.Reload()
    assert len(board.Scalars("server/noise_scale")) == len(measured)
    assert [e.value for e in board.Scalars("server/fresh_batch")] == [r["fresh_batch"] for r in noise]
    assert all(r["grad_norm"] > 0 for r in noise)
    assert [e.value for e in board.Scalars("server/grad_norm")] == pytest.approx([r["grad_norm"] for r in noise])


def test_nesterov_runs_and_keeps_its_momentum(tmp_path, tiny_npz):
    run = sim(tmp_path / "run", tiny_npz, "--rule", "nesterov", "--clients", "3", "--steps", "6", "--n-sync", "2",
              "--nesterov-momentum", "0.9", "--outer-lr", "1")
    s = summary(run)
    assert s["status"] == "complete" and s["version"] == s["pushes_applied"] == 9
    assert {"rule.total", "rule.momentum", "rule_scalar.count"} <= set(load_arrays(run / "checkpoint" / "latest.npz"))
    assert "noise_scale" not in s  # weight changes are not gradients


@pytest.mark.parametrize("rule", ["fresh", "nesterov"])
def test_a_run_killed_by_a_fault_resumes_with_the_rules_state(tmp_path, tiny_npz, rule):
    run = tmp_path / "run"
    flags = ["--rule", rule, "--clients", "2", "--steps", "12", "--eval-every", "2", "--server-momentum", "0.9"]
    assert main(["train", "--backend", "sim", "--data", str(tiny_npz), "--out", str(run), *TIMED, *flags,
                 "--inject-fault", "0:7"]) == 1
    saved = load_arrays(run / "checkpoint" / "latest.npz")
    assert {k for k in saved if k.startswith("rule.")} == \
        ({"rule.total", "rule.momentum_buffer"} if rule == "fresh" else {"rule.total", "rule.momentum"})
    assert main(["train", "--resume", str(run), "--quiet"]) == 0
    s = summary(run)
    assert s["status"] == "complete" and s["minibatches"] == 24 and s["pushes_applied"] == 24
    if rule == "nesterov":  # a version a push
        assert_logged_once(run, clients=2, steps=12, versions=24)
        return
    applied = [r["version"] for r in rows(run, "server") if "version" in r]  # a version a step of 2 pushes
    assert len(applied) == 24 and applied == sorted(applied) and s["version"] == 12
    assert sorted((r["client"], r["step"]) for r in rows(run, "clients")) == \
        [(c, n) for c in range(2) for n in range(1, 13)]


@pytest.mark.parametrize("flags,lr", [((), 0.01), (("--server-lr", "0.05"), 0.05)])
def test_adagrad_records_the_lr_it_ran_its_own_unless_one_is_given(tmp_path, tiny_npz, flags, lr):
    """Adagrad's first step moves each weight by its lr (g / sqrt(g*g) = +-1, but where the
    root's 1e-10 counts: the median's), so the weights show which lr ran: the one
    config.json records, the rule's (not the run's lr, the clients' 0.2) or the user's."""
    from clients.data import load_dataset
    from clients.models import build_model, flat_weights

    run = sim(tmp_path / "run", tiny_npz, "--rule", "adagrad", "--clients", "1", "--steps", "1", "--lr", "0.2", *flags)
    assert json.loads((run / "config.json").read_text())["server_lr_used"] == lr
    data = load_dataset(str(tiny_npz))
    moved = np.abs(checkpoint_weights(run) - flat_weights(build_model("cnn", data.shape, data.num_classes, seed=0)))
    assert np.median(moved) == pytest.approx(lr, rel=1e-4) and moved.max() <= lr + 1e-7  # w's float32 rounding
