"""Bad messages at the server driver: each is rejected, logged with its reason in
server.jsonl, leaves the weights (byte for byte) and the version as they were, and the
next good push still applies.

Each bad message goes through `handle()` on its own (InProcess.deliver), and all of
them through one `ServerLoop` over a scripted link, which must end at the last client's
STOP and not before.
"""
from __future__ import annotations

from collections import deque
from typing import Any, NamedTuple

import numpy as np
import pytest

from paramserver.drivers.inprocess import InProcess, land
from paramserver.drivers.server import ServerLoop
from paramserver.wire.frame import Garbled
from paramserver.wire.protocol import Fail, Message, Pull, Push, Stop, Tag, Weights, carries_payload
from rundir.durable import read_jsonl
from tests.conftest import make_server, push

GOOD = np.ones(4, np.float32)
NAN = np.array([1, np.nan, 0, 0], np.float32)


class Bad(NamedTuple):
    """One bad message: (source rank, tag, header, payload).

    `reason`: a part of the logged rejection ("" for any). `answered`: a push rejected for
    its payload still gets the weights it asked for, so its client is not left waiting.
    `stopped`: sent after client rank 2's STOP.
    """
    message: tuple[int, int, Any, np.ndarray | None]
    reason: str
    answered: bool = False
    stopped: bool = False


BAD = {
    # (a) a tag the server does not take from a client
    "unknown tag": Bad((1, 99, Pull(), None), "tag unknown tag 99 is not one a client sends"),
    "tag 6 (a payload's, before pushes were one message)": Bad((1, 6, None, None), "unknown tag 6"),
    "WEIGHTS from a client": Bad((1, Tag.WEIGHTS, Weights(0, 4), None), "tag WEIGHTS is not one a client sends"),
    # (b) a known tag with another header type
    "PUSH with a Stop header": Bad((1, Tag.PUSH, Stop(1, 1), GOOD), "with header Stop"),
    "PUSH without a header": Bad((1, Tag.PUSH, None, GOOD), "with header NoneType"),
    "PULL with a Push header": Bad((1, Tag.PULL, Push(1, 4, True), None), "with header Push"),
    "STOP with a Pull header": Bad((1, Tag.STOP, Pull(), None), "with header Pull"),
    "FAIL with a Stop header": Bad((1, Tag.FAIL, Stop(0, 0), None), "with header Stop"),
    "STOP with a NaN busy time": Bad((1, Tag.STOP, Stop(0, 0, 0, 0, float("nan"), 1.0), None), "with header Stop"),
    "STOP with a negative span": Bad((1, Tag.STOP, Stop(0, 0, 0, 0, 0.0, -1.0), None), "with header Stop"),
    # (c) a payload of the wrong size
    "5 floats": Bad((1, *push(1, np.ones(5, np.float32))), "payload of 20 bytes", answered=True),
    "3 floats": Bad((1, *push(1, np.ones(3, np.float32))), "payload of 12 bytes", answered=True),
    "no floats": Bad((1, *push(1, np.ones(0, np.float32))), "payload of 0 bytes", answered=True),
    # (d) the wrong dtype
    "float32 bytes said to be float64": Bad((1, *push(1, GOOD, dtype="float64")), "4 float64", answered=True),
    "two float64": Bad((1, *push(1, np.ones(2, np.float64), dtype="float64")), "2 float64", answered=True),
    "four float64 said to be float32": Bad((1, *push(1, np.ones(4, np.float64))), "of 32 bytes", answered=True),
    "header says 5 floats, 4 come": Bad((1, Tag.PUSH, Push(1, 5, True), GOOD), "as 5 float32", answered=True),
    "6 bytes": Bad((1, *push(1, np.ones(6, np.uint8))), "payload of 6 bytes", answered=True),
    # (e) a rank that is not a client
    "push from rank 0": Bad((0, *push(1, GOOD)), "rank 0, which is not a client"),
    "pull from rank 0": Bad((0, Tag.PULL, Pull(), None), "rank 0, which is not a client"),
    "push from rank 3": Bad((3, *push(1, GOOD)), "rank 3, which is not a client"),
    "pull from rank 3": Bad((3, Tag.PULL, Pull(), None), "rank 3, which is not a client"),
    "STOP from rank 3": Bad((3, Tag.STOP, Stop(0, 0), None), "rank 3, which is not a client"),
    # (f) anything after the client's STOP
    "second STOP": Bad((2, Tag.STOP, Stop(5, 5), None), "after its STOP", stopped=True),
    "push after STOP": Bad((2, *push(1, GOOD)), "after its STOP", stopped=True),
    "pull after STOP": Bad((2, Tag.PULL, Pull(), None), "after its STOP", stopped=True),
    "FAIL after STOP": Bad((2, Tag.FAIL, Fail("late"), None), "after its STOP", stopped=True),
    # (g) values that are not finite
    "NaN": Bad((1, *push(1, NAN)), "NaN or Inf", answered=True),
    "+Inf": Bad((1, *push(1, np.array([0, 0, np.inf, 1], np.float32))), "NaN or Inf", answered=True),
    "-Inf": Bad((1, *push(1, np.array([-np.inf, 0, 0, 1], np.float32))), "NaN or Inf", answered=True),
    "NaN without fetch": Bad((1, *push(1, NAN, fetch=False)), "NaN or Inf"),
}

