"""The server's side of an async run (rank 0, or the simulator): serve, then record.

With sharded servers (`--servers S`), rank 0 serves the first slice, records the run
(reading the other slices for snapshots and checkpoints) and decides when each client is
answered; ranks 1..S-1 serve their slice (`serve_slice`), follow server 0's decisions
(paramserver/drivers/follow.py) and record nothing.
"""
from __future__ import annotations

import math
import os
import secrets
import socket
from dataclasses import dataclass
from typing import Any, Callable

from clients.optimizers import OptimizerSettings
from experiments.run.assemble import server_optimizer_factory
from experiments.run.life import RunLife
from experiments.run.record import RunSetup, spare_core
from paramserver.faults import Fault
from paramserver.drivers.follow import Follow
from paramserver.state import ServerState, StateSettings
from paramserver.tally import ServerTally
from paramserver.noise import summarise
from paramserver.recorder import Recorder
from paramserver.drivers.server import ServerLoop
from paramserver.wire.compress import make_codec
from paramserver.wire.door import Door
from paramserver.wire.fanout import gatherer
from paramserver.wire.protocol import Link, Seated, Tag, shard_bounds
from runconfig.settings import RunConfig
from rundir.layout import RunDir

# runs the message loop; returns what it measured for the summary (server_busy_s, ...)
Drive = Callable[[ServerState, Recorder], dict[str, Any]]


@dataclass(frozen=True)
class ServerSettings:
    """What the async server reads of the config: its driver's settings, and its state's
    (`state`: the Store, rule, schedule, reply policy and members of every server's
    `ServerState`). Built once, by `from_config`, where either backend starts the server
    role (experiments/rank/entry.py, experiments/sim/simulator.py).

    `block`: the codec's block, on whose multiples the servers' slices are cut;
    `keeps_state`: the clients' optimizer keeps state, which server 0 then gathers for each
    checkpoint; `versions`: the versions the run makes (the curve's points are spread over
    them); `fault`: the one `inject_fault` puts on server 0; `optimizer_factory`: the user's
    optimizer for the server's step (None: one of ours)."""

    servers: int
    spares: int
    joinable: bool
    block: int
    stall_timeout: float
    on_client_failure: str
    keeps_state: bool
    versions: int
    checkpoint_every: float
    fault: Fault | None
    optimizer_factory: Callable | None
    state: StateSettings

    @classmethod
    def from_config(cls, cfg: RunConfig, clients: int) -> ServerSettings:
        keeps_state = OptimizerSettings(name=cfg.optimizer, momentum=cfg.client_momentum(clients),
                                        precision=cfg.precision).keeps_state
        return cls(servers=cfg.servers, spares=cfg.spares, joinable=cfg.joinable, block=make_codec(cfg.compress).block,
                   stall_timeout=cfg.stall_timeout, on_client_failure=cfg.on_client_failure, keeps_state=keeps_state,
                   versions=cfg.async_versions(clients), checkpoint_every=cfg.checkpoint_every,
                   fault=cfg.fault_for(0, "the server", "version"), optimizer_factory=server_optimizer_factory(cfg),
                   state=StateSettings.from_config(cfg, clients))


def serve_mpi(setup: RunSetup, server: ServerSettings, link: Link, clock: Callable[[], float],
              door: Door | None = None, doors: list[dict] = ()) -> dict[str, Any]:
    """Server 0 of an MPI run: serve the clients over `link`, record the run. With spare
    ranks or a `door` (`--joinable`: `link` is then its `DoorLink`) the run has a secret
    of its own, which only an admitted spare learns (its ADMIT), or the run's owner from
    the run directory's door file, there while the server serves; with sharded servers
    the file lists the others' doors too (`doors`, servers 1..S-1: `door_of`)."""
    hosts = {r["rank"]: r["host"] for r in setup.provenance.get("ranks", [])}

    def drive(state: ServerState, recorder: Recorder) -> dict[str, Any]:
        loop = ServerLoop(link, state, recorder, clock, server.stall_timeout, server.on_client_failure, hosts,
                          spin=spare_core(setup.provenance), followers=tuple(range(1, server.servers)))
        run = RunDir(setup.record.out)
        if door is not None:
            run.open_door({**door_of(door), "secret": state.members.secret, "host": socket.gethostname(),
                           "pid": os.getpid(), "servers": list(doors)})
        try:
            loop.serve()
        finally:
            run.close_door()
        return {"server_busy_s": loop.busy_s, "server_push_us": loop.cost.medians_us()}
    joinable = server.spares or door is not None
    return serve_run(setup, server, clock, drive, link, secret=secrets.token_hex(16) if joinable else None)


