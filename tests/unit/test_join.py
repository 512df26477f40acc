"""A client joining a running job, as the pure handler decides it (paramserver/membership.py):
one JOIN in, one Welcome out, a Joined event; and each refusal, which changes nothing."""
from __future__ import annotations

import numpy as np
import pytest

from runconfig.settings import RunConfig
from paramserver.events import Applied, Joined, JoinRefused
from paramserver.handler import handle
from paramserver.state import ServerState, StateSettings
from paramserver.wire.protocol import Join, Message, Pull, Push, Stop, Tag, Welcome

SECRET = "s3cret"


def _state(secret: str | None = SECRET, **settings) -> ServerState:
    """Two clients (ranks 1 and 2) of DC-ASGD with DyLU, each budgeted 10 minibatches."""
    cfg = RunConfig(clients=2, rule="dcasgd", dylu=True, budget="client", steps=10, n_sync=2, backend="sim",
                    servers=1, joinable=secret is not None, **settings)  # one server: clients are ranks 1, 2
    state = ServerState.for_run(StateSettings.from_config(cfg, 2), np.arange(4, dtype=np.float32), 2,
                                secret=secret, clock=lambda: 0.0)
    for rank in (1, 2):
        handle(state, Message(rank, Tag.PULL, Pull()))
    return state


def _push(state: ServerState, rank: int, step: int, value: float = 0.5):
    payload = np.full(4, value, np.float32)
    return handle(state, Message(rank, Tag.PUSH, Push(step, 4, True, rows=({"client": 0, "step": step},)), payload))


def _join(state: ServerState, rank: int = 3, secret: str = SECRET):
    return handle(state, Message(rank, Tag.JOIN, Join(secret, "hostB")))


def test_a_joiner_gets_a_new_number_the_current_weights_and_fresh_per_client_state():
    state = _state()
    _push(state, 1, 2)
    replies, events = _join(state)
    [reply] = replies
    assert isinstance(reply.header, Welcome) and reply.dest == 3
    assert (reply.header.client, reply.header.steps, reply.header.slot, reply.header.position) == (2, 10, 2, 0)
    assert reply.header.weights.version == state.store.version == 1
    assert np.array_equal(reply.payload, state.store.weights)
    assert events == [Joined(2, 3, "hostB", 1)]
    assert state.client_ranks == [1, 2, 3] and len(state.tally.client_steps) == 3
    assert state.reply.windows.speeds[2] == 0  # DyLU measures it from its first push
    backup = state.store.rule.backups[2]  # DC-ASGD's backup: the weights it pulled
    assert np.array_equal(backup.numpy(), state.store.weights)
    _, events = _push(state, 3, 2)
    assert [type(e) for e in events if isinstance(e, Applied)] == [Applied] and events[0].client == 2
    assert state.counts()["joined_clients"] == [{"client": 2, "rank": 3, "host": "hostB", "version": 1, "slot": 2}]


def test_a_joiner_takes_over_a_lost_clients_shard_where_it_stood_and_its_number_is_new():
    state = _state()
    _push(state, 2, 4)
    state.tally.lost[2] = {"client": 1, "rank": 2, "last_step": 4, "reason": "test"}
    [reply], _ = _join(state)
    assert (reply.header.client, reply.header.slot, reply.header.position, reply.header.steps) == (2, 1, 4, 6)
    # a second joiner finds the shard held: it gets one of its own
    [reply], _ = _join(state, rank=4)
    assert (reply.header.client, reply.header.slot, reply.header.position) == (3, 3, 0)


def _snapshot(state: ServerState):
    return (list(state.client_ranks), state.tally.client_steps.copy(), state.tally.rejected, state.store.version,
            state.store.weights.copy(), len(state.reply.windows.speeds), list(state.members.seats))


def _unchanged(before, after) -> bool:
    return all(np.array_equal(a, b) for a, b in zip(before, after))


@pytest.mark.parametrize("case, reason", [
    ("secret", "wrong secret"),
    ("full", "the run is full"),
    ("finished", "the run has finished"),
    ("not joinable", "not joinable"),
    ("a client", "a client of the run already"),
    ("malformed", "malformed join"),
])
def test_a_refused_join_is_named_and_changes_nothing(case, reason):
    state = _state(None if case == "not joinable" else SECRET, **({"max_clients": 2} if case == "full" else {}))
    _push(state, 1, 2)
    if case == "finished":
        for rank in (1, 2):
            handle(state, Message(rank, Tag.STOP, Stop(10, 5)))
    before = _snapshot(state)
    if case == "malformed":
        replies, events = handle(state, Message(3, Tag.JOIN, Join(7, "hostB")))  # type: ignore[arg-type]
    else:
        replies, events = _join(state, rank=1 if case == "a client" else 3,
                                secret="guess" if case == "secret" else SECRET)
    assert replies == []
    [event] = events
    assert isinstance(event, JoinRefused) and reason in event.reason
    assert _unchanged(before, _snapshot(state))


def test_under_the_runs_budget_a_joiner_is_refused_once_the_budget_is_spent():
    cfg = RunConfig(clients=1, budget="run", steps=4, n_sync=2, backend="sim", servers=1, joinable=True)
    state = ServerState.for_run(StateSettings.from_config(cfg, 1), np.zeros(4, np.float32), 1,
                                secret=SECRET, clock=lambda: 0.0)
    handle(state, Message(1, Tag.PULL, Pull()))
    [reply], _ = _join(state, rank=2)
    assert reply.header.steps == 4  # the run's: the server tells it when to stop
    _push(state, 1, 2)
    _push(state, 2, 2)  # the budget's 4 are in
    _, [event] = _join(state, rank=3)
    assert isinstance(event, JoinRefused) and "finished" in event.reason


@pytest.mark.parametrize("settings, field", [
    ({"backend": "sim", "joinable": True, "mode": "sync"}, "joinable"),
    ({"backend": "sim", "joins": "2@1"}, "joins"),
    ({"backend": "sim", "joinable": True, "joins": "2@x"}, "joins"),
    ({"backend": "sim", "joinable": True, "joins": "3@1"}, "joins"),
    ({"backend": "sim", "joinable": True, "joins": "3@1,2@2"}, "joins"),
    ({"backend": "sim", "joinable": True, "max_clients": 1}, "max_clients"),
    ({"backend": "sim", "max_clients": 3}, "max_clients"),
])
def test_join_settings_are_checked_before_anything_runs(settings, field):
    from runconfig.settings import ConfigError
    with pytest.raises(ConfigError, match=f"^{field}:"):
        RunConfig(clients=2, **settings)
    RunConfig(clients=2, backend="sim", joinable=True, joins="3@1,2@0.5", max_clients=4)  # in time order: fine
    assert RunConfig(clients=2, joinable=True).servers == 1  # over MPI `auto` is one server
    assert RunConfig(clients=2, joinable=True, servers=2, spares=1, on_client_failure="continue").servers == 2
