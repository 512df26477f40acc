"""Uneven hardware and failures (clients/stragglers.py) as pure functions of the seed,
the config's refusals, the rejoin message, and goodput counted from rows by hand."""
from __future__ import annotations

import math

import numpy as np
import pytest

from clients.collective import LockstepFates, failed_tries
from clients.stragglers import Failures, Stragglers, client_speeds
from runconfig.settings import ConfigError, RunConfig
from paramserver.wire.protocol import Rejoin, Tag, well_formed
from rundir.goodput import goodput


def test_speeds_are_log_uniform_from_the_seed_and_client_alone():
    speeds = client_speeds(3, 2000, 0.1)
    assert speeds == client_speeds(3, 2000, 0.1) and speeds != client_speeds(4, 2000, 0.1)
    assert client_speeds(3, 5, 0.1) == speeds[:5]  # client i's speed does not depend on K
    logs = np.log(speeds)
    assert logs.min() >= math.log(0.1) and logs.max() <= 0
    assert abs(logs.mean() - math.log(0.1) / 2) < 0.06 and abs(np.median(logs) - math.log(0.1) / 2) < 0.1
    assert client_speeds(3, 3, listed="1,0.5,0.25") == [1.0, 0.5, 0.25]
    assert client_speeds(3, 2) == [1.0, 1.0]
    with pytest.raises(ValueError, match="lists 3 speeds for 2 clients"):
        client_speeds(0, 2, listed="1,0.5,0.25")


def test_a_client_of_speed_s_takes_its_base_time_over_s():
    s = Stragglers(0, 3, speeds=[1.0, 0.5, 0.25])
    assert [s.duration(i, 1, 0.01) for i in range(3)] == pytest.approx([0.01, 0.02, 0.04], rel=1e-12)
    assert s.active and not Stragglers(0, 3, speeds=[1.0] * 3).active
    slow = Stragglers(0, 2, slow_clients=1, slow_factor=2.0, speeds=[1.0, 0.5])
    assert slow.factor(1, 7) == pytest.approx(4.0)


def test_failures_reproduce_from_the_seed_at_the_exponential_rate():
    cfg = RunConfig(mtbf=20, clients=2, client_speeds="1,0.25")
    stragglers = Stragglers.for_run(cfg, 2)
    failures = Failures.for_run(cfg, stragglers)
    again = Failures.for_run(cfg, Stragglers.for_run(cfg, 2))
    assert [failures.schedule(c, 200) for c in range(2)] == [again.schedule(c, 200) for c in range(2)]
    assert failures.schedule(0, 200) != Failures(Stragglers(1, 2), 20, 20).schedule(0, 200)
    # a minibatch of speed 1 fails with chance 1 - exp(-1/20); one of speed 1/4 exposes it 4 base times
    rate = [len(failures.schedule(c, 8000)) / 8000 for c in range(2)]
    assert rate[0] == pytest.approx(-math.expm1(-1 / 20), rel=0.15)
    assert rate[1] == pytest.approx(-math.expm1(-4 / 20), rel=0.1)
    assert failures.length == 20 and Failures.for_run(RunConfig(), stragglers) is None


def test_a_sync_step_counts_the_tries_that_fail_before_one_survives():
    failures = Failures(Stragglers(6, 3), 10, 5)
    tries = {(c, t): failed_tries(failures, c, t) for c in range(3) for t in range(1, 13)}
    assert {k: v for k, v in tries.items() if v} == {(0, 1): 1, (0, 8): 1, (1, 6): 1, (1, 10): 1, (1, 11): 1,
                                                    (2, 5): 1}
    assert failed_tries(None, 0, 1) == 0
    with pytest.raises(ValueError, match="mtbf: client 0's minibatch failed 1000 times"):
        failed_tries(Failures(Stragglers(0, 1, speeds=[1e-4]), 1, 1), 0, 1)



def test_one_rank_a_client_decides_the_lockstep_fates_as_one_process_of_all_clients_does():
    """The MPI ranks (one client each, the durations shared) and the simulator (all K)
    ask the same `LockstepFates`: the same steps kept, dropped, failed and down. Speeds
    of at least 1 and no noise, where real time and virtual time agree."""
    k, backups, base = 4, 1, 1.0
    stragglers = Stragglers(5, k, slow_clients=1, slow_factor=3.0, pause_prob=0.3, pause_time=0.5)
    failures = Failures(stragglers, mtbf=4.0, length=2.0)
    together = LockstepFates(stragglers, failures, backups, list(range(k)), [base] * k)
    apart = [LockstepFates(stragglers, failures, backups, [i], [base], real_time=True) for i in range(k)]
    start, seen = 0.0, set()
    for step in range(1, 40):
        away = together.away(start)
        assert [rank.away(start)[0] for rank in apart] == away
        durations = together.durations(step, start)
        assert [rank.durations(step, start)[0] for rank in apart] == durations
        kept = together.kept(durations)
        fates = together.settle(step, start, kept, away)
        assert [rank.settle(step, start, [kept[i]], [away[i]])[0] for i, rank in enumerate(apart)] == fates
        start += max(d for d, keep in zip(durations, kept) if keep)
        seen |= {"dropped" for f in fates if not f.kept} | {"failed" for f in fates if f.lost} | \
            {"away" for f in fates if f.away}
    assert seen == {"dropped", "failed", "away"}  # every fate was decided alike


