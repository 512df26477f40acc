"""A joiner from outside the job joins sharded servers: server 0 lets it in and tells the
others (`Seated`, in its order); each other server lets it in at its door only with the
ticket server 0's word named (paramserver/drivers/tickets.py), whichever came first, and
from then on knows it by server 0's rank for it. Real sockets on this host, no MPI."""
from __future__ import annotations

import socket
import time

import numpy as np
import pytest

from paramserver import membership
from paramserver.drivers.follow import Follow
from paramserver.handler import handle
from paramserver.drivers.tickets import FIRST_RANK, Tickets
from paramserver.wire.door import Door, DoorLink
from paramserver.wire.protocol import (Decided, Fail, Join, Message, ProtocolError, Pull, Push, Seated, Tag, Weights,
                                       Welcome)
from paramserver.wire.stream import SocketLink
from tests.unit.test_door import _poll
from tests.unit.test_join import _state


class _Inner:
    """The MPI side of a follower's link: nothing comes from it here."""


@pytest.fixture
def follower():
    door = Door(first_rank=FIRST_RANK, max_body=1 << 20, bind="127.0.0.1")
    link = DoorLink(_Inner(), door)
    yield door, link, Tickets(link, timeout=5.0)
    door.close()


def _knock(door: Door, ticket: str) -> tuple[SocketLink, Message]:
    joiner = SocketLink(socket.create_connection(("127.0.0.1", door.port), timeout=5))
    joiner.send(0, Tag.JOIN, Join(ticket, "hostJ"))
    return joiner, _poll(door)


@pytest.mark.parametrize("word_first", [True, False], ids=["word-first", "knock-first"])
def test_a_knock_with_server_0s_ticket_is_let_in_as_server_0s_rank_whichever_came_first(follower, word_first):
    door, link, tickets = follower
    word = Seated(rank=7, client=3, ticket="t" * 32)
    if word_first:
        tickets.seated(word, now=0.0)
    joiner, knock = _knock(door, word.ticket)
    assert knock.source == FIRST_RANK and knock.tag == Tag.JOIN  # a stranger's rank until it is let in
    tickets.knock(knock, now=0.1)
    if not word_first:
        assert door.joiners() == []  # it waits for server 0's word
        tickets.seated(word, now=0.2)
    assert door.joiners() == [7] and joiner.recv(5, 0).header == word  # told the number server 0 gave it
    # from now on it is rank 7 here: its messages and the server's answers
    joiner.send(0, Tag.PUSH, Push(step=1, size=4, fetch=True), np.ones(4, np.float32))
    assert _poll(door).source == 7
    link.send(7, Tag.WEIGHTS, Weights(1, 4), np.full(4, 2, np.float32))
    into = np.empty(4, np.float32)
    assert joiner.complete(joiner.expect_weights([0], [into]), [0], 16, 5) == [Weights(1, 4)]
    assert np.array_equal(into, np.full(4, 2))
    joiner.close()


def test_a_wrong_ticket_waits_then_is_refused_and_a_ticket_opens_one_door_once(follower):
    door, _, tickets = follower
    tickets.seated(Seated(rank=7, client=3, ticket="a" * 32), now=0.0)
    stranger, knock = _knock(door, "b" * 32)
    tickets.knock(knock, now=1.0)
    assert door.joiners() == [] and tickets.words  # the word still waits for its own joiner
    tickets.seated(Seated(rank=8, client=4, ticket="c" * 32), now=7.0)  # past the 5 s a knock may wait
    assert stranger.recv(5, 0).header == Fail("join refused: no join of server 0's shows this ticket (waited 5 s)")
    first, knock = _knock(door, "a" * 32)
    tickets.knock(knock, now=8.0)
    assert door.joiners() == [7]
    again, knock = _knock(door, "a" * 32)
    tickets.knock(knock, now=9.0)
    assert door.joiners() == [7] and list(tickets.knocks) == [knock.source]  # waits for a word that never comes
    for link in (stranger, first, again):
        link.close()


def test_a_malformed_knock_is_refused_at_once(follower):
    door, _, tickets = follower
    joiner = SocketLink(socket.create_connection(("127.0.0.1", door.port), timeout=5))
    joiner.send(0, Tag.PULL, Pull())  # not a JOIN: handed on as a JOIN with no header
    tickets.knock(_poll(door), now=0.0)
    assert joiner.recv(5, 0).header == Fail("join refused: malformed join: header NoneType") and not tickets.knocks
    joiner.close()


def test_a_spares_word_waits_for_no_knock():
    tickets = Tickets(link=None, timeout=5.0)
    tickets.seated(Seated(rank=3, client=2), now=0.0)  # a rank of the job: no ticket, nothing to match
    assert tickets.words == []


def test_tickets_are_the_secrets_keyed_to_each_client_and_server_0s_welcome_carries_it():
    state = _state("s3cret")
    tickets = {membership.ticket(state, c) for c in range(3)}
    assert len(tickets) == 3 and all(len(t) == 32 and "s3cret" not in t for t in tickets)
    other = _state("other")
    assert membership.ticket(other, 2) != membership.ticket(state, 2)
    [reply], _ = handle(state, Message(9, Tag.JOIN, Join("s3cret", "h")))
    assert isinstance(reply.header, Welcome) and reply.header.ticket == membership.ticket(state, 2)


def test_a_follower_grows_by_server_0s_word_and_refuses_a_word_that_numbers_otherwise():
    state = _state(None)
    membership.follow_seat(state, Seated(rank=9, client=2))
    assert state.client_ranks[-1] == 9 and state.client(9) == 2 and 9 in state.waiting
    with pytest.raises(ProtocolError, match="seated rank 10 as client 4; this server counts it client 3"):
        membership.follow_seat(state, Seated(rank=10, client=4))


def test_server_0s_seat_word_is_yielded_in_its_order_without_waiting_for_a_message():
    follow = Follow(time.monotonic)
    for word in (Seated(rank=9, client=2, ticket="t"), Decided(9, ())):
        follow.take(Message(0, Tag.DECIDED, word))
    ready = follow.ready(gone=())
    assert next(ready) == (Seated(rank=9, client=2, ticket="t"), None)
    assert next(ready, None) is None  # rank 9's message has not come: the next word waits for it
