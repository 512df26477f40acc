"""A run's life on the rank that records it, written once for every mode and both backends.

    open (a fresh run directory, or a resumed one cut back to its checkpoint)
      -> the live curve's thread, the progress bar -> training and its last files (the caller's)
      -> the curve's last points, the final test pass, the summary   (`finish`)
      or, on any exception: the files under way land, the failure is the summary

The async server (experiments/run/serverrun.py) and the collective modes
(experiments/run/collectiverun.py) differ only in what they train and count; the collective
ranks that record nothing (all but rank 0) get a life without a directory (the other
servers of a sharded run record nothing and have no life: experiments/run/serverrun.py).
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Callable

from experiments.progress import Progress
from experiments.run.resume import cut_back
from experiments.run.record import RunSetup, eval_every, finish_run, live_curve, open_run, record_dir, record_failure
from rundir.checkpoint import Checkpoint
from rundir.layout import RunDir


class RunLife:
    """`with RunLife(...) as life:` train, then `life.finish(measured)`. `every`: the
    versions (or steps) between the curve's points, of a run of `events`. Set once they
    exist: `counts()`, what the run has counted so far, for a failure's summary;
    `land_files`, should training fail, lands the files it was writing in the background."""

    def __init__(self, setup: RunSetup, events: int, clock: Callable[[], float], records: bool = True):
        record = setup.record
        self.setup, self.clock = setup, clock
        self.every = eval_every(setup, events)
        self.counts: Callable[[], dict[str, Any]] = dict
        self.checkpoint: Checkpoint | None = None  # where a resumed run goes on from
        self.run: RunDir | None = None
        if records and record.resumes:
            self.run = record_dir(record)
            self.checkpoint = Checkpoint.load(self.run)
            cut_back(self.run, self.checkpoint, record.steps, setup.provenance,
                     {"metric": record.metric, **record.traits})
        elif records:
            self.run = open_run(setup, self.every)
        self.curve = live_curve(self.run, setup) if self.run is not None else None
        self.progress = Progress(record.clients * record.steps, quiet=record.quiet or not records)
        self.land_files: Callable[[], None] = lambda: None
        self.wall = time.perf_counter()

    def __enter__(self) -> RunLife:
        return self

    def started(self) -> None:
        """Training starts now (its wall time is counted from here)."""
        self.wall = time.perf_counter()

    def finish(self, measured: dict[str, Any]) -> dict[str, Any] | None:
        """Training is over and its files are out: the snapshots are evaluated, the summary
        (`counts()` and what else was `measured`) is written; returns it (None on a rank
        that records nothing)."""
        wall = time.perf_counter() - self.wall
        self.progress.close()
        if self.run is None:
            return None
        return finish_run(self.run, self.setup, self.curve, self.clock(), wall, {**self.counts(), **measured})

    def __exit__(self, kind: type | None, error: BaseException | None, trace: Any) -> bool:
        if error is None:
            return False
        if self.run is not None:  # said at once: Open MPI's launcher sends SIGKILL about 0.2 s after
            self.record_failure(error, last=False)  # its SIGTERM (scancel signals both), too soon for what follows
        self.progress.close()
        if self.curve is not None:
            self.curve.stop()
        with contextlib.suppress(Exception):  # the failure under way is the one to record
            self.land_files()  # the files under way land before the failure is recorded
        if self.run is not None:
            self.record_failure(error, last=True)  # again, with what landed
        return False

    def record_failure(self, error: BaseException, last: bool) -> None:
        record_failure(self.run, self.setup.record.clock, self.clock(), self.counts(), error, last)
