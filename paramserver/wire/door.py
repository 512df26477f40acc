"""A server's door: processes that MPI does not own join a running job over TCP (`--joinable`).

`Door` listens on a port of its server's host and holds one stream a joiner
(paramserver/wire/stream.py says why streams, not MPI's dynamic processes). At server 0
each connection gets a rank of its own past the job's (`first_rank` on), so the server
loop and `handle()` see a joiner as any other rank: its JOIN is let in or refused by
paramserver/membership.py, and from its Welcome on it is a client like the others. At
servers 1..S-1 of sharded servers a connection is a stranger's rank until server 0's
word lets it in as the rank server 0 gave it (`admit`; paramserver/drivers/tickets.py).

What a stranger can do to the run: nothing but be refused. Until the server welcomed it,
a connection's only message read is its first, at most `FIRST_MAX` bytes of JSON, handed
on as a JOIN (anything else as a JOIN with no header, which the handler refuses as
malformed); a refused one is told why (FAIL) and closed; at most `STRANGERS` wait at once.
A welcomed joiner whose stream closes is a client that died (`PeerDied`): the server's
loop treats it as it treats a rank MPI lost, and one that dies before its Welcome left
no trace but a refusal or nothing.

The door never blocks the loop: reads take what the socket holds, writes go out as the
socket takes them, and whatever is left waits in the peer's outbox until the next poll,
`done` or `complete` (the MPI transport's `post` semantics: a reply's payload must not
change until it is complete, which the loop's `finish_replies` guarantees).

`DoorLink` is the server loop's `Link` with a door: each wait polls the door between
short waits on the inner link (the MPI transport), so a joiner's message waits at most
`SLICE` longer to be seen.
"""
from __future__ import annotations

import select
import selectors
import socket
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from paramserver.wire.liveness import PeerDied
from paramserver.wire.protocol import Fail, Link, Message, PeerTimeout, Tag, Welcome
from paramserver.wire.stream import FIRST_MAX, JOINER, PREFIX, Prefix, decode, encode, read_prefix

STRANGERS = 64   # connections not yet welcomed, at most, at once
SLICE = 2e-3     # the longest a wait on the inner link goes before the door is looked at


@dataclass
class _Peer:
    sock: socket.socket
    rank: int
    address: str
    trusted: bool = False      # welcomed: a client of the run
    judged: bool = False       # its JOIN was handed on: nothing more is read until it is welcomed
    head: bytearray = field(default_factory=bytearray)
    prefix: Prefix | None = None
    body: np.ndarray | None = None
    got: int = 0
    outbox: deque = field(default_factory=deque)
    queued: int = 0            # bytes put in the outbox, ever
    sent: int = 0              # of them, written to the socket


@dataclass(frozen=True)
class _Sent:
    """A message posted to a peer: out once the peer's `sent` reaches `end`."""
    rank: int
    end: int


