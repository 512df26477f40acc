"""Server 0's door (paramserver/wire/door.py) and the stream it speaks (stream.py), without
MPI: real sockets on this host, the joiner's end a `SocketLink`."""
from __future__ import annotations

import socket
import time

import numpy as np
import pytest

from paramserver.wire import frame
from paramserver.wire.door import Door, DoorLink
from paramserver.wire.liveness import PeerDied
from paramserver.wire.protocol import Bye, Fail, Join, Message, PeerTimeout, Push, Stop, Tag, Weights, Welcome
from paramserver.wire.stream import FIRST_MAX, JOINER, PREFIX, SocketLink, decode, encode, read_prefix

UNPICKLED = []


class Trap:
    """A pickle that, loaded, would run code: a stranger's must never be."""

    def __reduce__(self):
        return UNPICKLED.append, ("loaded",)


def _wire(tag, header, payload=None, sender=0) -> bytes:
    return b"".join(bytes(b) for b in encode(tag, header, payload, sender))


def _read(data: bytes, source=5, into=None, trusted=True, framed_by=0) -> Message:
    prefix = read_prefix(data[:PREFIX.size])
    assert prefix is not None and prefix.length == len(data) - PREFIX.size
    return decode(prefix, np.frombuffer(data[PREFIX.size:], np.uint8).copy(), source, into, trusted, framed_by)


def test_each_kind_of_message_comes_back_as_it_was_sent():
    payload = np.arange(6, dtype=np.float32)
    into = np.zeros(6, np.float32)
    push = Push(step=3, size=6, fetch=True, rows=({"loss": 1.5},))
    got = _read(_wire(Tag.PUSH, push, payload, JOINER), into=into, framed_by=JOINER)
    assert got.header == push and got.payload is into and np.array_equal(into, payload) and got.source == 5
    weights = Weights(version=7, size=6, samples=96, window=4)
    assert _read(_wire(Tag.WEIGHTS, weights, payload)).header == weights
    assert _read(_wire(Tag.JOIN, Join("s3cret", "hostA")), trusted=False).header == Join("s3cret", "hostA")
    assert _read(_wire(Tag.BYE, Bye(2))).header == Bye(2)
    welcome = Welcome(3, 90, 0, 10, weights, clock=12.5)
    assert _read(_wire(Tag.JOIN, welcome)).header == welcome


def test_a_frame_naming_another_sender_is_garbled_and_a_strangers_pickle_is_never_loaded():
    push = Push(step=1, size=2, fetch=True)
    got = _read(_wire(Tag.PUSH, push, np.ones(2, np.float32), sender=3), framed_by=JOINER)
    assert type(got.header).__name__ == "Garbled"
    got = _read(_wire(Tag.STOP, Trap()), trusted=False)
    assert got.header is None and UNPICKLED == []
    bad_json = PREFIX.pack(b"asgd", int(Tag.JOIN), 1, 5) + b'{"a":'
    assert _read(bad_json, trusted=False).header is None


@pytest.fixture
def door():
    door = Door(first_rank=10, max_body=1 << 20, bind="127.0.0.1")
    yield door
    door.close()


def _poll(door: Door, into=None, wait: float = 5.0) -> Message:
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        msg = door.poll(into)
        if msg is not None:
            return msg
        time.sleep(0.005)
    raise AssertionError("no message came through the door")


def _joiner(door: Door) -> SocketLink:
    return SocketLink(socket.create_connection(("127.0.0.1", door.port), timeout=5))


def test_a_welcomed_joiner_is_a_client_whose_pushes_land_and_whose_end_is_a_dead_peer(door):
    link = _joiner(door)
    link.send(0, Tag.JOIN, Join("s3cret", "hostA"))
    msg = _poll(door)
    assert (msg.source, msg.tag, msg.header) == (10, Tag.JOIN, Join("s3cret", "hostA"))
    weights = np.arange(4, dtype=np.float32)
    door.complete(door.post(10, Tag.JOIN, Welcome(0, 5, 0, 0, Weights(1, 4))), 5)
    door.complete(door.post(10, Tag.WEIGHTS, Weights(1, 4), weights), 5)
    landing = frame.empty(4)
    assert link.recv(5).header == Welcome(0, 5, 0, 0, Weights(1, 4))
    assert link.complete(link.expect_weights([0], [landing]), [0], 16, 5) == [Weights(1, 4)]
    assert np.array_equal(landing, weights)
    link.send(0, Tag.PUSH, Push(step=1, size=4, fetch=True, rows=({"step": 1},)), np.full(4, 2, np.float32))
    into = frame.empty(4)
    msg = _poll(door, into)
    assert msg.tag == Tag.PUSH and msg.header.rows == ({"step": 1},) and np.array_equal(into, np.full(4, 2))
    link.send(0, Tag.STOP, Stop(1, 1))  # pickled: read, now that it is a client
    assert _poll(door).header == Stop(1, 1)
    assert door.joiners() == [10]
    link.close()
    with pytest.raises(PeerDied) as died:
        _poll(door)
    assert died.value.ranks == [10] and door.joiners() == []


