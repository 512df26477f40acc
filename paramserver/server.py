"""The server driver: move messages between clients and the Store.

`serve()` answers clients in the order their messages arrive (no round robin), applies
each push with the Store's rule, replies with the weights when asked, writes a
server.jsonl row per push and the clients' rows to clients.jsonl, snapshots the weights
every `eval_every` versions for the test evaluation, and returns when every client has
sent STOP. A malformed push is logged and rejected; it never reaches the weights.

A client that fails (it reports an exception), stalls (silent past the stall timeout)
or dies (`PeerWatch`) is lost: by default that ends the job, naming it; with
`on_client_failure = "continue"` the server records it and goes on with the others.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from paramserver.checkpoint import Checkpoint
from paramserver.compress import Codec
from paramserver.config import InjectedFault
from paramserver.liveness import PeerDied
from paramserver.protocol import FROM_CLIENTS, Link, Message, PeerTimeout, Push, Stop, Tag, Weights, well_formed
from paramserver.rundir import RunDir
from paramserver.store import ApplyResult, Store


class ClientLost(RuntimeError):
    """A client can no longer take part: the job ends, or goes on without it."""

    def __init__(self, rank: int, what: str, named: bool = False):
        super().__init__(what)
        self.rank = rank
        self.named = named  # logged already: it ends the job


class ClientFailed(ClientLost):
    """A client reported an exception."""


class ClientStalled(ClientLost):
    """A client has sent nothing for longer than the stall timeout."""


class ClientDied(ClientLost):
    """A client's process is gone."""


@dataclass
class ServerTally:
    """What the summary and a checkpoint need from the serving loop."""

    clients: int
    minibatches: int = 0
    samples: int = 0
    rejected: int = 0
    stops: dict[int, Stop] = field(default_factory=dict)
    lost: dict[int, dict] = field(default_factory=dict)  # rank -> what the summary says of it

    def __post_init__(self) -> None:
        self.client_steps = np.zeros(self.clients, np.int64)   # step of each client's last push handled
        self.client_pushes = np.zeros(self.clients, np.int64)  # pushes handled, per client

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint) -> "ServerTally":
        tally = cls(len(checkpoint.client_steps), *checkpoint.counts)
        tally.client_steps[:] = checkpoint.client_steps
        tally.client_pushes[:] = checkpoint.client_pushes
        return tally


@dataclass
class Serving:
    """Everything serve() works with, gathered so the loop's helpers stay small.

    A resumed run passes the checkpoint's `tally` and the row counts its logs were cut
    back to (`log_lines`); a fresh one starts from nothing and snapshots version 0.
    """

    transport: Link
    store: Store
    run: RunDir
    client_ranks: list[int]
    eval_every: int
    stall_timeout: float
    clock: Callable[[], float]
    fault_version: int | None = None
    progress: Callable[[int], None] = lambda minibatches: None
    apply_cost: float | None = None   # seconds an apply is logged as taking; None: measured
    tally: ServerTally | None = None
    log_lines: tuple[int, int] = (0, 0)  # rows already in (server, clients) logs
    hosts: dict[int, str] = field(default_factory=dict)  # rank -> host, to name a lost client
    on_client_failure: str = "abort"
    busy_s: float = 0.0  # wall time spent handling messages (the rest is waiting for them)
    codec: Codec = field(default_factory=Codec)  # pushes and pulls on the wire
    wire_bytes: list[int] = field(default_factory=lambda: [0, 0])  # payload bytes (pushed, pulled)
    # Sharded servers: server 0 assembles the whole vector from every slice (`gather`);
    # the others let server 0 read theirs (`peers`).
    gather: Callable[[np.ndarray], np.ndarray] | None = None
    peers: tuple[int, ...] = ()
    heard: dict[int, tuple[float, str]] = field(default_factory=dict)  # rank -> (when, last tag), for stalls
    replies: list[tuple[int, list, int]] = field(default_factory=list)  # in flight: (rank, requests, bytes)

    def __post_init__(self) -> None:
        self.server_log = self.run.writer("server", self.log_lines[0])
        self.client_log = self.run.writer("clients", self.log_lines[1])
        self.buffer = np.empty(self.store.size, np.float32)  # pushes, as float32
        compressed = self.codec.wire != np.float32
        self.wire = np.empty(self.store.size, self.codec.wire) if compressed else self.buffer  # as they come
        if self.tally is None:
            self.tally = ServerTally(len(self.client_ranks))
            self.run.save_snapshot(self.weights(), self.store.version, 0.0, 0)

    def client(self, rank: int) -> int:
        return self.client_ranks.index(rank)

    def weights(self) -> np.ndarray:
        """The whole weight vector: this server's, or with sharded servers, every slice."""
        return self.store.weights if self.gather is None else self.gather(self.store.weights)

    @property
    def waiting(self) -> list[int]:
        """Client ranks still expected to send something."""
        return [r for r in self.client_ranks if r not in self.tally.stops and r not in self.tally.lost]

    @property
    def done(self) -> bool:
        return not self.waiting

    def checkpoint(self) -> None:
        """Weights, rule and tallies, with the time and log lengths they correspond to."""
        t = self.tally
        Checkpoint(self.weights(), self.store.version, self.clock(), (self.server_log.lines, self.client_log.lines),
                   (t.minibatches, t.samples, t.rejected), t.client_steps, t.client_pushes,
                   self.store.state()).save(self.run)

    def close(self) -> None:
        self.server_log.close()
        self.client_log.close()


