"""A synchronous baseline run (`--mode sync` or `local-sgd`), over MPI or simulated.

There is no server: over MPI every rank is a client and rank 0 also records the run;
the simulator steps all K clients itself. Rows of all clients reach the recorder each
step (`gather`), so the run directory is the same as an async run's, with an empty
server.jsonl. Snapshots for the test error are client 0's weights, which in sync mode
every client shares and in local-sgd mode are averaged at each sync point.
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Callable

from clients.client import Client
from clients.collective import Average, collective_step
from clients.models import host_copy
from experiments.progress import Progress
from experiments.runrecord import RunSetup, eval_every, finish_run, open_run, record_failure
from paramserver.config import InjectedFault


def collective_run(setup: RunSetup, clients: list[Client], indices: list[int], average: Average,
                   clock: Callable[[], float], gather: Callable[[list[dict]], list[dict] | None],
                   advance: Callable[[int], None] = lambda step: None) -> int:
    """Train every local client in lockstep; `gather` returns all rows on the recorder, else None."""
    cfg = setup.cfg
    every = eval_every(cfg, cfg.steps)
    recorder = 0 in indices
    run = open_run(setup, every) if recorder else None
    progress = Progress(setup.clients * cfg.steps, quiet=cfg.quiet or not recorder)
    counts: dict[str, Any] = {"minibatches": 0, "samples": 0}
    wall = time.perf_counter()
    try:
        if recorder:
            run.writer("server").close()  # no server in these modes: its log stays empty
            run.save_snapshot(setup.weights, 0, 0.0, 0)
        with run.writer("clients") if recorder else contextlib.nullcontext() as log:
            for step in range(1, cfg.steps + 1):
                results = collective_step(clients, cfg.mode, step, cfg.steps, cfg.n_sync, average)
                advance(step)
                now = clock()
                rows = [{"client": i, "step": step, "time": now, "loss": r.loss, "error": r.error,
                         "samples": r.samples} for i, r in zip(indices, results)]
                _maybe_fault(cfg.fault, indices, step)
                everyone = gather(rows)
                if recorder:
                    log.write_many(everyone)
                    counts["minibatches"] += len(everyone)
                    counts["samples"] += sum(r["samples"] for r in everyone)
                    progress.update(counts["minibatches"])
                    if step % every == 0 or step == cfg.steps:
                        run.save_snapshot(host_copy(clients[0].weights), step, now, counts["minibatches"])
        progress.close()
        if recorder:
            run.save_checkpoint({"weights": host_copy(clients[0].weights), "version": step})
            finish_run(run, setup, clock(), time.perf_counter() - wall, counts)
    except BaseException as error:
        progress.close()
        if recorder:
            record_failure(run, clock(), counts, error)
        raise
    return 0


def _maybe_fault(fault: tuple[int, int] | None, indices: list[int], step: int) -> None:
    if fault and fault[0] in indices and fault[1] == step:
        raise InjectedFault(f"injected fault on client {fault[0]} at step {step}")

