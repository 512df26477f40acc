"""The simulator backend: the server and K clients in one process, on a virtual clock.

    asgd train --backend sim --clients 32 [CONFIG.toml] [flags]   (any --mode)

It runs the very code of an MPI run (the Store and `handle()` on the server side,
`Client` and `ClientLoop` on the client side) but moves messages through an event
queue instead of MPI, so 32 clients need neither 32 GPUs nor 32 cores, and a run is
reproducible: same seed and config (with the timings given, not measured), same bytes
in clients.jsonl and server.jsonl. The K clients share one model (`Replica`); each owns
only its flat vectors.

Time model: client i's minibatch takes `step_time * factor_i` (factor_i drawn once from
U(1-j, 1+j) by the seed), stretched per minibatch by the straggler model
(clients/stragglers.py: its speed, lognormal noise, slow clients, pauses; a failure
puts it down for `failure_length` of those base times); a message crosses the links on its
path (experiments/sim/links.py: by default `latency + bytes / bandwidth`); the server is
one queue: it handles one message at a time, a push costs it `apply_time` (by default
the real handler's measured time for a push: checks, apply, log rows), and sending a
reply occupies it for the reply's transfer. With `servers` S > 1 it stands for S sharded
servers: over MPI they handle every client message in server 0's order with its reply
decisions (paramserver/drivers/follow.py), so one server with the whole vector, deciding as
server 0, computes what they do, a push costing one server's
time for its slice (`apply_time`) and a reply a slice's transfer. It departs from MPI
only where a push is finite in one slice and not in another. A client that pushes
without fetching goes on once its push is sent. With `joins` (and `joinable`) a process
sends JOIN at its virtual time and, let in, trains as client K, K+1, ... (docs/joining.md);
under `on_client_failure = "continue"` a client dies where `inject_fault` says and the
server is told at once, as MPI tells it of a dead process; with `spares` the server then
admits a spare as over MPI, whose JOIN comes once the ADMIT and it crossed its link. `time` in the logs is this virtual time. A cost profile
(`sim_profile`, `PROFILES`) gives the costs not set: `measured` (this host and model)
or `paper` (the paper's model size, GPUs and network, so n_sync's trade-off between
communication and staleness shows even though the proxy model is small).
"""
from __future__ import annotations

import dataclasses
import functools
import heapq
import itertools
import os
import platform
import socket
from collections import defaultdict, deque
from typing import Any, Callable

import numpy as np
import torch

from clients.collective import Fate, Lockstep, LockstepFates, mean_in_place
from clients.devices import keep_freed_memory, pick_device
from clients.loop import BusyTime, ClientLoop, ClientPlan, PlanSettings
from clients.stragglers import Stragglers
from experiments.run.assemble import Parts, build, client_plan, join_client, start
from experiments.run.collectiverun import CollectiveSettings, collective_run
from experiments.run.provenance import provenance
from experiments.run.serverrun import ServerSettings, serve_run
from experiments.sim.costs import SimTiming, sized
from experiments.sim.links import Links
from experiments.sim.replay import replay_order
from paramserver.faults import InjectedFault
from runconfig.simchecks import parse_joins
from runconfig.settings import RunConfig
from paramserver import membership
from paramserver.drivers.inprocess import InProcess
from paramserver.wire.protocol import Join, Outgoing, Pull, Tag, Weights, Welcome
from rundir.modes import Mode


SIM_SECRET = "simulated"  # what the simulator's joiners show: its processes are its own


class StepClock:
    """A client's clock. ClientLoop reads it once per minibatch, so each read is one
    minibatch later than the last: `step_time`, or as the straggler model stretches
    client `client`'s minibatch number `step` (counted from `step`, its first)."""

    def __init__(self, step_time: float, stragglers: Stragglers | None = None, client: int = 0, step: int = 0):
        self.step_time, self.now = step_time, 0.0
        self.stragglers, self.client, self.step = stragglers, client, step
        self.busy = BusyTime()           # its minibatches' virtual seconds, and their span

    def __call__(self) -> float:
        self.step += 1
        took = self.stragglers.duration(self.client, self.step, self.step_time) if self.stragglers \
            else self.step_time
        self.busy.add(self.now, self.now + took)
        self.now += took
        return self.now

    def down(self, length: float) -> float:
        """The client failed: `length` of its base minibatch times pass (ClientLoop's `down`)."""
        self.now += length * self.step_time
        return length * self.step_time


