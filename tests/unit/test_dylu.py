"""Dynamic local updates (paramserver/reply/dylu.py): the windows from given speeds, the speeds
the server measures from pushes on its clock, the windows its replies carry, and where
the setting is refused."""
from __future__ import annotations

import math

import numpy as np
import pytest

from runconfig.settings import ConfigError, RunConfig
from paramserver.reply.dylu import TOLERANCE, Windows, dylu_window
from paramserver.handler import handle
from paramserver.state import ServerState, StateSettings
from paramserver.wire.protocol import Message, Pull, Push, Stop, Tag

H = 8


def test_equal_speeds_keep_the_whole_window():
    assert [dylu_window(H, [2.5, 2.5, 2.5], c) for c in range(3)] == [H, H, H]


@pytest.mark.parametrize("window", [8, 10, 20])
def test_a_client_at_three_tenths_of_the_fastest_gets_three_tenths_of_the_window_floored(window):
    assert dylu_window(window, [10.0, 3.0], 1) == math.floor(0.3 * window)
    assert dylu_window(window, [10.0, 3.0], 0) == window


def test_never_below_one_never_above_the_window_and_whole_until_measured():
    assert dylu_window(H, [1000.0, 1.0], 1) == 1
    assert dylu_window(H, [1.0, 0.999], 0) == H and dylu_window(H, [1.0, 0.999], 1) == H - 1
    assert dylu_window(H, [5.0, 0.0], 1) == H   # not measured yet
    assert dylu_window(H, [0.0, 0.0], 0) == H
    assert dylu_window(100, [1.0, 0.29], 1) == 29  # 100 * 0.29 is 28.999999999999996 in floats


def test_the_server_measures_minibatches_per_second_from_its_reply_to_the_push():
    windows = Windows(H, 3)
    for client in range(3):
        assert windows.reply(client, 0.0, range(3)) == H  # none measured
    windows.pushed(0, H, 1.0)     # 8 a second
    windows.pushed(1, H, 3.0)     # 8/3 a second
    assert windows.reply(0, 1.0, range(3)) == H
    assert windows.reply(1, 3.0, range(3)) == math.floor(H / 3)
    assert windows.reply(2, 3.0, range(3)) == H  # client 2 has not pushed: not measured
    windows.pushed(1, 2, 3.5)     # 4 a second now: the average moves half way, to 10/3
    assert windows.speeds[1] == pytest.approx((8 / 3 + 4) / 2)
    assert windows.reply(1, 3.5, range(3)) == math.floor(H * (10 / 3) / 8)
    assert windows.reply(1, 3.5, [1, 2]) == H  # the fast client stopped: the slow one is the fastest left


def test_a_speed_within_the_tolerance_of_the_fastest_counts_as_the_fastest():
    windows = Windows(H, 2)
    windows.replied[:] = 0.0
    windows.pushed(0, H, 1.0)
    windows.pushed(1, H, 1.0 / (1 - TOLERANCE / 2))  # served a little later: measured a little slower
    assert windows.reply(1, 2.0, range(2)) == H
    windows.pushed(1, H, 2.0 + 1.0 / (1 - 2 * TOLERANCE))
    assert windows.reply(1, 4.0, range(2)) < H


def test_a_push_without_a_reply_before_it_on_this_clock_measures_nothing():
    windows = Windows(H, 1)
    windows.pushed(0, H, 5.0)   # no reply yet (after a resume, the first push waits for one)
    assert windows.speeds[0] == 0
    windows.reply(0, 5.0, [0])
    windows.pushed(0, H, 5.0)   # no time passed
    assert windows.speeds[0] == 0


def test_the_speeds_go_through_a_checkpoint():
    windows = Windows(H, 2)
    windows.replied[:] = 0.0
    windows.pushed(0, 4, 2.0)
    again = Windows(H, 2)
    again.load_state(windows.state())
    assert again.speeds.tolist() == [2.0, 0.0] and math.isnan(again.replied[0])


def _server(clock: list[float], **settings) -> ServerState:
    cfg = RunConfig(rule="add", dylu=True, n_sync=H, batch_size=4, **settings)
    return ServerState.for_run(StateSettings.from_config(cfg, 2), np.zeros(3, np.float32), clients=2,
                               clock=lambda: clock[0])


def _push(state: ServerState, rank: int, step: int, fetch: bool = True):
    replies, _ = handle(state, Message(rank, Tag.PUSH, Push(step, 3, fetch), np.zeros(3, np.float32)))
    return replies


def test_each_reply_to_a_push_carries_the_clients_next_window():
    clock = [0.0]
    state = _server(clock)
    assert [handle(state, Message(r, Tag.PULL, Pull()))[0][0].header.window for r in (1, 2)] == [H, H]
    clock[0] = 1.0
    assert _push(state, 1, H)[0].header.window == H          # 8 minibatches a second
    clock[0] = 4.0
    assert _push(state, 2, H)[0].header.window == H // 4     # 2 a second: a quarter of the fastest
    clock[0] = 5.0
    assert _push(state, 1, 2 * H)[0].header.window == H      # 2 a second now: (8 + 2) / 2, still the fastest
    handle(state, Message(1, Tag.STOP, Stop(2 * H, 2)))
    clock[0] = 6.0
    assert _push(state, 2, H + 2)[0].header.window == H       # alone now: the fastest running
    assert state.arrays()["dylu.speeds"].tolist() == [5.0, 1.5]


def test_without_dylu_replies_carry_no_window():
    state = ServerState.for_run(StateSettings.from_config(RunConfig(rule="add", n_sync=H), 1), np.zeros(3, np.float32),
                                clients=1)
    assert handle(state, Message(1, Tag.PULL, Pull()))[0][0].header.window == 0
    assert "dylu.speeds" not in state.arrays()


@pytest.mark.parametrize("settings, words", [
    ({"mode": "sync"}, "needs --mode async"),
    ({"rule": "fresh"}, "under fresh they push summed gradients"),
    ({"rule": "easgd"}, "under easgd they push their weights"),
    ({"rule": "nesterov", "n_push": 4}, "needs n_push == n_fetch"),
    ({"rule": "add", "backend": "sim", "replay": "elsewhere"}, "a replay repeats"),
])
def test_dylu_is_refused_where_it_cannot_apply(settings, words):
    with pytest.raises(ConfigError, match=words) as refused:
        RunConfig(dylu=True, **settings)
    assert str(refused.value).startswith("dylu: ") and "\n" not in str(refused.value)


def test_dylu_runs_with_the_delta_rules():
    for rule in ("add", "nesterov", "dcasgd", "scaled", "staleness"):
        assert RunConfig(dylu=True, rule=rule, n_sync=H).dylu
