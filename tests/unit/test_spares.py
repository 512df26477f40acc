"""Spare ranks (`--spares`), as the pure server decides them (paramserver/membership.py):
which spare a lost client brings in, what it is told, what its join records, who else
is refused; and the flags refused before launch."""
from __future__ import annotations

import numpy as np
import pytest

from experiments.cli import main
from paramserver import membership
from paramserver.events import Joined, JoinRefused, Rejected
from paramserver.handler import handle
from paramserver.state import ServerState, StateSettings
from paramserver.wire.protocol import Admit, Join, Message, Pull, Push, Stop, Tag, Welcome, well_formed
from runconfig.settings import RunConfig

SECRET = "s3cret"


def _state(spares: int = 2, **settings) -> ServerState:
    """Two clients (ranks 1 and 2) under continue, the spares at ranks 3, 4, ..."""
    cfg = RunConfig(clients=2, spares=spares, on_client_failure="continue", budget="client", steps=10, n_sync=2,
                    **settings)
    state = ServerState.for_run(StateSettings.from_config(cfg, 2), np.arange(4, dtype=np.float32), 2,
                                secret=SECRET, clock=lambda: 0.0)
    for rank in (1, 2):
        handle(state, Message(rank, Tag.PULL, Pull()))
    return state


def _lose(state: ServerState, rank: int, pushed: int) -> None:
    payload = np.full(4, 0.5, np.float32)
    handle(state, Message(rank, Tag.PUSH, Push(pushed, 4, True, rows=({"client": 0, "step": pushed},)), payload))
    membership.lose(state, rank, "test")


def test_a_lost_client_admits_the_first_spare_which_joins_on_its_shard_as_a_new_number():
    state = _state()
    assert state.members.spares == [3, 4] and state.counts()["spares_left"] == 2
    _lose(state, 2, 4)
    rank, admit = membership.admit(state, 1)
    assert (rank, admit) == (3, Admit(SECRET)) and well_formed(Tag.ADMIT, admit)
    [reply], events = handle(state, Message(3, Tag.JOIN, Join(admit.secret, "hostB")))
    assert isinstance(reply.header, Welcome)
    assert (reply.header.client, reply.header.slot, reply.header.position, reply.header.steps) == (2, 1, 4, 6)
    assert events == [Joined(2, 3, "hostB", 1, spare_for=1)]
    counts = state.counts()
    assert counts["spares_left"] == 1 and counts["joined_clients"][0]["spare_for"] == 1


def test_a_join_from_a_spare_not_admitted_is_refused_without_the_secret_and_changes_nothing_nor_its_push():
    state = _state()
    _lose(state, 2, 4)
    membership.admit(state, 1)  # rank 3 is admitted; rank 4 never learnt the secret
    before = (list(state.client_ranks), state.store.weights.copy(), list(state.members.seats))
    replies, [event] = handle(state, Message(4, Tag.JOIN, Join("", "hostC")))
    assert replies == [] and isinstance(event, JoinRefused) and event.reason == "wrong secret"
    assert before[0] == state.client_ranks and np.array_equal(before[1], state.store.weights)
    assert before[2] == state.members.seats
    payload = np.full(4, 9.0, np.float32)  # nor does anything else from it, or an ADMIT a client sends back
    for rank, tag, header in ((4, Tag.PUSH, Push(2, 4, True)), (1, Tag.ADMIT, Admit(SECRET))):
        replies, [event] = handle(state, Message(rank, tag, header, payload if tag == Tag.PUSH else None))
        assert replies == [] and isinstance(event, Rejected), event
    assert np.array_equal(before[1], state.store.weights)


def test_no_spare_is_admitted_once_the_run_finished_and_a_dead_one_hands_its_client_on():
    state = _state()
    _lose(state, 2, 4)
    membership.admit(state, 1)
    assert membership.spare_gone(state, 3) == 1  # admitted, died before its JOIN: client 1 needs the next
    assert membership.admit(state, 1)[0] == 4 and membership.admit(state, 1) is None  # none left
    finished = _state(spares=1)
    handle(finished, Message(1, Tag.STOP, Stop(10, 5)))
    _lose(finished, 2, 4)
    assert membership.admit(finished, 1) is None and finished.counts()["spares_left"] == 1


@pytest.mark.parametrize("flags, message", [
    (["--spares", "1"], "spares: needs --on-client-failure continue"),
    (["--spares", "1", "--mode", "sync"], "spares: needs --mode async"),
    (["--spares", "-1"], "spares: must be non-negative"),
    (["--spares", "1", "--on-client-failure", "continue", "--backend", "sim", "--joinable", "--joins", "2@1"],
     "spares: give --joins or --spares, not both"),
])
def test_spare_flags_are_refused_before_launch_in_one_line(flags, message, capsys):
    assert main(["train", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