class LockstepClock:
    """Virtual time of a sync or local-sgd run: each step waits for the slowest client it
    keeps (`LockstepFates` decides who is kept, fails or is down), and an average costs
    a ring allreduce (2(K-1)/K of the bytes, 2(K-1) latencies)."""

    def __init__(self, timing: SimTiming, weights: np.ndarray, lockstep: Lockstep, fates: LockstepFates):
        k = len(fates.indices)
        self.allreduce = 2 * (k - 1) * (timing.latency + timing.wire_bytes(weights) / k / timing.bandwidth)
        self.lockstep, self.fates, self.now = lockstep, fates, 0.0

    def away(self) -> list[bool]:
        """The `Away` of clients/collective.py: who is down as the step begins."""
        return self.fates.away(self.now)

    def straggle(self, step: int, compute_s: list[float | None]) -> list[Fate]:
        """The `Straggle` of clients/collective.py: the step's virtual time, and its fates."""
        durations = self.fates.durations(step, self.now)
        kept = self.fates.kept(durations)
        fates = self.fates.settle(step, self.now, kept, [s is None for s in compute_s])
        averaged = self.lockstep.averages(step)
        self.now += max(d for d, keep in zip(durations, kept) if keep) + (self.allreduce if averaged else 0.0)
        return fates

    def __call__(self) -> float:
        return self.now


# makes the client of a process let in by a Welcome: its loop and its clock
Joiner = Callable[[Welcome], tuple[ClientLoop, StepClock]]


