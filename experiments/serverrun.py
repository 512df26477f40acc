"""The server's side of an async run (rank 0, or the simulator): serve, then record.

With sharded servers (`--servers S`), rank 0 serves the first slice and records the
run, reading the other slices for snapshots and checkpoints; ranks 1..S-1 serve their
slice (`serve_slice`) and record nothing.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from clients.optimizers import OptimizerSettings
from experiments.runlife import RunLife
from experiments.runrecord import RunSetup, eval_every, spare_core
from paramserver.arrays import ServerArrays
from paramserver.config import RunConfig
from paramserver.handler import ServerState, ServerTally
from paramserver.noise import summarise
from paramserver.recorder import Recorder
from paramserver.rules import make_rule, state_bytes
from paramserver.schedule import Schedule
from paramserver.server import ServerLoop
from paramserver.store import Store
from paramserver.wire.compress import make_codec
from paramserver.wire.fanout import ServerLink
from paramserver.wire.protocol import Link, Outgoing, Pull, Tag, shard_bounds

# runs the message loop; returns what it measured for the summary (server_busy_s, ...)
Drive = Callable[[ServerState, Recorder], dict[str, Any]]


def serve_mpi(setup: RunSetup, link: Link, clock: Callable[[], float]) -> dict[str, Any]:
    """Server 0 of an MPI run: serve the clients over `link`, record the run."""
    cfg = setup.cfg
    hosts = {r["rank"]: r["host"] for r in setup.provenance.get("ranks", [])}

    def drive(state: ServerState, recorder: Recorder) -> dict[str, Any]:
        loop = ServerLoop(link, state, recorder, clock, cfg.stall_timeout, cfg.on_client_failure, hosts,
                          spin=spare_core(setup.provenance))
        loop.serve()
        return {"server_busy_s": loop.busy_s, "server_push_us": loop.cost.medians_us()}
    return serve_run(setup, clock, drive, link)


def serve_run(setup: RunSetup, clock: Callable[[], float], drive: Drive, link: Link | None = None,
              apply_cost: float | None = None) -> dict[str, Any]:
    """Create the run directory (or cut a resumed one back to its checkpoint), serve until
    every client stopped, evaluate, summarise; returns the summary.

    `drive` runs the message loop: `ServerLoop` over MPI, the simulator's event loop in
    sim. `link`: server 0's way to the other servers' slices, with sharded servers.
    """
    cfg, clients = setup.cfg, setup.clients
    every = eval_every(setup, cfg.async_versions(clients))
    bounds = shard_bounds(setup.weights.size, cfg.servers)
    state = server_state(cfg, setup.weights[slice(*bounds[0])], clients, eval_every=every, apply_cost=apply_cost,
                         clock=clock, collects_states=clients_keep_state(cfg, clients))
    with RunLife(setup, every, clock, lambda: _counts(state)) as life:
        lines = (0, 0)
        if life.checkpoint is not None:
            state.store.load_state(life.checkpoint.store_state)
            state.tally, lines = ServerTally.from_checkpoint(life.checkpoint), life.checkpoint.lines
        curve = life.curve
        state.stop = lambda: curve.reached is not None  # stop_at_error: replies from then on say stop
        recorder = Recorder(life.run, state, clock, lines, life.progress.update,
                            _gatherer(link, bounds, cfg.stall_timeout), fault=cfg.fault_for(0, "the server", "version"),
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
        return life.finish({**_counts(state), **noise, **measured,
                            "wire_bytes_pushed": state.wire_bytes[0], "wire_bytes_pulled": state.wire_bytes[1]})


def serve_slice(setup: RunSetup, link: Link, clock: Callable[[], float], shard: int) -> int:
    """Server `shard` > 0: serve its slice until every client stopped, then let server 0
    read it until server 0 says BYE; returns the clients lost, as BYE tells. It records
    nothing: server 0 records the run."""
    cfg = setup.cfg
    lo, hi = shard_bounds(setup.weights.size, cfg.servers)[shard]
    state = server_state(cfg, setup.weights[lo:hi], setup.clients, peers=(0,))
    loop = ServerLoop(link, state, None, clock, cfg.stall_timeout, cfg.on_client_failure)
    loop.serve()
    while (msg := link.recv(math.inf, source=0)).tag == Tag.PULL:
        loop.answer(msg)
    loop.finish_replies()
    return msg.header.lost


def server_state(cfg: RunConfig, weights: np.ndarray, clients: int, **options: Any) -> ServerState:
    """A server's state for its slice `weights` of a run of `clients` clients: its store,
    the clients' ranks, the wire's codec, the lr schedule (`options`: ServerState's)."""
    return ServerState(make_store(cfg, weights, clients), client_ranks(cfg, clients), codec=make_codec(cfg.compress),
                       schedule=server_schedule(cfg, clients), **options)


def clients_keep_state(cfg: RunConfig, clients: int) -> bool:
    """Whether the clients' optimizer keeps state, which server 0 then gathers for each
    checkpoint (paramserver/handler.py)."""
    settings = OptimizerSettings(name=cfg.optimizer, momentum=cfg.client_momentum(clients), precision=cfg.precision)
    return settings.keeps_state


def client_ranks(cfg: RunConfig, clients: int) -> list[int]:
    """The clients' ranks: after the server ranks."""
    return list(range(cfg.servers, cfg.servers + clients))


def server_schedule(cfg: RunConfig, clients: int) -> Schedule:
    """The lr schedule the server counts progress for and applies its rule's lr by."""
    return Schedule.for_run(cfg, clients, lr=cfg.effective_server_lr)


def make_store(cfg: RunConfig, weights: np.ndarray, clients: int) -> Store:
    """The server's store for these weights: its rule for `clients` clients, on its device."""
    return Store(weights, make_rule(cfg.rule, cfg, clients), backend=ServerArrays(cfg.server_device),
                 kernel=cfg.server_kernel)


def _gatherer(link: Link | None, bounds: list[tuple[int, int]], timeout: float):
    """Server 0's way to the whole vector: its own slice, and the others' read with PULL."""
    if len(bounds) == 1:
        return None
    servers = ServerLink(link, tuple(range(1, len(bounds))), bounds[1:], timeout)

    def gather(own: np.ndarray) -> np.ndarray:
        whole = np.empty(bounds[-1][1], np.float32)
        whole[:bounds[0][1]] = own
        servers.exchange(Outgoing(Tag.PULL, Pull()), whole)
        return whole
    return gather


def _counts(state: ServerState) -> dict[str, Any]:
    store, tally = state.store, state.tally
    return {
        "minibatches": tally.minibatches,
        "samples": tally.samples,
        "version": store.version,
        # a stopped client says how many it sent; of one that failed or was lost, what came
        "pushes_sent": sum(max(int(tally.client_pushes[i]), tally.stops[r].pushes if r in tally.stops else 0)
                           for i, r in enumerate(state.client_ranks)),
        "pushes_applied": sum(store.applied.values()),
        "pushes_rejected": tally.rejected,
        "pushes_dropped": sum(store.dropped.values()),
        "dropped_per_client": {str(c): n for c, n in sorted(store.dropped.items())},
        "staleness": store.staleness_stats(),
        "rule_state_bytes": state_bytes(store.rule),
        "lost_clients": sorted(tally.lost.values(), key=lambda lost: lost["client"]),
    }
