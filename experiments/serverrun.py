"""The server's side of an async run (rank 0, or the simulator): serve, then record."""
from __future__ import annotations

import time
from typing import Any, Callable

from experiments.progress import Progress
from experiments.runrecord import RunSetup, async_versions, eval_every, finish_run, open_run, record_failure
from experiments.resume import cut_back
from paramserver.compress import make_codec
from paramserver.rules import make_rule
from paramserver.rundir import RunDir
from paramserver.server import ServerTally, Serving, serve
from paramserver.store import Store


def serve_run(setup: RunSetup, transport: Any, clock: Callable[[], float],
              drive: Callable[[Serving], ServerTally] = serve, apply_cost: float | None = None) -> dict[str, Any]:
    """Create the run directory, serve until every client stopped, evaluate, summarise;
    returns the summary.

    `drive` runs the message loop: `serve` over MPI, the simulator's event loop in sim.
    """
    cfg, clients = setup.cfg, setup.clients
    every = eval_every(cfg, async_versions(cfg, clients))
    store = Store(setup.weights, make_rule(cfg.rule, cfg.effective_server_lr, cfg.server_momentum, cfg.weight_decay))
    tally, lines = None, (0, 0)
    if cfg.resume:
        run = RunDir(setup.out)
        arrays = run.load_checkpoint()
        store.load_state(arrays)
        cut_back(run, arrays, cfg.steps, setup.provenance)
        tally, lines = ServerTally.from_arrays(arrays), tuple(int(n) for n in arrays["lines"])
    else:
        run = open_run(setup, every)
    progress = Progress(clients * cfg.steps, quiet=cfg.quiet)
    fault = cfg.fault
    serving = Serving(transport, store, run, list(range(1, clients + 1)), every, cfg.stall_timeout, clock,
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


def _counts(store: Store, tally: ServerTally) -> dict[str, Any]:
    return {
        "minibatches": tally.minibatches,
        "samples": tally.samples,
        "version": store.version,
        "pushes_sent": sum(stop.pushes for stop in tally.stops.values()),
        "pushes_applied": sum(store.applied.values()),
        "pushes_rejected": tally.rejected,
        "staleness": store.staleness_stats(),
        "lost_clients": sorted(tally.lost.values(), key=lambda lost: lost["client"]),
    }