def test_a_stranger_that_says_anything_but_a_join_is_refused_unread_and_told_why(door):
    link = _joiner(door)
    link.send(0, Tag.STOP, Trap())
    msg = _poll(door)
    assert (msg.source, msg.tag, msg.header) == (10, Tag.JOIN, None) and UNPICKLED == []
    door.refuse(10, "malformed join: header NoneType")
    reply = link.recv(5)
    assert reply.tag == Tag.FAIL and reply.header == Fail("join refused: malformed join: header NoneType")
    with pytest.raises(PeerDied):
        link.recv(5)
    assert 10 not in door.peers


def test_a_strangers_first_message_may_not_be_large(door):
    sock = socket.create_connection(("127.0.0.1", door.port), timeout=5)
    sock.sendall(PREFIX.pack(b"asgd", int(Tag.JOIN), 1, FIRST_MAX + 1))
    assert _poll(door).header is None  # nothing of it read: refused as malformed
    sock.close()
    garbage = socket.create_connection(("127.0.0.1", door.port), timeout=5)
    garbage.sendall(b"GET / HTTP/1.1\r\n\r\n")
    msg = _poll(door)
    assert (msg.source, msg.header) == (11, None)
    garbage.close()


class _Idle:
    """An inner link with nothing to say: each wait times out, as MPI's would."""

    def __init__(self):
        self.asked = []

    def recv(self, timeout, busy=0.0, into=None, **only):
        self.asked.append(only)
        time.sleep(min(timeout, 0.001))
        raise PeerTimeout("no message from any rank")


def test_the_servers_link_hears_the_door_between_waits_on_mpi_and_times_out_as_it_would(door):
    inner = _Idle()
    link = DoorLink(inner, door)
    joiner = _joiner(door)
    joiner.send(0, Tag.JOIN, Join("s3cret", "hostB"))
    assert link.recv(5.0).header == Join("s3cret", "hostB")
    with pytest.raises(PeerTimeout):
        link.recv(0.02)
    with pytest.raises(PeerTimeout):
        link.recv(0.01, source=0)
    assert inner.asked[-1] == {"source": 0}  # a wait for one rank of the job is the inner link's alone
    joiner.close()


def _welcomed(door: Door, rank: int) -> SocketLink:
    link = _joiner(door)
    link.send(0, Tag.JOIN, Join("s3cret", "host"))
    assert _poll(door).source == rank
    door.complete(door.post(rank, Tag.JOIN, Welcome(rank - 10, 5, 0, 0, Weights(1, 4))), 5)
    assert isinstance(link.recv(5).header, Welcome)
    return link


def test_two_pushes_read_in_one_poll_each_land_when_the_loop_takes_it(door):
    first, second = _welcomed(door, 10), _welcomed(door, 11)
    first.send(0, Tag.PUSH, Push(step=1, size=4, fetch=False), np.full(4, 1, np.float32))
    second.send(0, Tag.PUSH, Push(step=1, size=4, fetch=False), np.full(4, 2, np.float32))
    time.sleep(0.3)  # both whole on their sockets: one poll reads them both
    into = frame.empty(4)
    one = _poll(door, into)
    assert np.array_equal(into, np.full(4, one.source - 9))  # the landing holds the message handed out
    other = _poll(door, into)
    assert {one.source, other.source} == {10, 11} and np.array_equal(into, np.full(4, other.source - 9))


def test_a_joiner_announcing_more_than_the_door_takes_is_a_broken_peer_lost_before_anything_is_allocated(door):
    link = _welcomed(door, 10)
    link.socks[0].sendall(PREFIX.pack(b"asgd", int(Tag.STOP), 2, (1 << 20) + 1))
    with pytest.raises(PeerDied, match="announced a message"):
        _poll(door)


def test_a_joiner_gone_as_a_reply_is_posted_to_it_fails_no_post_the_next_poll_says_so_once(door):
    """As MPI's post, the door's never raises: a joiner that took its Welcome and closed
    before its weights went out (the server's loop between the two posts) is raised by
    the next poll, once, and by the reply's `complete`; the loop then loses it as any dead
    client (a post that raised took the server down with it)."""
    link = _welcomed(door, 10)
    link.close()
    time.sleep(0.2)  # the close is in: the next writes find the stream broken
    sent = [door.post(10, Tag.WEIGHTS, Weights(1, 1 << 20), np.zeros(1 << 20, np.float32)) for _ in range(2)]
    with pytest.raises(PeerDied, match="joiner rank 10"):
        door.poll(None)
    assert door.poll(None) is None and door.joiners() == []
    with pytest.raises(PeerDied):
        door.complete(sent[-1], 1.0)
