"""Learning-rate schedules and the straggler model against hand-written references."""
from __future__ import annotations

import math
from re import escape

import numpy as np
import pytest

from clients.collective import keep_fastest
from clients.stragglers import Stragglers
from runconfig.load import load_config
from runconfig.settings import ConfigError, RunConfig
from paramserver.events import Dropped
from paramserver.handler import handle
from paramserver.state import ServerState
from paramserver.reply.policy import ReplyPolicy
from paramserver.rules import make_rule
from paramserver.schedule import Schedule
from paramserver.store import Store
from paramserver.wire.protocol import Message, Pull, Push, Tag


def test_warmup_ramps_linearly_then_holds():
    s = Schedule(lr=0.1, batch_size=10, planned=1000, warmup=100)
    assert [round(s.at(x), 12) for x in (0, 40, 90, 100, 500)] == [0.01, 0.05, 0.1, 0.1, 0.1]


def test_cosine_decays_to_its_floor_after_the_warmup():
    s = Schedule(lr=1.0, batch_size=10, planned=1100, warmup=100, kind="cosine", floor=0.1)
    assert s.at(100) == pytest.approx(1.0)
    assert s.at(600) == pytest.approx(0.1 + 0.9 * 0.5)        # halfway: cos(pi / 2) = 0
    assert s.at(350) == pytest.approx(0.1 + 0.9 * (1 + math.cos(math.pi / 4)) / 2)
    assert s.at(1100) == pytest.approx(0.1) == s.at(5000)      # past the plan: the floor


def test_step_multiplies_at_each_milestone():
    s = Schedule(lr=1.0, batch_size=1, planned=0, kind="step", milestones=(100, 300), step_factor=0.5)
    assert [s.at(x) for x in (0, 99, 100, 299, 300, 10**6)] == [1.0, 1.0, 0.5, 0.5, 0.25, 0.25]


def test_linear_scaling_multiplies_by_the_minibatches_an_update_averages():
    sync = Schedule.for_run(RunConfig(mode="sync", lr=0.01, lr_scaling="linear", backup_workers=2, clients=8,
                                      lr_scale_warmup=0), 8)
    assert sync.at(0) == pytest.approx(0.06)                       # K - b = 6 gradients a step
    assert Schedule.for_run(RunConfig(lr=0.01, lr_scaling="linear"), 8).at(0) == pytest.approx(0.01)  # async


def test_sqrt_scaling_multiplies_by_the_root_of_the_minibatches_averaged():
    sync = Schedule.for_run(RunConfig(mode="sync", lr=0.01, lr_scaling="sqrt", backup_workers=4, clients=20,
                                      lr_scale_warmup=0), 20)
    assert sync.at(0) == pytest.approx(0.04)  # 0.01 x sqrt(20 - 4)
    assert Schedule.for_run(RunConfig(lr=0.01, lr_scaling="sqrt"), 8).at(0) == pytest.approx(0.01)  # async: 1
    assert Schedule.for_run(RunConfig(steps=10, batch_size=4, lr_schedule="cosine"), 3).planned == 120


@pytest.mark.parametrize("key,value,says", [
    ("lr_warmup", -1, "lr_warmup: must be non-negative"),
    ("lr_scale_warmup", -1, "lr_scale_warmup: must be non-negative"),
    ("lr_schedule", "linear", "lr_schedule: unknown schedule"),
    ("lr_floor", 1.5, "lr_floor: must be in [0, 1]"),
    ("lr_milestones", "300,100", "lr_milestones: expected increasing"),
    ("lr_milestones", "a", "lr_milestones: expected increasing"),
    ("lr_step_factor", 0.0, "lr_step_factor: must be in (0, 1]"),
    ("lr_scaling", "cubic", "lr_scaling: unknown scaling"),
    ("step_sigma", -0.1, "step_sigma: must be non-negative"),
    ("slow_factor", 0.5, "slow_factor: must be in [1, 100]"),
    ("pause_prob", 1.0, "pause_prob: must be in [0, 1)"),
    ("pause_time", -1.0, "pause_time: must be in [0, 3600]"),
    ("backup_workers", 1, "backup_workers: needs --mode sync"),
])
def test_bad_schedule_and_straggler_values_say_which_key(key, value, says):
    with pytest.raises(ConfigError, match=r"^" + escape(says)):
        load_config(overrides={key: value})


def test_settings_that_need_each_other_are_refused():
    for overrides, says in [({"lr_milestones": "10"}, "lr_milestones: needs lr_schedule = step"),
                            ({"lr_schedule": "step"}, "lr_schedule: step needs lr_milestones"),
                            ({"clients": 2, "slow_clients": 3}, "slow_clients: must be at most clients"),
                            ({"clients": 2, "mode": "sync", "backup_workers": 2}, "backup_workers: must be below")]:
        with pytest.raises(ConfigError, match="^" + escape(says)):
            load_config(overrides=overrides)