def serve(s: Serving) -> ServerTally:
    """Handle messages until every client has stopped or is lost."""
    s.heard.update({r: (s.clock(), "none") for r in s.client_ranks})
    try:
        while not s.done:
            try:
                _serve_one(s)
            except ClientLost as lost:
                if lost.named:
                    raise
                _lose(s, lost)
        _flush_replies(s)
    finally:
        s.close()
    s.run.save_snapshot(s.weights(), s.store.version, s.clock(), s.tally.minibatches)
    return s.tally


def _serve_one(s: Serving) -> None:
    msg = _next_message(s)
    s.heard[msg.source] = (s.clock(), _tag_name(msg.tag))
    start = time.perf_counter()
    try:
        handle(s, msg)
        s.busy_s += time.perf_counter() - start
    except PeerTimeout:  # it stopped sending halfway
        raise _stalled(s, msg.source) from None
    except PeerDied as died:  # it died in the middle of a transfer
        raise ClientDied(msg.source, str(died)) from None


def _next_message(s: Serving) -> Message:
    """Waits no longer than the first waiting client's stall deadline, and checks it even
    while other clients keep the server busy."""
    while True:
        first = min(s.waiting, key=lambda r: s.heard[r][0])
        left = s.heard[first][0] + s.stall_timeout - s.clock()
        if left <= 0:
            raise _stalled(s, first)
        # Replies in flight move only while we call into MPI: poll closely while they should.
        in_flight = sum(nbytes for _, _, nbytes in s.replies)
        try:
            return s.transport.recv(timeout=left, busy=1e-3 + in_flight / 1e9)
        except PeerTimeout:
            continue
        except PeerDied as died:
            clients = [r for r in died.ranks if r in s.waiting]
            if clients:
                raise ClientDied(clients[0], str(died)) from None


def _reply(s: Serving, rank: int, header: Weights, data: np.ndarray) -> None:
    """Start sending the weights and go on serving: the transfer completes while we take
    the next message (waiting for it here would leave the server idle until the client
    is scheduled, half its time on a crowded machine). `data` may be the live weights,
    so every reply in flight is finished before the next apply (`_flush_replies`)."""
    s.replies.append((rank, s.transport.post(rank, Tag.WEIGHTS, header, data), data.nbytes))
    s.wire_bytes[1] += data.nbytes


def _flush_replies(s: Serving) -> None:
    """Finish every reply in flight; a client that does not take its reply within the
    stall timeout, or died, is lost (and the others' replies still finish)."""
    replies, s.replies = s.replies, []
    for rank, requests, nbytes in replies:
        if rank in s.tally.lost:
            continue
        try:
            s.transport.complete(requests, [rank], nbytes, s.stall_timeout)
        except PeerTimeout:
            _lose(s, _stalled(s, rank))
        except PeerDied as died:
            _lose(s, ClientDied(rank, str(died)))


def _tag_name(tag: int) -> str:
    try:
        return Tag(tag).name
    except ValueError:
        return f"unknown tag {tag}"


def _stalled(s: Serving, rank: int) -> ClientStalled:
    return ClientStalled(rank, f"silent for {s.clock() - s.heard[rank][0]:.0f} s "
                               f"(stall timeout {s.stall_timeout:g} s)")


def _lose(s: Serving, lost: ClientLost) -> None:
    """Name the client in the log; end the job, or (continue) go on without it."""
    if lost.rank in s.tally.lost:  # a late word of a client already written off
        return
    client = s.client(lost.rank)
    step = int(s.tally.client_steps[client])
    what = (f"client {client} (rank {lost.rank}, host {s.hosts.get(lost.rank, '?')}) lost: {lost}; "
            f"last step {step}, last message {s.heard[lost.rank][1]}")
    s.server_log.write({"time": s.clock(), "client": client, "rank": lost.rank, "lost": what,
                        "kind": type(lost).__name__})
    if s.on_client_failure != "continue":
        raise type(lost)(lost.rank, what, named=True)
    s.tally.lost[lost.rank] = {"client": client, "rank": lost.rank, "last_step": step,
                               "reason": f"{type(lost).__name__}: {lost}"}
    print(f"asgd: {what}; continuing with {len(s.waiting)} client(s)", file=sys.stderr, flush=True)