class Simulation:
    """The event loop: who does what, when, in virtual seconds. `joins`: (virtual second,
    JOIN) a process sends to the server, whose Welcome `joiner` turns into a client.
    `spares`: spare ranks after the clients', on `host`, admitted as the server says."""

    def __init__(self, loops: list[ClientLoop | None], clocks: list[StepClock | None], timing: SimTiming,
                 start: float = 0.0, replay: list[tuple[Tag, int]] | None = None, links: Links | None = None,
                 joins: list[tuple[float, Join]] = (), joiner: Joiner | None = None, spares: int = 0, host: str = "",
                 first_rank: int = 1):
        self.loops, self.clocks, self.timing = loops, clocks, timing
        self.links = links or Links.uniform(timing.bandwidth, timing.latency, len(loops))
        self.joins, self.joiner, self.host = list(joins), joiner, host
        self.first_rank = first_rank      # the first client's rank: process i is rank first_rank + i
        for n in range(len(self.joins) + spares):  # a joiner stands on client (K + n) mod K's hardware: its link too
            self.links.add(like=(len(loops) + n) % len(loops))
        self.busy = 0.0                   # virtual seconds the server spent on messages
        self.events: list[tuple[float, int, str, int, Any]] = []
        self.tickets = itertools.count()  # ties resolve in scheduling order: deterministic
        self.server_free = start
        self.now = start                  # the server's clock, read by its Recorder
        self.replay = deque(replay) if replay is not None else None  # (tag, client), in recorded order
        self.parked: dict[tuple[Tag, int], deque[tuple[float, Outgoing]]] = defaultdict(deque)
        self.wake: float | None = None    # when the server is set to wake for a gathered step
        self.behind: set[int] = set()     # clients waiting for a streamed fragment's slice to come back
        self.arrivals: dict[int, float] = {}  # client -> when its last message reaches the server

    def run(self, server: InProcess) -> float:
        """Until every client stopped; returns the server's busy virtual seconds."""
        for i in range(len(self.loops)):
            if self.loops[i] is not None:  # after a resume, a client not restarted has none
                self._schedule(self.links.send(i, 0.0, self.now), "arrive", i, Outgoing(Tag.PULL, Pull()))
        for n, (at, join) in enumerate(self.joins):  # from ranks after the K clients', one a join
            i = len(self.loops) + n
            self._schedule(self.links.send(i, 0.0, max(at, self.now)), "join", i, join)
        while self.events:
            when, _, kind, i, item = heapq.heappop(self.events)
            self.links.forget(when)  # every transfer from now on is ready at `when` or later
            if kind == "arrive":      # a message reaches the server
                self._arrive(server, when, i, item)
            elif kind == "wake":      # the clients a gathered step waits for fall overdue, unless a message came first
                self._wake(server, when)
            elif kind == "join":      # a process asks to join: the server lets it in or not
                self._join(server, when, i, item)
            elif kind == "lost":      # the server learns client i died
                self.now = max(when, self.server_free)
                self._replied(server, server.lose(server.state.client_ranks[i], item))
                self._admit(server, i)
            elif kind == "reply":     # weights reach client i (a joiner's with its Welcome)
                self._reply(when, i, item)
            else:                     # client i trains on
                self._window(when, i)
            wake = server.state.reply.wake_at(server.state)  # as the MPI loop's timed wait: an event then, unless one is set
            if wake is not None and wake != self.wake:
                self.wake = wake
                self._schedule(wake, "wake", -1, None)
        if not server.state.done:
            raise RuntimeError("simulation: events ran out before every client stopped (replay order?)")
        return self.busy

    def _reply(self, when: float, i: int, reply: Any) -> None:
        """Weights reach client i, which trains on from here; but a streamed fragment's
        slice is merged into a client that went on computing, which trains on from here
        only where it waited for that very slice (`ClientLoop.behind`)."""
        header, loop = reply.header, self.loops[i]
        loop.take_weights(reply.payload, header.weights if isinstance(header, Welcome) else header)
        if not (isinstance(header, Weights) and header.fragment >= 0) or (i in self.behind and not loop.behind):
            self.behind.discard(i)
            self._window(when, i)

    def _sent(self, i: int, nbytes: float, at: float) -> float:
        """When client i's message of `nbytes` sent at `at` reaches the server: never before
        its last one, as MPI keeps one sender's messages in order (a STOP of headers alone
        would overtake the streamed fragment a client sent just before it)."""
        self.arrivals[i] = max(self.links.send(i, nbytes, at), self.arrivals.get(i, 0.0))
        return self.arrivals[i]

    def _schedule(self, when: float, kind: str, client: int, item: Any) -> None:
        heapq.heappush(self.events, (when, next(self.tickets), kind, client, item))

    def _arrive(self, server: InProcess, when: float, i: int, message: Outgoing) -> None:
        """With a replay order, pulls and pushes wait until the recorded order reaches them."""
        if self.replay is None or message.tag == Tag.STATE:  # a STATE waits for its push in the server
            self._serve(server, when, i, message)
            return
        self.parked[(message.tag, i)].append((when, message))
        while self.replay and self.parked[self.replay[0]]:
            tag, client = self.replay.popleft()
            waited, parked = self.parked[(tag, client)].popleft()
            self._serve(server, max(waited, self.now), client, parked)

    def _wake(self, server: InProcess, when: float) -> None:
        """The step goes without the overdue clients, as the MPI loop's timed wait takes it:
        once the server is free and has taken the messages that reached it meanwhile."""
        wake = server.state.reply.wake_at(server.state)
        if wake is None or wake > when:
            return
        if self.server_free > when:
            self._schedule(self.server_free, "wake", -1, None)
            return
        self.now = when
        self._replied(server, server.release())

    def _join(self, server: InProcess, when: float, i: int, join: Join) -> None:
        """A JOIN from a rank after the K clients' (`i`: K + its place among the joins): a
        Welcome makes it client `len(loops)`, which trains once the weights reach it."""
        self.now = max(when, self.server_free)
        replies = server.deliver(self.first_rank + i, Tag.JOIN, join)
        if replies:
            loop, clock = self.joiner(replies[0].header)
            self.loops.append(loop)
            self.clocks.append(clock)
        self._replied(server, replies)

    def _admit(self, server: InProcess, lost: int) -> None:
        """The spare the server admits in lost client `lost`'s place (paramserver/membership.py,
        as over MPI): its JOIN reaches the server once the ADMIT crossed its link and it
        sent that JOIN back (a spare's index among the processes: its rank less the first client's)."""
        admitted = membership.admit(server.state, lost)
        if admitted is not None:
            rank, admit = admitted
            i = rank - self.first_rank
            told = self.links.receive(i, 0.0, self.server_free)
            self._schedule(self.links.send(i, 0.0, told), "join", i, Join(admit.secret, self.host))

    def _serve(self, server: InProcess, when: float, i: int, message: Outgoing) -> None:
        self.now = max(when, self.server_free)
        replies = server.deliver(server.state.client_ranks[i], message.tag, message.header, message.payload)
        cost = 0.0
        if message.tag == Tag.PUSH:  # a streamed fragment is a slice: its share of an apply
            cost = self.timing.apply_time / (self.loops[i].plan.fragments if message.header.fragment >= 0 else 1)
        self._replied(server, replies, cost)

    def _replied(self, server: InProcess, replies: list, cost: float = 0.0) -> None:
        """The server, busy from now for `cost`, sends `replies` (to the sender, or to those a step waited for)."""
        busy_until = self.now + cost
        for reply in replies:
            sending, dest = busy_until, server.state.client(reply.dest)
            busy_until += self.timing.served(reply.payload)
            arrives = self.links.receive(dest, self.timing.wire_bytes(reply.payload), sending)
            self._schedule(max(busy_until, arrives), "reply", dest, reply)
        self.busy += busy_until - self.now
        self.server_free = busy_until

    def _window(self, when: float, i: int) -> None:
        """Client i trains from `when` up to its next sync point and sends its message."""
        loop, clock = self.loops[i], self.clocks[i]
        clock.now = when
        if loop.behind:  # the fragment before the one it just sent has not come back: it waits for it
            self.behind.add(i)
            return
        try:
            message, fetch = loop.advance()
        except InjectedFault as fault:  # it died (under continue): the server hears of it as MPI's would
            self._schedule(self.links.send(i, 0.0, clock.now), "lost", i, str(fault))
            return
        state = loop.state_before(message)
        if state is not None:  # it arrives before the message it precedes
            self._schedule(self._sent(i, 0.0, clock.now), "arrive", i, state)
        sent = self._sent(i, self.timing.wire_bytes(message.payload), clock.now)
        self._schedule(sent, "arrive", i, message)
        if message.tag == Tag.PUSH and message.header.fragment >= 0:  # sent without waiting: it computes on
            self._schedule(clock.now, "window", i, None)
        elif not fetch and not loop.done:
            self._schedule(sent, "window", i, None)


