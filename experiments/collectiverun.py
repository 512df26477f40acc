"""A synchronous baseline run (`--mode sync` or `local-sgd`), over MPI or simulated.

There is no server: over MPI every rank is a client and rank 0 also records the run;
the simulator steps all K clients itself. Rows of all clients reach the recorder each
step (`gather`), so the run directory is the same as an async run's, with an empty
server.jsonl. Snapshots for the test error are client 0's weights, which in sync mode
every client shares and in local-sgd mode are averaged at each sync point.

The recorder writes snapshots and checkpoints on a thread of its own, one at a time:
the files (checksummed, fsynced) take milliseconds, which every other rank would
otherwise spend waiting in the next allreduce. The weights are copied at the step, so
a file holds exactly what it would have held written in line.
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Callable

import numpy as np

from clients.client import Client
from clients.collective import Average, Straggle, collective_step
from clients.models import host_copy
from experiments.progress import Progress
from paramserver.rundir.resume import ResumePoint, cut_back
from experiments.runrecord import RunSetup, record_dir, eval_every, finish_run, open_run, record_failure
from paramserver.rundir.checkpoint import Checkpoint
from paramserver.recorder import Background
from paramserver.rundir.layout import RunDir
from paramserver.rundir.durable import read_jsonl


def collective_run(setup: RunSetup, clients: list[Client], indices: list[int], average: Average,
                   clock: Callable[[], float], gather: Callable[[list[dict]], list[dict] | None],
                   straggle: Straggle, point: ResumePoint | None = None) -> int:
    """Train every local client in lockstep; `gather` returns all rows on the recorder, else
    None; `straggle` (clients/collective.py) slows the step as the straggler model says."""
    cfg = setup.cfg
    k, samples_per_step = setup.clients, setup.clients * cfg.batch_size
    every = eval_every(cfg, cfg.steps)
    recorder = 0 in indices
    run, counts, lines = _open(setup, every, point) if recorder else (None, {}, 0)
    progress = Progress(setup.clients * cfg.steps, quiet=cfg.quiet or not recorder)
    first = point.client_steps[0] + 1 if point else 1
    faults = [f for i in indices if (f := cfg.fault_for(i, f"client {i}")) is not None]
    files = Background() if recorder else None
    wall = time.perf_counter()
    try:
        with run.writer("clients", lines) if recorder else contextlib.nullcontext() as log:
            for step in range(first, cfg.steps + 1):
                for client in clients:  # the lr schedule's progress: the samples of the steps before
                    client.lr = client.schedule.at((step - 1) * samples_per_step)
                results, kept = collective_step(clients, cfg.mode, step, cfg.steps, cfg.n_sync, average, straggle,
                                                (k, cfg.backup_workers))
                now = clock()
                rows = [_row(r, i, step, now, keep) for i, r, keep in zip(indices, results, kept)]
                for fault in faults:
                    fault.strike(step)
                everyone = gather(rows)
                if recorder:
                    log.write_many(everyone)
                    counts["minibatches"] += len(everyone)
                    counts["samples"] += sum(r["samples"] for r in everyone)
                    progress.update(counts["minibatches"])
                    if step % every == 0 or step == cfg.steps:
                        files.submit(_write_files, run, setup, host_copy(clients[0].weights), step, now,
                                     dict(counts), log.lines)
        progress.close()
        if recorder:
            files.close()
            dropped = {"gradients_dropped": _dropped(run)} if cfg.backup_workers else {}
            finish_run(run, setup, clock(), time.perf_counter() - wall, {**counts, **dropped})
    except BaseException as error:
        progress.close()
        if recorder:
            with contextlib.suppress(Exception):  # the failure under way is the one to record
                files.close()  # the last checkpoint lands before the failure is recorded
            record_failure(run, clock(), counts, error)
        raise
    return 0


def _row(result, client: int, step: int, now: float, kept: bool) -> dict:
    """A minibatch's row; a backup worker's dropped gradient says so."""
    row = result.row(client, step, now)
    return row if kept else {**row, "dropped": True}


def _dropped(run: RunDir) -> int:
    """Gradients the backup workers' rule dropped in the whole run (a resumed one too)."""
    return sum(1 for row in read_jsonl(run.path / "clients.jsonl") if row.get("dropped"))


def _open(setup: RunSetup, every: int, point: ResumePoint | None) -> tuple[RunDir, dict[str, Any], int]:
    """The run directory (new, or cut back to its checkpoint), the counts so far, the log's rows."""
    if point is None:
        run = open_run(setup, every)
        run.writer("server").close()  # no server in these modes: its log stays empty
        counts = {"minibatches": 0, "samples": 0}
        _write_files(run, setup, setup.weights, 0, 0.0, counts, 0)  # the starting state: resumable from step 1
        return run, counts, 0
    run = record_dir(setup)
    checkpoint = Checkpoint.load(run)
    cut_back(run, checkpoint, setup.cfg.steps, setup.provenance)
    minibatches, samples, _ = checkpoint.counts
    return run, {"minibatches": minibatches, "samples": samples}, checkpoint.lines[1]


def _write_files(run: RunDir, setup: RunSetup, weights: np.ndarray, step: int, now: float, counts: dict[str, Any],
            lines: int) -> None:
    """A snapshot of client 0's `weights` for the test error and, where every client holds
    the same weights (always in sync mode, at averaging steps in local-sgd), a checkpoint
    to resume from."""
    cfg = setup.cfg
    run.save_snapshot(weights, step, now, counts["minibatches"])
    if cfg.mode == "sync" or step % cfg.n_sync == 0 or step == cfg.steps:
        k = setup.clients
        Checkpoint(weights, step, now, (0, lines), (counts["minibatches"], counts["samples"], 0),
                   np.full(k, step), np.zeros(k, np.int64)).save(run)
