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
from paramserver.compute.quantkernel import make_codec
from paramserver.wire import frame
from paramserver.wire.compress import ErrorFeedback
from paramserver.faults import Fault, fault_on
from runconfig.settings import RunConfig
from paramserver.wire.protocol import (Outgoing, Pull, Push, Rejoin, State, Stop, Tag, Weights, fragment_pieces,
                                       shard_bounds)


@dataclass(frozen=True)
class PlanSettings:
    """What the clients' plans read of the config, for a run of `clients` clients: built
    once by `from_config` where either backend starts its clients (experiments/rank/entry.py,
    experiments/sim/simulator.py), then each client's plan is `ClientPlan.for_run`.

    `steps`: the most minibatches one client may compute; `timeout`: the longest wait for
    a reply, twice the server's stall timeout: when one client stalls, the server (which
    names it) must give up before the others blame the busy server; `inject_fault` and
    `on_client_failure`: the faults the clients take (paramserver/faults.py);
    `stragglers`, `failures`: the run's (the simulator's clocks read them too)."""

    steps: int
    n_push: int
    n_fetch: int
    timeout: float
    inject_fault: str
    on_client_failure: str
    compress: str
    compress_pulls: bool
    stragglers: Stragglers
    failures: Failures | None
    dylu: bool
    fragments: int

    @classmethod
    def from_config(cls, cfg: RunConfig, clients: int) -> PlanSettings:
        stragglers = Stragglers.for_run(cfg, clients)
        return cls(steps=cfg.client_steps(clients), n_push=cfg.push_every, n_fetch=cfg.fetch_every,
                   timeout=2 * cfg.stall_timeout, inject_fault=cfg.inject_fault,
                   on_client_failure=cfg.on_client_failure, compress=cfg.compress,
                   compress_pulls=cfg.compress_pulls, stragglers=stragglers,
                   failures=Failures.for_run(cfg, stragglers), dylu=cfg.dylu, fragments=cfg.fragments)


@dataclass(frozen=True)
class ClientPlan:
    index: int             # client number, 0..K-1 (rows carry it)
    steps: int
    n_push: int
    n_fetch: int
    timeout: float         # longest wait for the server's reply
    servers: tuple[int, ...] = (0,)  # server ranks, in the order of their slices
    fault: Fault | None = None
    compress: str = "none"  # pushes on the wire (paramserver/wire/compress.py)
    compress_pulls: bool = False  # the weights replies too
    stragglers: Stragglers | None = None  # slept after each minibatch (MPI); the simulator's clock has them
    failures: Failures | None = None
    dylu: bool = False     # the server's replies set each window (n_push == n_fetch: each push fetches)
    fragments: int = 1     # streamed fragments: a push is P slices, one every n_push / P minibatches

    @classmethod
    def for_run(cls, settings: PlanSettings, index: int, servers: int = 1, real_time: bool = True) -> ClientPlan:
        """Client `index`'s plan, for both backends. In `real_time` (MPI) the client sleeps
        the straggler model and fails where `inject_fault` says; the simulator's clock has
        the stragglers instead, and its clients fail where `inject_fault` says only under
        `continue` (the client dies; the run goes on without it, as over MPI)."""
        faults = real_time or settings.on_client_failure == "continue"
        fault = fault_on(settings.inject_fault, index + servers, f"client {index}", "step") if faults else None
        stragglers = settings.stragglers
        return cls(index=index, steps=settings.steps, n_push=settings.n_push, n_fetch=settings.n_fetch,
                   timeout=settings.timeout, servers=tuple(range(servers)), fault=fault,
                   compress=settings.compress, compress_pulls=settings.compress_pulls,
                   stragglers=stragglers if real_time and stragglers.active else None,
                   failures=settings.failures, dylu=settings.dylu, fragments=settings.fragments)