def start(server: InProcess, stopped: bool) -> None:
    """Both clients pull and client 1 pushes (version 1, so "untouched" is not just "still
    empty"); client rank 2 stops if the bad message comes after its STOP."""
    for rank in (1, 2):
        server.deliver(rank, Tag.PULL, Pull())
    server.deliver(1, *push(1, GOOD))
    if stopped:
        server.deliver(2, Tag.STOP, Stop(0, 0))


def state(server: InProcess) -> tuple:
    """Everything a bad message must leave alone: the weights' bytes, the version, what was
    applied with which staleness, and which clients have stopped."""
    store = server.state.store
    return (store.weights.tobytes(), store.version, dict(store.applied), dict(store.staleness),
            dict(server.state.tally.stops))


def rejections(server: InProcess) -> list[dict]:
    return [row for row in read_jsonl(server.recorder.run.path / "server.jsonl") if "rejected" in row]


def assert_rejected(row: dict, bad: Bad) -> None:
    assert row["rank"] == bad.message[0] and row["rejected"] and bad.reason in row["rejected"]


@pytest.mark.parametrize("bad", BAD.values(), ids=BAD.keys())
def test_bad_message_is_rejected_logged_and_harmless(served, bad):
    start(served, bad.stopped)
    before = state(served)
    replies = served.deliver(*bad.message)
    assert state(served) == before
    assert [reply.header.version for reply in replies] == ([1] if bad.answered else [])
    [row] = rejections(served)
    assert_rejected(row, bad)
    assert served.state.tally.rejected == 1
    [reply] = served.deliver(1, *push(2, GOOD))
    assert reply.header.version == 2
    np.testing.assert_array_equal(reply.payload, np.arange(4) + 2)


@pytest.mark.parametrize("header", [Push(None, 4, True), Push(1, 4, True, rows=("loss 1.0",)),
                                    Push(1, 4, True, rows=({"loss": np.ones(2)},))],
                         ids=["step not an int", "row not a dict", "row value not loggable"])
def test_push_header_with_fields_of_wrong_types_is_rejected_before_it_applies(served, header):
    start(served, stopped=False)
    before = state(served)
    served.deliver(1, Tag.PUSH, header, GOOD)
    assert state(served) == before
    assert len(rejections(served)) == 1