def handle(s: Serving, msg: Message) -> None:
    """One message: the whole of the server's reaction to it, replies included."""
    if msg.source in s.peers and msg.tag == Tag.PULL:  # server 0 reads this slice for a snapshot
        s.transport.send(msg.source, Tag.WEIGHTS, Weights(s.store.version, s.store.size), s.store.weights,
                         s.stall_timeout)
        return
    problem = _message_problem(s, msg)
    if problem:
        if msg.tag == Tag.PUSH and isinstance(msg.header, Push):
            s.transport.recv_payload(msg.source, s.wire, s.stall_timeout)  # drain, then drop
        _reject(s, msg.source, problem)
    elif msg.tag == Tag.FAIL:
        raise ClientFailed(msg.source, f"failed: {msg.header.reason}")
    elif msg.tag == Tag.STOP:
        s.tally.stops[msg.source] = msg.header
    elif msg.tag == Tag.PUSH:
        _apply_push(s, msg)
    if msg.tag in (Tag.PULL, Tag.PUSH) and not problem and (msg.tag == Tag.PULL or msg.header.fetch):
        weights, version = s.store.pull(s.client(msg.source))
        _reply(s, msg.source, Weights(version, weights.size), s.codec.encode(weights))


def _message_problem(s: Serving, msg: Message) -> str:
    if msg.source not in s.client_ranks:
        return f"message tag {msg.tag} from rank {msg.source}, which is not a client"
    if msg.source in s.tally.stops:
        return f"message tag {msg.tag} from rank {msg.source} after its STOP"
    if msg.source in s.tally.lost:
        return f"message tag {msg.tag} from rank {msg.source}, a client lost before"
    if msg.tag not in FROM_CLIENTS:
        return f"message tag {_tag_name(msg.tag)} is not one a client sends"
    if not well_formed(msg.tag, msg.header):
        return f"malformed message: tag {msg.tag} with header {type(msg.header).__name__}"
    return ""


def _apply_push(s: Serving, msg: Message) -> None:
    header: Push = msg.header
    client = s.client(msg.source)
    payload = s.transport.recv_payload(msg.source, s.wire, s.stall_timeout)
    s.wire_bytes[0] += payload.nbytes
    pulled = s.store.pulled.get(client, 0)
    start = time.perf_counter()
    if header.dtype != s.codec.dtype or payload.dtype != s.codec.wire or header.size != s.store.size:
        reason = (f"payload of {payload.nbytes} bytes as {header.size} {header.dtype}, "
                  f"expected {s.store.size} {s.codec.dtype}")
        result = ApplyResult(False, s.store.version, s.store.version - pulled, reason)
    else:
        _flush_replies(s)  # replies in flight may be reading the weights
        result = s.store.apply(client, s.codec.decode(payload, s.buffer))
    apply_s = time.perf_counter() - start if s.apply_cost is None else s.apply_cost
    if result.accepted:
        s.server_log.write({"time": s.clock(), "client": client, "version": result.version,
                            "staleness": result.staleness, "apply_s": apply_s})
    else:
        _reject(s, msg.source, result.reason)
    _log_client_rows(s, client, header, pulled, result)
    if result.accepted and s.eval_every and result.version % s.eval_every == 0:
        s.run.save_snapshot(s.weights(), result.version, s.clock(), s.tally.minibatches)
        s.checkpoint()
    if s.fault_version is not None and result.version >= s.fault_version:
        raise InjectedFault(f"injected fault on the server at version {result.version}")


def _log_client_rows(s: Serving, client: int, header: Push, pulled: int, result: ApplyResult) -> None:
    """The window's rows (the client ran them, applied or not); the last one carries the
    sync point's version and staleness, or why its push was rejected."""
    rows = [dict(r) for r in header.rows]
    s.tally.client_steps[client] = header.step
    s.tally.client_pushes[client] += 1
    if rows:
        sync = {"version_pulled": pulled, "staleness": result.staleness}
        rows[-1].update(sync if result.accepted else {**sync, "rejected": result.reason})
        s.client_log.write_many(rows)
    s.tally.minibatches += len(rows)
    s.tally.samples += sum(r.get("samples", 0) for r in rows)
    s.progress(s.tally.minibatches)


def _reject(s: Serving, rank: int, reason: str) -> None:
    client = s.client(rank) if rank in s.client_ranks else None
    s.tally.rejected += 1
    s.server_log.write({"time": s.clock(), "client": client, "rank": rank, "rejected": reason})