@dataclass
class BusyTime:
    """A client's minibatches' seconds, and the span from its first one's start to its
    last one's end: their ratio is how much of its time the server and the link left it
    computing (the rest it waited, or was down). A real client times them on the wall
    clock; the simulator's clock keeps one in virtual seconds (StepClock)."""

    first: float | None = None
    last: float = 0.0
    computed: float = 0.0

    def add(self, start: float, end: float) -> None:
        self.first = start if self.first is None else self.first
        self.computed += end - start
        self.last = end

    @property
    def span(self) -> float:
        return 0.0 if self.first is None else self.last - self.first


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
    pushed_bytes: int = 0         # the push frames' bytes, to every server (STOP tells the server)
    pulled_bytes: int = 0         # the weights frames' bytes, from every server
    down: Callable[[float], float] | None = None  # (base times) -> seconds down; None: `sleep_down` (MPI)
    busy: BusyTime | None = None  # the simulator's clock's; None: timed here, on the wall clock (MPI)
    window: int = field(init=False)      # minibatches from one push to the next: n_push, or DyLU's
    pushed_at: int = field(init=False)   # the step of the last push (or the first step)
    in_flight: int = 0            # streamed fragments pushed whose slice of the weights has not come back
    fragment_landings: dict[int, list[np.ndarray]] = field(default_factory=dict)  # see `landing_for`

    def __post_init__(self) -> None:
        self.window, self.pushed_at = self.plan.n_push, self.step
        self.timed = self.busy is None
        self.busy = BusyTime() if self.busy is None else self.busy
        self.codec = make_codec(self.plan.compress)
        self.pull_codec = make_codec(self.plan.compress if self.plan.compress_pulls else "none")
        compressed = self.plan.compress != "none"
        # Updates keep what the codec dropped for the next push; weights (EASGD) are
        # rounded afresh each time, the error bounded by the codec's and never summed.
        updates = self.client.pushes != "weights"
        self.feedback = ErrorFeedback(self.codec, self.client.size) if compressed and updates else None
        # where pulled weights land, as they come over the wire
        self.landing = np.empty(self.pull_codec.wire_size(self.client.size), self.pull_codec.wire_dtype) \
            if self.plan.compress_pulls else self.client.incoming
        # the fragments' slices: the sharded servers' split, on the codec's blocks (each encodes alone),
        # and each fragment cut at the servers' own slices (`shards`), a piece to each server
        self.pieces = shard_bounds(self.client.size, self.plan.fragments, self.codec.block) \
            if self.plan.fragments > 1 else []
        self.shards = shard_bounds(self.client.size, len(self.plan.servers), self.codec.block)
        self.cuts = [fragment_pieces(piece, self.shards) for piece in self.pieces]

    @property
    def behind(self) -> bool:
        """Whether a streamed fragment older than the last one pushed has not come back:
        the client waits for it before it trains on (each is merged within n_push / P)."""
        return self.in_flight > 1

    def landing_for(self, fragment: int) -> list[np.ndarray]:
        """Where streamed fragment `fragment`'s answer lands as it comes over the wire (MPI):
        a framed vector of its own for each server's piece (empty where the fragment misses
        that server), each received in place, so no two answers in flight share bytes, not
        even a staging block (made at first use: the simulator hands over its payloads)."""
        if fragment not in self.fragment_landings:
            self.fragment_landings[fragment] = [frame.empty(hi - lo, self.pull_codec.wire_dtype) for lo, hi in
                                                self.pull_codec.wire_bounds([cut[1:] for cut in self.cuts[fragment]])]
        return self.fragment_landings[fragment]

    def fragment_wire(self) -> list[list[tuple[int, int, int]]]:
        """Each fragment's pieces as a push carries them to each server: (its offset in that
        server's slice, in float32 elements; its start and stop in the push's encoding)."""
        return [[(offset, *self.codec.wire_bounds([(start, stop)])[0]) for offset, start, stop in cut]
                for cut in self.cuts]

    def take_weights(self, data: np.ndarray, reply: Weights | None = None) -> None:
        """The server's weights, as they came over the wire, at the progress its `reply`
        says; a reply saying stop (the run reached its target) ends the loop here. A
        streamed fragment's reply is its slice, merged keeping the work done meanwhile."""
        lo, hi = 0, self.client.size
        if reply is not None and reply.fragment >= 0:
            (lo, hi), self.in_flight = self.pieces[reply.fragment], self.in_flight - 1
        self.client.sync(self.pull_codec.decode(data, self.client.incoming[lo:hi]), reply.samples if reply else None,
                         lo)
        self.pulled_bytes += len(self.plan.servers) * frame.HEADER_BYTES + data.nbytes
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
            if self.timed:  # the straggler's sleep is its slower hardware's compute
                self.busy.add(start, time.perf_counter())
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
        # told to stop between pushes: the work done goes to the server first, all of it
        # (with fragments, the other slices' since their last fragment, even where no row waits)
        if self.rows or self.pieces and self.client.unpushed_steps:
            return self._push(False), False
        self.done = True
        return Outgoing(Tag.STOP, Stop(self.step, self.pushes, self.pushed_bytes, self.pulled_bytes,
                                       float(self.busy.computed), float(self.busy.span))), False

    def _failed(self, compute: float) -> Outgoing:
        """The client failed after this minibatch: its work since the last push is lost
        (its rows say `lost`, the last one `failed` and the seconds it was down); it
        restarts afresh and pulls the server's weights."""
        self.client.restart()
        if self.feedback is not None:  # the codec's carried error died with the process
            self.feedback = ErrorFeedback(self.codec, self.client.size)
        lost = [{**row, "lost": True} for row in self.rows]
        length = self.plan.failures.length
        lost[-1].update(failed=True, down_s=sleep_down(length, compute) if self.down is None else self.down(length))
        self.rows, self.pushed_at = [], self.step  # a window starts afresh
        return Outgoing(Tag.PULL, Rejoin(self.step, tuple(lost)))

    def _sync_point(self) -> tuple[bool, bool]:
        """Whether the minibatch just run ends with a push, and whether with a fetch."""
        plan, last = self.plan, self.step == self.plan.steps
        if plan.dylu:  # the window the last reply gave; every push but the last fetches the next
            push = self.step - self.pushed_at >= self.window or last
            return push, push and not last
        if self.pieces:  # a fragment every n_push / P minibatches, each fetching its slice back
            push = self.step % (plan.n_push // plan.fragments) == 0 or last
            return push, push and not last
        return self.step % plan.n_push == 0 or last, self.step % plan.n_fetch == 0 and not last

    def _push(self, fetch: bool) -> Outgoing:
        """The push due now: with streamed fragments each one that fetches is the next
        fragment (p = the fragment windows run, less one, mod P), the last push (or one
        a stop brings) everything not pushed yet; else the whole work since the last."""
        fragment, lo = -1, 0
        if self.pieces and fetch:
            fragment = (self.step // (self.plan.n_push // self.plan.fragments) - 1) % self.plan.fragments
            lo, hi = self.pieces[fragment]
            push, self.in_flight = self.client.take_fragment(lo, hi), self.in_flight + 1
        else:
            push = self.client.take_push()
        push = self.codec.encode(push) if self.feedback is None else self.feedback.encode(push, lo)
        header = Push(self.step, push.size, fetch, self.codec.dtype, rows=tuple(self.rows), fragment=fragment,
                      offset=lo)
        # a frame to each server, the rows to server 0 alone (paramserver/wire/fanout.py)
        self.pushed_bytes += frame.nbytes(header, push) + (len(self.plan.servers) - 1) * frame.HEADER_BYTES
        self.rows, self.pushes, self.pushed_at = [], self.pushes + 1, self.step
        return Outgoing(Tag.PUSH, header, push)
