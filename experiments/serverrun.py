"""The server's side of an async run (rank 0, or the simulator): serve, then record.

With sharded servers (`--servers S`), rank 0 serves the first slice and records the
run, reading the other slices for snapshots and checkpoints; ranks 1..S-1 serve their
slice (`serve_slice`) and record nothing.
"""
from __future__ import annotations

import math
import tempfile
import time
from typing import Any, Callable

import numpy as np

from clients.driver import ServerLink
from clients.loop import Outgoing
from experiments.progress import Progress
from experiments.runrecord import RunSetup, async_versions, eval_every, finish_run, open_run, record_failure
from experiments.resume import cut_back
from paramserver.arrays import ServerArrays
from paramserver.checkpoint import Checkpoint
from paramserver.compress import make_codec
from paramserver.config import RunConfig
from paramserver.protocol import Pull, Tag, shard_bounds
from paramserver.rules import make_rule, state_bytes
from paramserver.rundir import RunDir
from paramserver.server import ServerTally, Serving, handle, serve
from paramserver.store import Store


def serve_run(setup: RunSetup, transport: Any, clock: Callable[[], float],
              drive: Callable[[Serving], ServerTally] = serve, apply_cost: float | None = None) -> dict[str, Any]:
    """Create the run directory, serve until every client stopped, evaluate, summarise;
    returns the summary.

    `drive` runs the message loop: `serve` over MPI, the simulator's event loop in sim.
    """
    cfg, clients = setup.cfg, setup.clients
    every = eval_every(cfg, async_versions(cfg, clients))
    bounds = shard_bounds(setup.weights.size, cfg.servers)
    store = make_store(cfg, setup.weights[slice(*bounds[0])], clients)
    tally, lines = None, (0, 0)
    if cfg.resume:
        run = RunDir(setup.out)
        checkpoint = Checkpoint.load(run)
        store.load_state(checkpoint.store_state)
        cut_back(run, checkpoint, cfg.steps, setup.provenance)
        tally, lines = ServerTally.from_checkpoint(checkpoint), checkpoint.lines
    else:
        run = open_run(setup, every)
    progress = Progress(clients * cfg.steps, quiet=cfg.quiet)
    fault = cfg.fault
    serving = Serving(transport, store, run, list(range(cfg.servers, cfg.servers + clients)), every,
                      cfg.stall_timeout, clock, gather=_gatherer(transport, bounds, cfg.stall_timeout),
                      fault_version=fault[1] if fault and fault[0] == 0 else None,
                      progress=progress.update, apply_cost=apply_cost, tally=tally, log_lines=lines,
                      hosts={r["rank"]: r["host"] for r in setup.provenance.get("ranks", [])},
                      on_client_failure=cfg.on_client_failure, codec=make_codec(cfg.compress))
    try:
        wall = time.perf_counter()
        tally = drive(serving)
        train_wall_s = time.perf_counter() - wall
        progress.close()
        serving.checkpoint()
        return finish_run(run, setup, clock(), train_wall_s, {
            **_counts(store, tally), "server_busy_s": serving.busy_s,
            "wire_bytes_pushed": serving.wire_bytes[0], "wire_bytes_pulled": serving.wire_bytes[1]})
    except BaseException as error:
        progress.close()
        record_failure(run, clock(), _counts(store, serving.tally), error)
        raise


def serve_slice(setup: RunSetup, transport: Any, clock: Callable[[], float], shard: int) -> int:
    """Server `shard` > 0: serve its slice until every client stopped, then let server 0
    read it until server 0 says BYE; returns the clients lost, as BYE tells. Its logs go
    to a scratch folder: server 0 records the run."""
    cfg = setup.cfg
    lo, hi = shard_bounds(setup.weights.size, cfg.servers)[shard]
    with tempfile.TemporaryDirectory() as scratch:
        run = RunDir(scratch)
        run.create()
        serving = Serving(transport, make_store(cfg, setup.weights[lo:hi], setup.clients), run,
                          list(range(cfg.servers, cfg.servers + setup.clients)), 0, cfg.stall_timeout, clock,
                          on_client_failure=cfg.on_client_failure, codec=make_codec(cfg.compress), peers=(0,))
        serve(serving)
        while (msg := transport.recv(math.inf, source=0)).tag == Tag.PULL:
            handle(serving, msg)
    return msg.header.lost


def make_store(cfg: RunConfig, weights: np.ndarray, clients: int) -> Store:
    """The server's store for these weights: its rule for `clients` clients, on its device."""
    return Store(weights, make_rule(cfg.rule, cfg, clients), backend=ServerArrays(cfg.server_device))


def _gatherer(transport: Any, bounds: list[tuple[int, int]], timeout: float):
    """Server 0's way to the whole vector: its own slice, and the others' read with PULL."""
    if len(bounds) == 1:
        return None
    link = ServerLink(transport, tuple(range(1, len(bounds))), bounds[1:], timeout)

    def gather(own: np.ndarray) -> np.ndarray:
        whole = np.empty(bounds[-1][1], np.float32)
        whole[:bounds[0][1]] = own
        link.exchange(Outgoing(Tag.PULL, Pull()), whole)
        return whole
    return gather


def _counts(store: Store, tally: ServerTally) -> dict[str, Any]:
    return {
        "minibatches": tally.minibatches,
        "samples": tally.samples,
        "version": store.version,
        "pushes_sent": sum(stop.pushes for stop in tally.stops.values()),
        "pushes_applied": sum(store.applied.values()),
        "pushes_rejected": tally.rejected,
        "staleness": store.staleness_stats(),
        "rule_state_bytes": state_bytes(store.rule),
        "lost_clients": sorted(tally.lost.values(), key=lambda lost: lost["client"]),
    }