def test_straggler_draws_are_a_function_of_seed_client_and_step():
    a, b = Stragglers(7, 4, sigma=0.5, pause_prob=0.3, pause_time=2.0), Stragglers(7, 4, sigma=0.5, pause_prob=0.3,
                                                                                  pause_time=2.0)
    forward = [a.duration(c, t, 1.0) for c in range(4) for t in range(1, 50)]
    backward = [b.duration(c, t, 1.0) for c in reversed(range(4)) for t in reversed(range(1, 50))]
    assert forward == list(reversed(backward))                        # order does not matter
    assert forward != [Stragglers(8, 4, 0.5, pause_prob=0.3, pause_time=2.0).duration(c, t, 1.0)
                       for c in range(4) for t in range(1, 50)]       # the seed does
    logs = [math.log(Stragglers(0, 1, sigma=0.5).factor(0, t)) for t in range(1, 4001)]
    assert abs(sum(logs) / len(logs)) < 0.05 and 0.45 < (sum(x * x for x in logs) / len(logs)) ** 0.5 < 0.55
    pauses = [Stragglers(0, 1, pause_prob=0.1, pause_time=3.0).pause(0, t) for t in range(1, 4001)]
    assert set(pauses) == {0.0, 3.0} and 300 < pauses.count(3.0) < 500


def test_slow_clients_are_the_last_ones_and_a_real_client_sleeps_only_the_excess():
    s = Stragglers(0, 4, slow_clients=1, slow_factor=2.5)
    assert [s.factor(c, 1) for c in range(4)] == [1.0, 1.0, 1.0, 2.5]
    assert s.extra(3, 1, 0.2) == pytest.approx(0.3) and s.extra(0, 1, 0.2) == 0.0
    assert not Stragglers(0, 4).active and s.active


def test_backup_workers_drop_the_slowest():
    assert keep_fastest([3.0, 1.0, 2.0, 5.0], 2) == [False, True, True, False]
    assert keep_fastest([1.0, 1.0, 1.0], 1) == [True, True, False]   # ties: the higher index drops
    assert keep_fastest([1.0, 2.0], 0) == [True, True]


def test_the_scale_warmup_ramps_the_scaling_in_from_one_minibatchs_lr_over_updates():
    """Goyal et al.'s gradual warmup over 10 updates of 16 x 10 samples: lr x (1 + (sqrt(16)
    - 1) x ramp); an update of 4 minibatches ramps over 10 of its own; one client untouched."""
    sync = Schedule.for_run(RunConfig(mode="sync", lr=0.01, lr_scaling="sqrt", lr_scale_warmup=10,
                                      batch_size=10, clients=16), 16)
    assert [sync.at(s) for s in (0, 640, 1440, 10**4)] == pytest.approx([0.013, 0.025, 0.04, 0.04])
    assert [sync.ramp(t) for t in (0, 4, 9)] == pytest.approx([0.1, 0.5, 1.0])
    # 4 of 16 backup workers: an update averages 12 minibatches, and progress counts 16
    backup = Schedule.for_run(RunConfig(mode="sync", lr=0.01, lr_scaling="sqrt", lr_scale_warmup=10,
                                        batch_size=10, clients=16, backup_workers=4), 16)
    assert backup.at(4 * 160) == pytest.approx(0.01 * (1 + (math.sqrt(12) - 1) * 0.5))
    one = Schedule.for_run(RunConfig(mode="sync", lr=0.01, lr_scaling="sqrt", clients=1), 1)
    assert one.at(0) == one.at(10**6) == 0.01


def test_freshs_ramp_counts_its_steps_not_the_pushes_it_dropped():
    """Three clients, S = 2, the linear rule ramped in over 4 steps: clients 1 and 2 take
    each step, client 3's push comes a step late every time and is dropped. Step k's lr
    is lr x (1 + (2 - 1) x k / 4), as without client 3 (counted in samples pushed, which
    the dropped pushes swell by half, step 2 would be at 1.625)."""
    n, batch, lr = 50, 4, 1e-3
    cfg = RunConfig(lr=lr, momentum=0.0, weight_decay=0.0, batch_size=batch, lr_scaling="linear",
                    lr_scale_warmup=4, fresh_batch=2, fresh_reply="wait")
    rule = make_rule("fresh", cfg, 3)
    state = ServerState(Store(np.zeros(n, np.float32), rule), [1, 2, 3], schedule=Schedule.for_run(cfg, 3),
                        reply=ReplyPolicy.for_run(cfg, rule, 3))
    for rank in (1, 2, 3):
        handle(state, Message(rank, Tag.PULL, Pull()))
    rng, lrs, dropped = np.random.default_rng(0), [], 0
    for step in range(1, 7):
        grads = [rng.standard_normal(n).astype(np.float32) for _ in range(3)]
        before = state.store.weights.copy()
        for rank, g in zip((1, 2, 3), grads):
            _, events = handle(state, Message(rank, Tag.PUSH, Push(step, n, True), g))
            dropped += any(isinstance(e, Dropped) for e in events)
        mean = np.mean(grads[:2], axis=0, dtype=np.float64)
        lrs.append(float(np.dot(before - state.store.weights, mean) / np.dot(mean, mean)))
    assert state.store.version == 6 and dropped == 6 and state.progress == 18 * batch
    assert lrs == pytest.approx([lr * s for s in (1.25, 1.5, 1.75, 2, 2, 2)], rel=1e-4)