@pytest.mark.parametrize("values, error", [
    ({"speed_spread": 1.5}, "speed_spread: must be in [0, 1]"),
    ({"speed_spread": 0.1, "client_speeds": "1,0.5"}, "client_speeds: give speed_spread or client_speeds"),
    ({"client_speeds": "1,0"}, "client_speeds: expected speeds in (0, 1]"),
    ({"client_speeds": "1,x"}, "client_speeds: expected speeds in (0, 1]"),
    ({"client_speeds": "1,0.5", "clients": 3}, "client_speeds: lists 2 speeds for 3 clients"),
    ({"mtbf": 10, "mode": "local-sgd", "backup_workers": 1, "clients": 2}, "backup_workers: needs --mode sync"),
    ({"mtbf": 0.5}, "mtbf: must be at least 1"),
    ({"failure_length": -1}, "failure_length: must be non-negative"),
    ({"budget": "each"}, "budget: must be client or run"),
])
def test_bad_hardware_settings_are_refused_in_one_line(values, error):
    with pytest.raises(ConfigError) as caught:
        RunConfig(**values)
    assert str(caught.value).startswith(error) and "\n" not in str(caught.value)


def test_a_rejoin_is_a_pull_with_loggable_rows():
    assert well_formed(Tag.PULL, Rejoin(4, ({"client": 0, "step": 4, "lost": True},)))
    assert not well_formed(Tag.PULL, Rejoin(4, ({"x": object()},)))
    assert not well_formed(Tag.PULL, Rejoin("4"))


def row(client: int, step: int, **marks) -> dict:
    return {"client": client, "step": step, **marks}


def test_goodput_of_async_windows_counted_by_hand():
    """Client 0: a window of 2 applied, then 2 lost to a failure, then one dropped push of 1.
    Client 1: a window of 3 rejected, then 1 applied. 9 computed, 3 entered."""
    rows = [row(0, 1), row(1, 1), row(0, 2, version_pulled=0), row(1, 2), row(0, 3), row(1, 3, version_pulled=0,
            rejected="NaN"), row(0, 4, lost=True), row(0, 5, lost=True, failed=True), row(1, 4, version_pulled=1),
            row(0, 6, version_pulled=2, dropped=True)]
    assert goodput(rows, windows=True) == {"minibatches_in_steps": 3, "minibatches_lost": 2, "failures": 1,
                                           "goodput": 3 / 10}


def test_goodput_of_lockstep_steps_counted_by_hand():
    rows = [row(0, 1), row(1, 1, dropped=True), row(0, 2, lost=True, failed=True), row(0, 2), row(1, 2)]
    assert goodput(rows, windows=False) == {"minibatches_in_steps": 3, "minibatches_lost": 1, "failures": 1,
                                            "goodput": 3 / 5}
    assert goodput([], windows=False)["goodput"] is None


def test_a_rejoin_counts_the_lost_minibatches_so_the_next_push_holds_only_its_own():
    """Client 0 pushed steps 1-2, lost 3-4 to a failure (its Rejoin says step 4), then
    pushes at step 6: that push is of 2 minibatches, and the progress counts all 6."""
    from paramserver.events import ClientRows
    from paramserver.handler import handle
    from paramserver.state import ServerState
    from paramserver.rules import make_rule
    from paramserver.store import Store
    from paramserver.wire.protocol import Message, Pull, Push

    state = ServerState(Store(np.zeros(4, np.float32), make_rule("add", RunConfig())), [1])
    handle(state, Message(1, Tag.PULL, Pull()))
    ones = np.ones(4, np.float32)
    handle(state, Message(1, Tag.PUSH, Push(2, 4, True, rows=(row(0, 1), row(0, 2))), ones))
    lost = (row(0, 3, lost=True), row(0, 4, lost=True, failed=True))
    [reply], events = handle(state, Message(1, Tag.PULL, Rejoin(4, lost)))
    assert reply.dest == 1 and events == [ClientRows([dict(r) for r in lost], 4)]
    assert (state.tally.steps, state.tally.minibatches) == (4, 4)
    minibatches = []
    state.store.apply = lambda client, push, n=1, *at, **piece: minibatches.append(n) or Store.apply(
        state.store, client, push, n, *at, **piece)
    handle(state, Message(1, Tag.PUSH, Push(6, 4, True, rows=(row(0, 5), row(0, 6))), ones))
    assert minibatches == [2] and state.tally.steps == 6 and state.store.version == 2


def test_only_server_0_gets_a_rejoining_clients_rows():
    from paramserver.wire.fanout import _sliced

    rejoin = Rejoin(4, (row(0, 4, lost=True),))
    assert _sliced(rejoin, 0, 0, 2) is rejoin and _sliced(rejoin, 1, 2, 4) == Rejoin(4)