class Script:
    """The loop's link: hands over the given messages in order, a push's payload with it
    as MPI lands it; replies are delivered at once."""

    def __init__(self, messages: list[tuple[int, int, Any, np.ndarray | None]]):
        self.messages = deque(messages)

    def recv(self, timeout: float, busy: float = 0.0, into: np.ndarray | None = None) -> Message:
        source, tag, header, payload = self.messages.popleft()
        return Message(source, int(tag), header, land(payload, into) if carries_payload(tag, header) else None)

    def post(self, dest: int, tag: Tag, header: Any, payload: np.ndarray | None = None) -> list:
        return []

    def complete(self, requests: list, peers: list[int], nbytes: int, timeout: float) -> None:
        pass


def test_serve_rejects_every_bad_message_and_ends_only_when_every_client_stopped(tmp_path):
    # In the order sent: client rank 2 stops between the two groups.
    bad = sorted(BAD.values(), key=lambda b: b.stopped)
    script = [(1, Tag.PULL, Pull(), None), (2, Tag.PULL, Pull(), None), (1, *push(1, GOOD))]
    script += [b.message for b in bad if not b.stopped] + [(2, Tag.STOP, Stop(0, 0), None)]
    script += [b.message for b in bad if b.stopped] + [(1, *push(2, GOOD)), (1, Tag.STOP, Stop(2, 2), None)]
    server = make_server(tmp_path / "run", np.arange(4, dtype=np.float32), clients=2)
    link = Script(script)
    tally = ServerLoop(link, server.state, server.recorder, clock=lambda: 0.0, stall_timeout=1.0).serve()
    server.recorder.close()
    assert not link.messages  # it did not stop early
    assert tally.rejected == len(bad) and tally.stops == {2: Stop(0, 0), 1: Stop(2, 2)}
    for row, b in zip(rejections(server), bad, strict=True):
        assert_rejected(row, b)
    assert [row["version"] for row in read_jsonl(tmp_path / "run" / "server.jsonl") if "version" in row] == [1, 2]
    np.testing.assert_array_equal(server.state.store.weights, np.arange(4) + 2)


class Loopback:
    """Over real MPI, this process alone: what a sender puts on the wire, as the server's
    transport reads it (under MPICH a send to oneself completes only once received;
    Open MPI may complete a small one at once)."""

    def __init__(self):
        from mpi4py import MPI

        from paramserver.wire.transport import Transport

        self.MPI, self.comm = MPI, MPI.COMM_SELF
        self.transport = Transport(self.comm)
        self.sent: list = []

    def raw(self, data: bytes | np.ndarray, tag: int) -> None:
        self.sent.append(self.comm.Isend([np.frombuffer(bytes(data), np.uint8), self.MPI.BYTE], dest=0, tag=tag))

    def receive(self, into: np.ndarray | None) -> Message:
        msg = self.transport.recv(timeout=5, into=into)
        self.done(self.sent)
        self.sent = []
        return msg

    def done(self, requests: list) -> None:
        """Wait for sends (5 s at most: a test must fail, not hang)."""
        from paramserver.wire.transport import Posted

        self.transport.complete(Posted(requests), [0], 0, 5)


@pytest.mark.parametrize("framed", [True, False], ids=["in place", "through a datatype"])
def test_a_push_is_one_message_that_lands_in_the_servers_buffer(framed):
    from paramserver.wire import frame

    wire = Loopback()
    payload, into = (frame.empty(4), frame.empty(4)) if framed else (np.empty(4, np.float32), np.empty(4, np.float32))
    payload[:] = [1, 2, 3, 4]
    header = Push(7, 4, True, rows=({"client": 0, "step": 7, "loss": float("nan")}, {"client": 0, "step": 8}))
    posted = wire.transport.post(0, Tag.PUSH, header, payload)
    msg = wire.transport.recv(timeout=5, into=into)
    wire.done(posted)
    assert msg.payload is into and into.tolist() == [1, 2, 3, 4]
    assert (msg.header.step, msg.header.size, msg.header.fetch, msg.header.dtype) == (7, 4, True, "float32")
    assert msg.header.rows[1] == {"client": 0, "step": 8} and np.isnan(msg.header.rows[0]["loss"])


