"""The client's training loop and its sync points, and the MPI driver around it.

    pull -> [step ... step] -> push (+ fetch) -> [step ...] -> ... -> STOP

A push goes every `n_push` minibatches and at the last one (so no work is lost), a
fetch every `n_fetch` minibatches before the last. The minibatch rows travel inside
the push, to be written by the server's rank. `ClientLoop` is the loop itself, cut at
the points where the client talks to the server; `run_client` drives it over MPI and
the simulator drives the same object from its event queue.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from clients.client import Client
from paramserver.compress import ErrorFeedback, make_codec
from paramserver.config import InjectedFault
from paramserver.protocol import Pull, Push, Stop, Tag, shard_bounds
from paramserver.transport import Transport


@dataclass(frozen=True)
class ClientPlan:
    index: int             # client number, 0..K-1 (rows carry it)
    steps: int
    n_push: int
    n_fetch: int
    timeout: float         # longest wait for the server's reply
    servers: tuple[int, ...] = (0,)  # server ranks, in the order of their slices
    fault_step: int | None = None
    compress: str = "none"  # pushes and pulls on the wire (paramserver/compress.py)


@dataclass(frozen=True)
class Outgoing:
    tag: Tag
    header: Any
    payload: np.ndarray | None = None


@dataclass
class ClientLoop:
    """The loop of one client, advanced one communication point at a time."""

    client: Client
    plan: ClientPlan
    clock: Callable[[], float]    # read once after each minibatch, for its row
    step: int = 0
    pushes: int = 0
    done: bool = False
    rows: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.codec = make_codec(self.plan.compress)
        compressed = self.plan.compress != "none"
        self.feedback = ErrorFeedback(self.codec, self.client.size) if compressed else None
        # where pulled weights land, as they come over the wire
        self.wire = np.empty(self.client.size, self.codec.wire) if compressed else self.client.incoming

    def take_weights(self, data: np.ndarray) -> None:
        """The server's weights, as they came over the wire."""
        self.client.sync(self.codec.decode(data, self.client.incoming))

    def advance(self) -> tuple[Outgoing, bool]:
        """Train up to the next sync point: (the message to send, whether weights come back)."""
        plan = self.plan
        while self.step < plan.steps:
            self.step += 1
            result = self.client.step()
            self.rows.append({"client": plan.index, "step": self.step, "time": self.clock(),
                              "loss": result.loss, "error": result.error, "samples": result.samples})
            if self.step == plan.fault_step:
                raise InjectedFault(f"injected fault on client {plan.index} at step {self.step}")
            last = self.step == plan.steps
            fetch = self.step % plan.n_fetch == 0 and not last
            if self.step % plan.n_push == 0 or last:
                return self._push(fetch), fetch
            if fetch:
                return Outgoing(Tag.PULL, Pull()), True
        self.done = True
        return Outgoing(Tag.STOP, Stop(self.step, self.pushes)), False

    def _push(self, fetch: bool) -> Outgoing:
        push = self.client.take_push()
        if self.feedback is not None:
            push = self.feedback.encode(push)
        header = Push(self.step, push.size, fetch, self.codec.dtype, rows=tuple(self.rows))
        self.rows, self.pushes = [], self.pushes + 1
        return Outgoing(Tag.PUSH, header, push)


def run_client(transport: Transport, client: Client, plan: ClientPlan,
               clock: Callable[[], float], start: tuple[int, int] = (0, 0)) -> int:
    """Train up to `plan.steps` minibatches over MPI, from `start` = (step, pushes so far,
    after a resume); returns the number of pushes sent in all."""
    loop = ClientLoop(client, plan, clock, *start)
    link = ServerLink(transport, plan.servers, shard_bounds(client.size, len(plan.servers)), plan.timeout)
    link.exchange(Outgoing(Tag.PULL, Pull()), loop.wire)
    loop.take_weights(loop.wire)
    while not loop.done:
        message, fetch = loop.advance()
        link.exchange(message, loop.wire if fetch else None)
        if fetch:
            loop.take_weights(loop.wire)
    return loop.pushes


class ServerLink:
    """The client's end of the wire: each message goes to every server, a push carrying
    each server its own slice (and its rows to server 0 only); weights come back as
    slices into one vector. (Server 0 reads the other servers' slices through one too.)

    The receives for the weights are posted before the message goes out, so a server's
    reply completes even while this client still waits on another server: with sharded
    servers, a server blocked on its reply to us while we wait for a server that waits
    for it would be a deadlock."""

    def __init__(self, transport: Transport, servers: tuple[int, ...], bounds: list[tuple[int, int]],
                 timeout: float):
        self.transport, self.servers, self.bounds, self.timeout = transport, servers, bounds, timeout

    def exchange(self, message: Outgoing, into: np.ndarray | None) -> None:
        """Send `message`; with `into`, the servers' weights come back into it."""
        slices = [] if into is None else [into[lo:hi] for lo, hi in self.bounds]
        replies = self.transport.expect_payloads(list(self.servers), slices)
        self.transport.send_many([(server, message.tag, _sliced(message.header, i, lo, hi),
                                   None if message.payload is None else message.payload[lo:hi])
                                  for i, (server, (lo, hi)) in enumerate(zip(self.servers, self.bounds))],
                                 self.timeout)
        if into is None:
            return
        # They come as soon as the servers have taken our push, applied it and sent the
        # weights back: about three passes over the bytes, unless they are busy with
        # others; so we watch for them closely that long.
        busy = 0.01 + 3 * into.itemsize * max(hi - lo for lo, hi in self.bounds) / 1e9
        for server in self.servers:
            self.transport.recv(self.timeout, source=server, tag=Tag.WEIGHTS, busy=busy)
        self.transport.complete(replies, list(self.servers), into.nbytes, self.timeout)


def _sliced(header: Any, server: int, lo: int, hi: int) -> Any:
    """The header server number `server` gets: a push's says its slice's size, and only
    server 0 (which writes the run's logs) gets the rows."""
    if not isinstance(header, Push):
        return header
    return replace(header, size=hi - lo, rows=header.rows if server == 0 else ())