def run_sim(cfg: RunConfig, out: str, clients: int) -> int:
    """One simulated run into `out`; the same run directory as an MPI run."""
    order = replay_order(cfg, clients) if cfg.replay else None
    # Set every time, never inherited from what this process ran before (a run's last
    # evaluation takes every core): the same config gives the same floats; --threads as
    # an MPI run's gives that run's.
    torch.set_num_threads(cfg.threads or len(os.sched_getaffinity(0)))
    keep_freed_memory()
    device = pick_device(cfg.device)
    asked = cfg.servers
    parts = build(cfg, device, clients, list(range(clients)))
    cfg, timing = sized(parts.cfg, parts.local[0].replica, parts.dataset, parts.local[0].size, clients)
    parts = dataclasses.replace(parts, cfg=cfg)  # its steps, with epochs; its servers, where auto picked them
    factors = _speed_factors(cfg.seed, clients, cfg.speed_jitter)
    info = {"rank": 0, "role": "simulator", "host": socket.gethostname(), "device": device}
    prov = provenance(f"none (simulator, {platform.python_implementation()})", [info])
    prov["sim"] = {**timing.__dict__, "profile": cfg.sim_profile, "speed_factors": factors, "servers_asked": asked}
    started = start(parts, out, records=True, provenance=prov, warm_clock=StepClock(timing.step_time))
    setup, point = started.setup, started.point
    if cfg.mode != Mode.ASYNC:
        collective = CollectiveSettings.from_config(cfg, clients, list(range(clients)))
        fates = LockstepFates.for_run(collective.fates, list(range(clients)), [timing.step_time * f for f in factors])
        lockstep = LockstepClock(timing, setup.weights, collective.lockstep, fates)
        lockstep.now = point.time if point else 0.0
        return collective_run(setup, collective, parts.local, list(range(clients)), mean_in_place, lockstep,
                              gather=lambda rows: rows, straggle=lockstep.straggle, point=point, away=lockstep.away)
    plans = PlanSettings.from_config(cfg, clients)
    links = Links.for_run(cfg, timing.bandwidth, timing.latency, clients)
    # by client number: after a resume the joiners' too, each slot's last holder on the
    # slot's hardware and link, a client the resume did not start none (membership.resumed)
    numbered = len(point.client_steps) if point else clients
    loops: list[ClientLoop | None] = [None] * numbered
    clocks: list[StepClock | None] = [None] * numbered
    for slot, (client, number, step) in enumerate(zip(parts.local, started.numbers, started.steps)):
        clock = StepClock(timing.step_time * factors[slot], plans.stragglers, number, step)
        plan = client_plan(plans, number, cfg.servers, point, cfg.run_budget, real_time=False)
        loops[number], clocks[number] = ClientLoop(client, plan, clock, step=step, pushes=point.client_pushes[number]
                                                   if point else 0, down=clock.down, busy=clock.busy), clock
    for number in range(clients, numbered):
        links.add(like=started.numbers.index(number) if number in started.numbers else number % clients)
    joiner = functools.partial(_joiner, parts, cfg.servers, timing.step_time, factors, plans)
    # a resume's joins: those due after its checkpoint (the others were let in or refused before)
    joins = [(at, Join(SIM_SECRET, info["host"])) for _, at in parse_joins(cfg.joins)
             if not point or at > point.time] if cfg.joins else []
    simulation = Simulation(loops, clocks, timing, start=point.time if point else 0.0, replay=order, links=links,
                            joins=joins, joiner=joiner, spares=cfg.spares, host=info["host"], first_rank=cfg.servers)
    serve_run(setup, ServerSettings.from_config(cfg, clients), lambda: simulation.now,
              lambda state, recorder: {"server_busy_s": simulation.run(InProcess(state, recorder))},
              apply_cost=timing.apply_time, secret=SIM_SECRET if cfg.joinable or cfg.spares else None)
    return 0


def _joiner(parts: Parts, servers: int, step_time: float, factors: list[float], plans: PlanSettings,
            welcome: Welcome) -> tuple[ClientLoop, StepClock]:
    """A joiner's loop, on the shard and budget its Welcome deals, and its clock: the speed
    of client `client mod K`'s hardware, its own straggling (clients/stragglers.py)."""
    clients = parts.clients
    client = join_client(parts.client, parts.local[0].replica, parts.dataset, clients, welcome)
    clock = StepClock(step_time * factors[welcome.client % clients], plans.stragglers, welcome.client)
    plan = dataclasses.replace(ClientPlan.for_run(plans, welcome.client, servers, real_time=False),
                               steps=welcome.steps)
    return ClientLoop(client, plan, clock, down=clock.down, busy=clock.busy), clock


def _speed_factors(seed: int, clients: int, jitter: float) -> list[float]:
    rng = np.random.default_rng([seed, 0x5BEED])
    return [float(f) for f in rng.uniform(1 - jitter, 1 + jitter, clients)] if jitter else [1.0] * clients
