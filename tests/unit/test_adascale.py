"""`lr_scaling = "adascale"` (paramserver/rules/scaling.py `gain`, paramserver/rules/fresh.py):
the gain by hand and from synthetic gradients of known variance, the schedule's progress in
gain-weighted steps through a warmup, and a stop and resume that changes nothing."""
from __future__ import annotations

from re import escape

import numpy as np
import pytest

from runconfig.load import load_config
from runconfig.settings import ConfigError, RunConfig
from paramserver.events import NoiseMeasured
from paramserver.handler import handle
from paramserver.state import ServerState
from paramserver.reply.policy import ReplyPolicy
from paramserver.rules import make_rule
from paramserver.rules.scaling import gain
from paramserver.schedule import Schedule
from paramserver.store import Store
from paramserver.wire.protocol import Message, Pull, Push, Tag
from rundir.durable import load_arrays, save_arrays

N, BATCH, LR = 2000, 8, 1e-3


def test_the_gain_by_hand():
    assert gain(1, 25.0, BATCH) == 1.0 == gain(1, None, BATCH) == gain(1, 1e9, BATCH)  # one minibatch: 1
    assert gain(4, 0.0, BATCH) == 1.0 == gain(4, -3.0, BATCH)                          # no noise: 1
    assert gain(4, None, BATCH) == 4.0                                                 # only noise: S
    assert gain(4, 25.0, BATCH) == pytest.approx((1 + 25 / 8) / (1 + 25 / 32))         # 132 / 57
    assert gain(8, 64.0, 64) == pytest.approx(16 / 9)                                  # B = b: 2S / (S + 1)
    gains = [gain(8, b, BATCH) for b in (0.0, 1.0, 10.0, 100.0, 1e3, 1e5)]
    assert gains == sorted(gains) and 7.99 < gains[-1] < 8.0                           # to S as noise grows


def pushes(rng, count: int, spread: float):
    """Minibatch gradients of BATCH samples: G = 0.1 on every weight (|G|^2 = 20) plus
    per-sample noise of standard deviation `spread` a weight, so B = N spread^2 / 20."""
    for _ in range(count):
        yield (0.1 + rng.standard_normal(N) * spread / np.sqrt(BATCH)).astype(np.float32)


def settings(**more) -> RunConfig:
    return RunConfig(**{"lr": LR, "momentum": 0.0, "weight_decay": 0.0, "batch_size": BATCH,
                        "lr_scaling": "adascale", **more})


@pytest.mark.parametrize("kernel", ["auto", "torch"])
@pytest.mark.parametrize("spread,noise_scale", [(0.05, 0.25), (0.5, 25.0), (5.0, 2500.0)])
def test_each_steps_lr_is_the_gain_of_the_noise_measured_before_it(kernel, spread, noise_scale):
    """Four clients, S = 4, one push each a step (a window of the noise scale is a step):
    the first step at one minibatch's lr, every later one at lr x gain(4, B measured so
    far), and the last ones near the gain of the known B: 1.02, 2.32, 3.96."""
    store = Store(np.zeros(N, np.float32), make_rule("fresh", settings(), 4), kernel=kernel)
    rule, lrs, expected = store.rule, [], []
    stream = pushes(np.random.default_rng(0), 4 * 60, spread)
    for _ in range(60):
        before, measured = store.weights.copy(), rule.noise.windows
        expected.append(LR * (gain(4, rule.noise.estimate, BATCH) if measured else 1.0))
        step = [next(stream) for _ in range(4)]
        for client, g in enumerate(step):
            store.pull(client)
            assert store.apply(client, g).accepted
        mean = np.mean(step, axis=0, dtype=np.float64)
        lrs.append(float(np.dot(before - store.weights, mean) / np.dot(mean, mean)))
    np.testing.assert_allclose(lrs, expected, rtol=2e-4)
    assert lrs[0] == pytest.approx(LR, rel=2e-4) and store.version == 60
    assert np.mean(lrs[-10:]) / LR == pytest.approx(gain(4, noise_scale, BATCH), rel=0.05)
    assert rule.own_progress == pytest.approx(sum(lrs) / LR, rel=2e-4)


def test_one_client_at_one_minibatch_has_the_gain_1_and_counts_its_steps():
    store = Store(np.zeros(N, np.float32), make_rule("fresh", settings(momentum=0.9), 1))
    plain = Store(np.zeros(N, np.float32), make_rule("fresh", settings(momentum=0.9, lr_scaling="none"), 1))
    for g in pushes(np.random.default_rng(1), 12, 5.0):
        for s in (store, plain):
            s.pull(0)
            s.apply(0, g)
    np.testing.assert_array_equal(store.weights, plain.weights)
    assert store.rule.own_progress == 12.0 and plain.rule.own_progress is None


