"""The client's training loop and its sync points, and the MPI driver around it.

    pull -> [step ... step] -> push (+ fetch) -> [step ...] -> ... -> STOP

A push goes every `n_push` minibatches and at the last one (so no work is lost), a
fetch every `n_fetch` minibatches before the last. The minibatch rows travel inside
the push, to be written by the server's rank. `ClientLoop` is the loop itself, cut at
the points where the client talks to the server; `run_client` drives it over MPI and
the simulator drives the same object from its event queue.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from clients.client import Client
from paramserver.compress import ErrorFeedback, make_codec
from paramserver.config import InjectedFault
from paramserver.protocol import Pull, Push, Stop, Tag
from paramserver.transport import Transport


@dataclass(frozen=True)
class ClientPlan:
    index: int             # client number, 0..K-1 (rows carry it)
    steps: int
    n_push: int
    n_fetch: int
    timeout: float         # longest wait for the server's reply
    server: int = 0
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
    transport.send(plan.server, Tag.PULL, Pull(), timeout=plan.timeout)
    loop.take_weights(_receive_weights(transport, loop))
    while not loop.done:
        message, fetch = loop.advance()
        transport.send(plan.server, message.tag, message.header, message.payload, plan.timeout)
        if fetch:
            loop.take_weights(_receive_weights(transport, loop))
    return loop.pushes


def _receive_weights(transport: Transport, loop: ClientLoop) -> np.ndarray:
    plan = loop.plan
    # The reply comes as soon as the server has taken our push, applied it and sent the
    # weights back: about three passes over the bytes, unless it is busy with others.
    transport.recv(plan.timeout, source=plan.server, tag=Tag.WEIGHTS, busy=0.01 + 3 * loop.wire.nbytes / 1e9)
    return transport.recv_payload(plan.server, loop.wire, plan.timeout)
