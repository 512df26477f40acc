"""Rank 0's whole job: set up the run directory, serve, evaluate, summarise.

The summary is written last, and on failure too (`status: failed: reason`), so a run
directory always says whether its results are complete.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from clients.data import Dataset
from clients.evaluate import evaluate_snapshots
from experiments.progress import Progress
from paramserver.config import RunConfig
from paramserver.rules import make_rule
from paramserver.rundir import RunDir
from paramserver.server import ServerTally, Serving, serve
from paramserver.store import Store


@dataclass(frozen=True)
class RunSetup:
    """What either backend hands to the server side of a run."""

    cfg: RunConfig
    out: str
    clients: int
    model: nn.Module        # evaluates the snapshots after training
    weights: np.ndarray     # the server's initial weights
    dataset: Dataset
    device: str
    provenance: dict[str, Any]


def serve_run(setup: RunSetup, transport: Any, clock: Callable[[], float],
              drive: Callable[[Serving], ServerTally] = serve, apply_cost: float | None = None) -> int:
    """Create the run directory, serve until every client stopped, evaluate, summarise.

    `drive` runs the message loop: `serve` over MPI, the simulator's event loop in sim.
    """
    cfg, out, clients = setup.cfg, setup.out, setup.clients
    weights = setup.weights
    run = RunDir(out)
    run.create()
    run.write_config({**cfg.to_dict(), "out": out, "clients": clients, "eval_every": eval_every(cfg, clients),
                      "num_params": weights.size, "provenance": setup.provenance})
    store = Store(weights, make_rule(cfg.rule, cfg.effective_server_lr, cfg.server_momentum, cfg.weight_decay))
    progress = Progress(clients * cfg.steps, quiet=cfg.quiet)
    fault = cfg.fault
    serving = Serving(transport, store, run, list(range(1, clients + 1)), eval_every(cfg, clients),
                      cfg.stall_timeout, clock, fault_version=fault[1] if fault and fault[0] == 0 else None,
                      progress=progress.update, apply_cost=apply_cost)
    try:
        wall = time.perf_counter()
        tally = drive(serving)
        train_wall_s = time.perf_counter() - wall
        train_s = clock()
        progress.close()
        run.save_checkpoint(store.state())
        eval_start = time.perf_counter()
        eval_rows = _evaluate(run, cfg, setup.model, setup.dataset, setup.device)
        summary = _summary(store, tally, train_s, eval_rows, time.perf_counter() - eval_start, "complete")
        summary["pushes_sent"] = sum(stop.pushes for stop in tally.stops.values())
        summary["train_wall_s"] = train_wall_s  # differs from time_s in the simulator
    except BaseException as error:
        progress.close()
        run.write_summary(_summary(store, serving.tally, clock(), [], 0.0,
                                   f"failed: {type(error).__name__}: {error}"))
        raise
    run.write_summary(summary)
    if not cfg.quiet:
        print(f"run {out}: test error {summary['final_test_error']:.4f} after {summary['minibatches']} "
              f"minibatches in {train_s:.1f} s ({summary['pushes_applied']} pushes, "
              f"mean staleness {summary['staleness']['mean']:.2f})", flush=True)
    return 0


def eval_every(cfg: RunConfig, clients: int) -> int:
    """About 20 evaluations a run unless the config sets the period."""
    pushes = clients * math.ceil(cfg.steps / cfg.push_every)
    return cfg.eval_every or max(1, pushes // 20)


def _evaluate(run: RunDir, cfg: RunConfig, model: nn.Module, dataset: Dataset, device: str) -> list[dict]:
    torch.set_num_threads(len(os.sched_getaffinity(0)))  # the clients are done: take every core
    model = model.to(device)
    return evaluate_snapshots(run, model, dataset.test, cfg.eval_samples,
                              keep=cfg.keep_snapshots)


def _summary(store: Store, tally: ServerTally, train_s: float, eval_rows: list[dict],
             eval_s: float, status: str) -> dict[str, Any]:
    final = eval_rows[-1] if eval_rows else {}
    return {
        "status": status,
        "final_test_error": final.get("test_error"),
        "final_test_loss": final.get("test_loss"),
        "time_s": train_s,
        "eval_s": eval_s,
        "minibatches": tally.minibatches,
        "samples": tally.samples,
        "throughput_samples_per_s": tally.samples / train_s if train_s > 0 else None,
        "version": store.version,
        "pushes_applied": sum(store.applied.values()),
        "pushes_rejected": len(tally.rejected),
        "staleness": store.staleness_stats(),
        "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