def door_of(door: Door) -> dict[str, Any]:
    """Where a joiner finds this server's door: its port and this host's addresses."""
    return {"port": door.port, "addresses": addresses()}


def addresses() -> list[str]:
    """Where a joiner may reach this host, the likeliest first: the addresses its name
    resolves to and the one its default route leaves by (loopback last: from another
    host it would reach the joiner's own)."""
    found = []
    try:
        found += [info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)]
    except OSError:
        pass
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # a documentation address: no packet leaves, the route is looked up
            found.append(probe.getsockname()[0])
    except OSError:
        pass
    outside = [a for a in found if not a.startswith("127.")]
    return list(dict.fromkeys([*outside, socket.gethostname(), *found, "127.0.0.1"]))


def serve_run(setup: RunSetup, server: ServerSettings, clock: Callable[[], float], drive: Drive,
              link: Link | None = None, apply_cost: float | None = None, secret: str | None = None) -> dict[str, Any]:
    """Create the run directory (or cut a resumed one back to its checkpoint), serve until
    every client stopped, evaluate, summarise; returns the summary.

    `drive` runs the message loop: `ServerLoop` over MPI, the simulator's event loop in
    sim. `link`: server 0's way to the other servers' slices, with sharded servers; the
    simulator has none and holds the whole vector, its one server standing for S servers
    that take every message in the same order (experiments/sim/simulator.py). `secret`:
    what a process that joins must show (None: the run is not joinable).
    """
    clients = setup.clients
    bounds = shard_bounds(setup.weights.size, server.servers if link is not None else 1, server.block)
    with RunLife(setup, server.versions, clock) as life:
        state = ServerState.for_run(server.state, setup.weights[slice(*bounds[0])], clients, server.optimizer_factory,
                                    eval_every=life.every, checkpoint_every=server.checkpoint_every,
                                    apply_cost=apply_cost, clock=clock, collects_states=server.keeps_state,
                                    secret=secret, shard=(*bounds[0], setup.weights.size))
        life.counts = state.counts
        lines = (0, 0)
        if life.checkpoint is not None:
            state.tally, lines = ServerTally.from_checkpoint(life.checkpoint), life.checkpoint.lines
            state.load_arrays(life.checkpoint.store_state)
        curve = life.curve
        # a stop rule reached: replies from then on say stop (as they do once the run's budget
        # is spent: state.budget; server 0's header is the one a client of sharded servers reads)
        state.stop = lambda: curve.reached is not None
        recorder = Recorder(life.run, state, clock, lines, life.progress.update,
                            gatherer(link, bounds, server.stall_timeout), fault=server.fault,
                            after_snapshot=curve.catch_up if curve.inline else None)
        life.land_files = recorder.close
        if life.checkpoint is None:
            recorder.start()
        life.started()
        measured = drive(state, recorder)
        curve.stop()  # before the last snapshot: a target it reaches stopped nothing
        life.progress.close()
        recorder.finish()
        noise = {"noise_scale": summarise(life.run.rows("server"))} if state.store.rule.noise is not None else {}
        return life.finish({**noise, **measured, **state.tally.wire_bytes(), **state.tally.client_busy()})


def serve_slice(setup: RunSetup, server: ServerSettings, link: Link, clock: Callable[[], float], shard: int) -> int:
    """Server `shard` > 0: serve its slice until every client stopped, then let server 0
    read it until server 0 says BYE; returns the clients lost, as BYE tells. It records
    nothing: server 0 records the run."""
    lo, hi = shard_bounds(setup.weights.size, server.servers, server.block)[shard]
    state = ServerState.for_run(server.state, setup.weights[lo:hi], setup.clients, server.optimizer_factory, peers=(0,),
                                shard=(lo, hi, setup.weights.size))
    loop = ServerLoop(link, state, None, clock, server.stall_timeout, server.on_client_failure, follow=Follow(clock))
    loop.serve()
    while (msg := link.recv(math.inf, source=0)).tag in (Tag.PULL, Tag.DECIDED):  # words after the last STOP: none to follow
        if msg.tag == Tag.PULL:
            loop.answer(msg)
        elif isinstance(msg.header, Seated):  # every client here stopped or lost, and server 0 let one in
            loop.seat(msg.header)
            loop.serve()
    loop.finish_replies()
    return msg.header.lost
