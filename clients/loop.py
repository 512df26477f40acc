"""The client's training loop, cut at its sync points; no MPI inside.

    pull -> [step ... step] -> push (+ fetch) -> [step ...] -> ... -> STOP

A push goes every `n_push` minibatches and at the last one (so no work is lost), a
fetch every `n_fetch` minibatches before the last. With DyLU (`ClientPlan.dylu`) a push
goes once the window the server's last reply gave has run since the previous push, and
every push but the last fetches (paramserver/reply/dylu.py). A client that fails (`failures`,
clients/stragglers.py) loses the minibatches since its last push, is down for a while
(`down`: a sleep under MPI, virtual time in the simulator) and pulls again, its lost
rows riding in that PULL (`Rejoin`) so the server logs them. The minibatch rows travel inside
the push, to be written by the server's rank. `ClientLoop.advance()` trains up to the
next point where the client talks to the server and returns the message to send;
`clients/driver.py` moves those messages over a link (MPI), the simulator through its
event queue, and the tests call it directly.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from clients.client import Client
from clients.stragglers import Failures, Stragglers
from runconfig.settings import Fault
from paramserver.wire.compress import ErrorFeedback, make_codec
from paramserver.wire.protocol import Outgoing, Pull, Push, Rejoin, State, Stop, Tag, Weights


@dataclass(frozen=True)
class ClientPlan:
    index: int             # client number, 0..K-1 (rows carry it)
    steps: int
    n_push: int
    n_fetch: int
    timeout: float         # longest wait for the server's reply
    servers: tuple[int, ...] = (0,)  # server ranks, in the order of their slices
    fault: Fault | None = None
    compress: str = "none"  # pushes and pulls on the wire (paramserver/wire/compress.py)
    stragglers: Stragglers | None = None  # slept after each minibatch (MPI); the simulator's clock has them
    failures: Failures | None = None
    dylu: bool = False     # the server's replies set each window (n_push == n_fetch: each push fetches)


def sleep_down(length: float, compute: float) -> float:
    """A real client's outage: `length` base minibatch times, the base time being what its
    failing minibatch took to compute; returns the seconds slept."""
    seconds = length * compute
    time.sleep(seconds)
    return seconds


@dataclass
class ClientLoop:
    """The loop of one client, advanced one communication point at a time."""

    client: Client
    plan: ClientPlan
    clock: Callable[[], float]    # read once after each minibatch, for its row
    step: int = 0
    pushes: int = 0
    done: bool = False
    stopping: bool = False        # the server said the run reached its target
    state_due: bool = False       # the server asks for the optimizer's state: a checkpoint is due
    rows: list[dict] = field(default_factory=list)
    down: Callable[[float, float], float] = sleep_down  # (base times, compute s) -> seconds down
    window: int = field(init=False)      # minibatches from one push to the next: n_push, or DyLU's
    pushed_at: int = field(init=False)   # the step of the last push (or the first step)

    def __post_init__(self) -> None:
        self.window, self.pushed_at = self.plan.n_push, self.step
        self.codec = make_codec(self.plan.compress)
        compressed = self.plan.compress != "none"
        # Updates keep what the codec dropped for the next push; weights (EASGD) are
        # rounded afresh each time, the error bounded by the codec's and never summed.
        updates = self.client.pushes != "weights"
        self.feedback = ErrorFeedback(self.codec, self.client.size) if compressed and updates else None
        # where pulled weights land, as they come over the wire
        self.landing = np.empty(self.client.size, self.codec.wire_dtype) if compressed else self.client.incoming

    def take_weights(self, data: np.ndarray, reply: Weights | None = None) -> None:
        """The server's weights, as they came over the wire, at the progress its `reply`
        says; a reply saying stop (the run reached its target) ends the loop here."""
        self.client.sync(self.codec.decode(data, self.client.incoming), reply.samples if reply else None)
        self.stopping = self.stopping or (reply is not None and reply.stop)
        self.state_due = reply is not None and reply.state
        if reply is not None and reply.window:
            self.window = reply.window

    def state_before(self, message: Outgoing) -> Outgoing | None:
        """The optimizer's state, for server 0 just before `message` (MPI keeps one
        sender's messages in order): before a push while the server asks for it, and
        before STOP, where the optimizer keeps any."""
        wanted = message.tag == Tag.STOP or message.tag == Tag.PUSH and self.state_due
        if not wanted or not self.client.replica.optimizer.keeps_state:
            return None
        return Outgoing(Tag.STATE, State(self.step, self.client.optimizer.state_arrays()))

    def advance(self) -> tuple[Outgoing, bool]:
        """Train up to the next sync point: (the message to send, whether weights come back)."""
        plan = self.plan
        while self.step < plan.steps and not self.stopping:
            self.step += 1
            start = time.perf_counter()
            result = self.client.step()
            compute = time.perf_counter() - start
            if plan.stragglers is not None:
                plan.stragglers.sleep_after(plan.index, self.step, compute)
            self.rows.append(result.row(plan.index, self.step, self.clock()))
            if plan.fault is not None:
                plan.fault.strike(self.step)
            if plan.failures is not None and plan.failures.fails(plan.index, self.step):
                return self._failed(compute), True
            push, fetch = self._sync_point()
            if push:
                return self._push(fetch), fetch
            if fetch:
                return Outgoing(Tag.PULL, Pull()), True
        if self.rows:  # told to stop between pushes: the work done goes to the server first
            return self._push(False), False
        self.done = True
        return Outgoing(Tag.STOP, Stop(self.step, self.pushes)), False

    def _failed(self, compute: float) -> Outgoing:
        """The client failed after this minibatch: its work since the last push is lost
        (its rows say `lost`, the last one `failed` and the seconds it was down); it
        restarts afresh and pulls the server's weights."""
        self.client.restart()
        if self.feedback is not None:  # the codec's carried error died with the process
            self.feedback = ErrorFeedback(self.codec, self.client.size)
        lost = [{**row, "lost": True} for row in self.rows]
        lost[-1].update(failed=True, down_s=self.down(self.plan.failures.length, compute))
        self.rows, self.pushed_at = [], self.step  # a window starts afresh
        return Outgoing(Tag.PULL, Rejoin(self.step, tuple(lost)))

    def _sync_point(self) -> tuple[bool, bool]:
        """Whether the minibatch just run ends with a push, and whether with a fetch."""
        plan, last = self.plan, self.step == self.plan.steps
        if plan.dylu:  # the window the last reply gave; every push but the last fetches the next
            push = self.step - self.pushed_at >= self.window or last
            return push, push and not last
        return self.step % plan.n_push == 0 or last, self.step % plan.n_fetch == 0 and not last

    def _push(self, fetch: bool) -> Outgoing:
        push = self.client.take_push()
        push = self.codec.encode(push) if self.feedback is None else self.feedback.encode(push)
        header = Push(self.step, push.size, fetch, self.codec.dtype, rows=tuple(self.rows))
        self.rows, self.pushes, self.pushed_at = [], self.pushes + 1, self.step
        return Outgoing(Tag.PUSH, header, push)