def test_a_pickled_object_on_the_push_tag_is_rejected_unread_and_the_next_message_reads():
    import pickle

    wire = Loopback()
    wire.raw(pickle.dumps(Push(1, 4, True)), Tag.PUSH)
    into = np.zeros(4, np.float32)
    msg = wire.receive(into)
    assert isinstance(msg.header, Garbled) and "magic" in msg.header.why
    wire.sent.append(wire.comm.isend(Pull(), dest=0, tag=Tag.PULL))
    assert wire.receive(None).header == Pull()


def frame_bytes(header: Push, payload: np.ndarray, rank: int = 0) -> bytearray:
    from paramserver.wire import frame

    head = np.zeros(frame.HEADER_BYTES, np.uint8)
    rows = frame.rows_bytes(header)
    frame.write_header(head, Tag.PUSH, header, rank, rows)
    return bytearray(head.tobytes() + payload.tobytes() + rows)


@pytest.mark.parametrize("damage", ["flip a header bit", "wrong rank", "rows cut short", "rows not JSON"])
def test_a_damaged_frame_is_garbled_and_the_server_rejects_it(served, damage):
    data = frame_bytes(Push(1, 4, True, rows=({"client": 0, "step": 1},)), GOOD,
                       rank=3 if damage == "wrong rank" else 0)
    if damage == "flip a header bit":
        data[20] ^= 0x10
    elif damage == "rows cut short":
        data = data[:-2]
    elif damage == "rows not JSON":
        data[-3] = ord("{")
    wire = Loopback()
    wire.raw(data, Tag.PUSH)
    msg = wire.receive(served.state.landing)
    assert isinstance(msg.header, Garbled)
    start(served, stopped=False)
    before = state(served)
    served.deliver(1, Tag.PUSH, msg.header, msg.payload)
    assert state(served) == before
    [row] = rejections(served)
    assert row["rejected"].startswith("malformed message: ")


def test_a_payload_of_the_wrong_size_lands_as_bytes_that_are_rejected():
    wire = Loopback()
    wire.raw(frame_bytes(Push(1, 5, True), np.ones(5, np.float32)), Tag.PUSH)
    into = np.zeros(4, np.float32)
    msg = wire.receive(into)
    assert msg.header == Push(1, 5, True) and msg.payload.dtype == np.uint8 and msg.payload.nbytes == 20


def test_a_bad_weights_reply_is_an_error_not_weights():
    from paramserver.wire.transport import ProtocolError

    wire = Loopback()
    into = np.zeros(4, np.float32)
    posted = wire.transport.expect_weights([0], [into])
    wire.raw(frame_bytes(Push(1, 4, True), GOOD), Tag.WEIGHTS)  # a push's header, on the weights' tag
    with pytest.raises(ProtocolError, match="bad weights reply from rank 0"):
        wire.transport.complete(posted, [0], into.nbytes, 5)


def test_a_second_reply_from_weights_still_being_sent_does_not_rewrite_the_first_ones_header():
    """Two replies from one vector before the first is taken (the server answering several
    clients' PULLs): the second goes through a copy, and each arrives as it was sent."""
    from paramserver.wire import frame

    wire = Loopback()
    weights = frame.empty(4)
    weights[:] = [1, 2, 3, 4]
    first = wire.transport.post(0, Tag.WEIGHTS, Weights(1, 4), weights)
    second = wire.transport.post(0, Tag.WEIGHTS, Weights(2, 4), weights)
    if first.keep[0].__array_interface__["data"] == second.keep[0].__array_interface__["data"]:
        # the block may be written again only once its send is done: Open MPI completes a
        # small send to oneself at once (eagerly), MPICH only when it is received
        assert wire.MPI.Request.Testall(first)
    into = frame.empty(4)
    got = [wire.transport.recv(timeout=5, into=into).header for _ in range(2)]
    wire.done([*first, *second])
    assert got == [Weights(1, 4), Weights(2, 4)] and into.tolist() == [1, 2, 3, 4]