class Door:
    """The listening socket and the joiners' streams (see the module's doc)."""

    def __init__(self, first_rank: int, max_body: int, bind: str = ""):
        """`max_body`: the most bytes a welcomed joiner's message may announce (a larger
        one is a broken peer, lost, before anything is allocated for it)."""
        self.listener = socket.create_server((bind, 0))
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.peers: dict[int, _Peer] = {}
        self.first_rank = self.next_rank = first_rank
        self.max_body = max_body
        self.ready: deque[tuple[int, Prefix, np.ndarray, bool]] = deque()  # whole messages, not yet decoded
        self.died: deque[PeerDied] = deque()  # joiners whose stream broke as a post wrote to it, for `poll` to raise
        self.receive_s = self.receive_cpu_s = 0.0

    def joiners(self) -> list[int]:
        """The ranks of the welcomed joiners still connected."""
        return [rank for rank, peer in self.peers.items() if peer.trusted]

    def poll(self, into: np.ndarray | None) -> Message | None:
        """A message that has come in whole, if any (no wait): new connections are taken,
        readable streams read, outboxes written on. A welcomed joiner's closed stream is
        raised (`PeerDied`) once."""
        if self.died:
            raise self.died.popleft()
        for key, _ in self.selector.select(0):
            if key.fileobj is self.listener:
                self._accept()
            else:
                self._read(key.data)
        for peer in list(self.peers.values()):
            if peer.outbox:
                self._flush(peer)
        return self._decode(into) if self.ready else None

    def _decode(self, into: np.ndarray | None) -> Message:
        """The oldest whole message, decoded now: a push's payload lands in `into` only
        when the loop takes it (two pushes read in one poll would share the landing)."""
        rank, prefix, body, trusted = self.ready.popleft()
        if prefix is None:  # a stranger's first message, unread: a JOIN with no header
            return Message(rank, Tag.JOIN, None)
        start, start_cpu = time.perf_counter(), time.thread_time()
        message = decode(prefix, body, rank, into, trusted, framed_by=JOINER)
        self.receive_s, self.receive_cpu_s = time.perf_counter() - start, time.thread_time() - start_cpu
        return message

    def _accept(self) -> None:
        while True:
            try:
                sock, address = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            if sum(not p.trusted for p in self.peers.values()) >= STRANGERS:
                sock.close()
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            peer = _Peer(sock, self.next_rank, f"{address[0]}:{address[1]}")
            self.next_rank += 1
            self.peers[peer.rank] = peer
            self.selector.register(sock, selectors.EVENT_READ, peer)

    def _read(self, peer: _Peer) -> None:
        """Take what the socket holds; each message that is whole goes to `ready`."""
        while peer.rank in self.peers and not (peer.judged and not peer.trusted):
            try:
                if peer.prefix is None:
                    chunk = peer.sock.recv(PREFIX.size - len(peer.head))
                    n = len(chunk)
                    peer.head += chunk
                else:
                    n = peer.sock.recv_into(memoryview(peer.body)[peer.got:])
                    peer.got += n
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                return self._gone(peer, error.strerror or str(error))
            if n == 0:
                return self._gone(peer, "closed its connection")
            if peer.prefix is None and len(peer.head) == PREFIX.size:
                if not self._begin(peer):
                    return
            if peer.prefix is not None and peer.got == peer.prefix.length:
                self._deliver(peer)

    def _begin(self, peer: _Peer) -> bool:
        """The prefix is in: make room for the body; a stranger's message that is not a
        JOIN of a reasonable size is handed on as a malformed JOIN, unread."""
        prefix = read_prefix(bytes(peer.head))
        peer.head.clear()
        if prefix is None or not peer.trusted and (prefix.tag != Tag.JOIN or prefix.length > FIRST_MAX):
            if not peer.trusted:
                peer.judged = True
                self.ready.append((peer.rank, None, None, False))
            else:
                self._gone(peer, "sent bytes that are not a message")
            return False
        if prefix.length > self.max_body:
            self._gone(peer, f"announced a message of {prefix.length} bytes (at most {self.max_body})")
            return False
        peer.prefix, peer.body, peer.got = prefix, np.empty(prefix.length, np.uint8), 0
        return True

    def _deliver(self, peer: _Peer) -> None:
        self.ready.append((peer.rank, peer.prefix, peer.body, peer.trusted))
        peer.prefix, peer.body = None, None
        if not peer.trusted:
            peer.judged = True

    def _gone(self, peer: _Peer, why: str) -> None:
        """A stream ended: a stranger is forgotten; a welcomed joiner died."""
        self._drop(peer)
        if peer.trusted:
            raise PeerDied([peer.rank], f"joiner rank {peer.rank} ({peer.address}) {why}")

    def _drop(self, peer: _Peer) -> None:
        if self.peers.pop(peer.rank, None) is not None:
            self.selector.unregister(peer.sock)
            peer.sock.close()

    def post(self, dest: int, tag: Tag, header: Any, payload: np.ndarray | None = None) -> _Sent:
        """Start sending; a Welcome makes its peer a client (its later messages are read in full)."""
        peer = self.peers.get(dest)
        if peer is None:  # gone since its message came: `done` and `complete` say so, as MPI's would
            return _Sent(dest, 1)
        if isinstance(header, Welcome):
            peer.trusted, peer.judged = True, False
        for buffer in encode(tag, header, payload, 0):
            view = memoryview(buffer).cast("B")
            peer.outbox.append(view)
            peer.queued += view.nbytes
        try:
            self._flush(peer)
        except PeerDied as died:  # as MPI's post, this never fails: the next poll says so, `done` and `complete` too
            self.died.append(died)
        return _Sent(dest, peer.queued)

    def _flush(self, peer: _Peer) -> None:
        while peer.outbox:
            head = peer.outbox[0]
            try:
                n = peer.sock.send(head)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                return self._gone(peer, error.strerror or str(error))
            peer.sent += n
            if n == head.nbytes:
                peer.outbox.popleft()
            else:
                peer.outbox[0] = head[n:]

    def done(self, sent: _Sent) -> bool:
        peer = self.peers.get(sent.rank)
        if peer is None:
            raise PeerDied([sent.rank], f"joiner rank {sent.rank} is gone")
        self._flush(peer)
        return peer.sent >= sent.end

    def complete(self, sent: _Sent, timeout: float) -> None:
        """Wait until `sent` is out, at most `timeout` seconds (`PeerTimeout` naming the peer)."""
        deadline = time.monotonic() + timeout
        while not self.done(sent):
            left = deadline - time.monotonic()
            if left <= 0:
                raise PeerTimeout(f"joiner rank {sent.rank} took no message for {timeout:g} s", (sent.rank,))
            peer = self.peers.get(sent.rank)
            if peer is None:  # dropped while we waited
                raise PeerDied([sent.rank], f"joiner rank {sent.rank} is gone")
            select.select([], [peer.sock], [], min(left, 0.1))

    def admit(self, rank: int, as_rank: int) -> None:
        """A server > 0 of sharded servers lets a joiner in by server 0's word
        (paramserver/drivers/tickets.py): connection `rank` becomes a client known by
        `as_rank`, the rank server 0 gave it, so server 0's words about it name it here."""
        peer = self.peers.pop(rank)
        peer.rank, peer.trusted, peer.judged = as_rank, True, False
        self.peers[as_rank] = peer

    def owns(self, rank: int) -> bool:
        """Whether `rank` is one of the door's (else a rank of the MPI job)."""
        return rank in self.peers or rank >= self.first_rank

    def refuse(self, rank: int, why: str) -> None:
        """Tell a joiner why it was refused (as far as its socket takes it now), and close."""
        peer = self.peers.get(rank)
        if peer is None or peer.trusted:
            return
        try:
            for buffer in encode(Tag.FAIL, Fail(f"join refused: {why}"), None, 0):
                peer.sock.send(buffer)
        except OSError:
            pass
        self._drop(peer)

    def close(self) -> None:
        for peer in list(self.peers.values()):
            self._drop(peer)
        self.selector.close()
        self.listener.close()