def served(clients: int, **more) -> ServerState:
    cfg = settings(fresh_reply="wait", **more)
    rule = make_rule("fresh", cfg, clients)
    return ServerState(Store(np.zeros(N, np.float32), rule), list(range(1, clients + 1)),
                       schedule=Schedule.for_run(cfg, clients, lr=cfg.effective_server_lr),
                       reply=ReplyPolicy.for_run(cfg, rule, clients))


def test_progress_counts_gain_weighted_steps_and_the_warmup_stretches_with_it():
    """Two clients of little noise (gain near 1) under a warmup of 40 minibatches: the
    replies carry b x the gains summed, each step's lr is the warmup's at that progress
    times the step's gain, and the warmup, which 20 steps of 2 minibatches end when
    progress counts samples, is not over after 30."""
    warmup = 40 * BATCH
    state = served(2, lr_warmup=warmup)
    for rank in (1, 2):
        handle(state, Message(rank, Tag.PULL, Pull()))
    stream, gained, rule = pushes(np.random.default_rng(2), 60, 0.05), 0.0, state.store.rule
    for step in range(1, 31):
        before = state.store.weights.copy()
        r = gain(2, rule.noise.estimate, BATCH) if rule.noise.windows else 1.0
        warm = min(1.0, (round(BATCH * gained) + BATCH) / warmup)
        step_grads = [next(stream) for _ in range(2)]
        assert handle(state, Message(1, Tag.PUSH, Push(step, N, True), step_grads[0]))[0] == []  # waits
        replies, events = handle(state, Message(2, Tag.PUSH, Push(step, N, True), step_grads[1]))
        gained += r
        [noise] = [e for e in events if isinstance(e, NoiseMeasured)]  # a window a step
        assert noise.gain == gain(2, rule.noise.estimate, BATCH) == rule.gain and noise.samples == state.progress
        assert [reply.header.samples for reply in replies] == [round(BATCH * gained)] * 2
        mean = np.mean(step_grads, axis=0, dtype=np.float64)
        lr = float(np.dot(before - state.store.weights, mean) / np.dot(mean, mean))
        assert lr == pytest.approx(LR * warm * r, rel=2e-4)
    assert 30 < gained < 31 and state.progress < warmup - BATCH  # 30 steps' gains: the warmup still on
    assert state.schedule.factor(state.progress) < 1.0 < state.schedule.factor(30 * 2 * BATCH) * 1.0001


@pytest.mark.parametrize("kernel", ["auto", "torch"])
def test_a_stop_and_resume_changes_nothing(tmp_path, kernel):
    """Stopped in the middle of a gather, after windows were measured and with momentum:
    the resumed store takes the same steps (gains, progress, weights) as the one that ran
    on."""
    cfg = settings(momentum=0.9, lr_warmup=20 * BATCH)
    grads = list(pushes(np.random.default_rng(3), 3 * 20, 0.5))

    def run(store: Store, part: list[np.ndarray], first: int) -> None:
        for i, g in enumerate(part, start=first):
            store.pull(i % 3)
            store.apply(i % 3, g)

    straight, stopped = (Store(np.zeros(N, np.float32), make_rule("fresh", cfg, 3), kernel=kernel) for _ in range(2))
    run(straight, grads, 0)
    run(stopped, grads[:31], 0)
    assert stopped.rule.covered == 1 and stopped.rule.noise.windows == 10
    save_arrays(tmp_path / "ckpt.npz", stopped.state())
    resumed = Store(np.ones(N, np.float32), make_rule("fresh", cfg, 3), kernel=kernel)
    resumed.load_state(load_arrays(tmp_path / "ckpt.npz"))
    assert resumed.rule.own_progress == stopped.rule.own_progress > 10
    run(resumed, grads[31:], 31)
    np.testing.assert_array_equal(resumed.weights, straight.weights)
    assert resumed.rule.own_progress == straight.rule.own_progress and resumed.version == straight.version == 20


@pytest.mark.parametrize("overrides,says", [
    ({"lr_scaling": "adascale", "mode": "sync"}, "lr_scaling: adascale needs --mode async"),
    ({"lr_scaling": "adascale", "servers": 2}, "lr_scaling: adascale needs servers = 1"),
])
def test_adascale_needs_the_one_server_that_measures_the_noise(overrides, says):
    with pytest.raises(ConfigError, match="^" + escape(says)):
        load_config(overrides=overrides)