class DoorLink:
    """The server loop's `Link` with a door: the joiners' ranks go through `door`, the
    job's through `inner` (the MPI transport)."""

    def __init__(self, inner: Link, door: Door):
        self.inner, self.door = inner, door
        self._last: Any = inner

    @property
    def receive_s(self) -> float:
        return getattr(self._last, "receive_s", 0.0)

    @property
    def receive_cpu_s(self) -> float:
        return getattr(self._last, "receive_cpu_s", 0.0)

    def recv(self, timeout: float, busy: float = 1e-3, into: np.ndarray | None = None, **only: Any) -> Message:
        """The next message from any rank, the door's or the inner link's; with `source` or
        `tag` given (`only`), the inner link's alone."""
        if only:
            return self.inner.recv(timeout, busy=busy, into=into, **only)
        deadline = time.monotonic() + timeout
        while True:
            msg = self.door.poll(into)
            if msg is not None:
                self._last = self.door
                return msg
            left = deadline - time.monotonic()
            try:
                msg = self.inner.recv(min(max(left, 0.0), SLICE), busy=busy, into=into)
                self._last = self.inner
                return msg
            except PeerTimeout as timed_out:
                if timed_out.peers or left <= SLICE:
                    raise
            busy = 0.0

    def send(self, dest: int, tag: Tag, header: Any, payload: np.ndarray | None = None,
             timeout: float = 600.0) -> None:
        if self.door.owns(dest):
            self.door.complete(self.door.post(dest, tag, header, payload), timeout)
        else:
            self.inner.send(dest, tag, header, payload, timeout)

    def send_many(self, messages: list[tuple[int, Tag, Any, np.ndarray | None]], timeout: float = 600.0) -> None:
        for message in messages:
            self.send(*message, timeout=timeout)

    def post(self, dest: int, tag: Tag, header: Any, payload: np.ndarray | None = None) -> Any:
        if self.door.owns(dest):
            return self.door.post(dest, tag, header, payload)
        return self.inner.post(dest, tag, header, payload)

    def done(self, requests: Any) -> bool:
        return self.door.done(requests) if isinstance(requests, _Sent) else self.inner.done(requests)

    def expect_weights(self, sources: list[int], intos: list[np.ndarray]) -> Any:
        return self.inner.expect_weights(sources, intos)

    def complete(self, requests: Any, peers: list[int], nbytes: int, timeout: float) -> list:
        if isinstance(requests, _Sent):
            self.door.complete(requests, timeout)
            return []
        return self.inner.complete(requests, peers, nbytes, timeout)

    def refuse(self, rank: int, why: str) -> None:
        self.door.refuse(rank, why)

    def admit(self, rank: int, as_rank: int) -> None:
        self.door.admit(rank, as_rank)
