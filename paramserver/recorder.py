"""What the server's events become on disk: logs, progress, snapshots, checkpoints.

`handle()` returns events; the Recorder writes them. Log rows are written at once and
reach the OS within `FLUSH_EVERY` (and before every checkpoint, which counts them: a
crash loses only rows a resume would cut anyway); snapshots and checkpoints are written on a thread of their own
(`Background`), one at a time, because their files (checksummed, fsynced) take
milliseconds that a client waiting for its reply would otherwise spend idle. The arrays
are copied when the event comes, so a file holds exactly what it would have held
written in line; and the Recorder is closed (every file out) before anyone reads them.
"""
from __future__ import annotations

import sys
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import numpy as np

from paramserver.events import (Applied, CheckpointDue, ClientRows, Dropped, Event, Joined, JoinRefused,
                                NoiseMeasured, Rejected, SnapshotDue)
from paramserver.faults import Fault
from paramserver.state import ServerState
from rundir.checkpoint import Checkpoint, save_point
from rundir.layout import RunDir


FLUSH_EVERY = 0.1  # seconds a log row may wait in memory


class Background:
    """Runs file writes on one thread, one at a time, in order. A write's error is raised
    by the next `submit` or by `close`, so none is lost."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="record")
        self.pending: Future | None = None

    def submit(self, write: Callable[..., None], *args: Any) -> None:
        self.wait()  # the previous files are out (or their error is raised here)
        self.pending = self.pool.submit(write, *args)

    def wait(self) -> None:
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.result()

    def close(self) -> None:
        """Every file out; raises the last write's error, if any."""
        try:
            self.wait()
        finally:
            self.pool.shutdown()


class Recorder:
    """Writes a run's server.jsonl, clients.jsonl, snapshots and checkpoint.

    `log_lines`: the rows already in the (server, clients) logs (a resumed run's logs,
    cut back to its checkpoint). `gather`: with sharded servers, server 0's way to the
    whole weight vector from its own slice. `fault`: fail on purpose once its
    version is recorded (the fault-injection tests). `after_snapshot`: called once each
    snapshot is on disk (the simulator measures the curve's point there, in line).
    """

    def __init__(self, run: RunDir, state: ServerState, clock: Callable[[], float],
                 log_lines: tuple[int, int] = (0, 0), progress: Callable[[int], None] = lambda minibatches: None,
                 gather: Callable[[np.ndarray], np.ndarray] | None = None, fault: Fault | None = None,
                 after_snapshot: Callable[[], None] | None = None):
        self.run, self.state, self.clock, self.progress = run, state, clock, progress
        self.gather, self.fault, self.after_snapshot = gather, fault, after_snapshot
        self.server_log = run.writer("server", log_lines[0], FLUSH_EVERY)
        self.client_log = run.writer("clients", log_lines[1], FLUSH_EVERY)
        self.files = Background()
        self._writers: dict[type, Callable[[Any], None]] = {
            Applied: self._applied, Rejected: self._rejected, Dropped: self._dropped, NoiseMeasured: self._noise,
            ClientRows: self._client_rows, SnapshotDue: lambda event: self.snapshot(checkpoint=event.checkpoint),
            CheckpointDue: lambda event: self.snapshot(evaluated=False), Joined: self._joined,
            JoinRefused: self._join_refused}

    def record(self, events: list[Event]) -> None:
        for event in events:
            self._writers[type(event)](event)
        if self.fault is not None:
            self.fault.strike(self.state.store.version)

    def _applied(self, event: Applied) -> None:  # a row a push: formatted here, not by json (all finite numbers)
        now = self.clock()
        self.server_log.write_json(
            f'{{"time": {float(now)!r}, "client": {event.client}, "version": {event.version}, '
            f'"staleness": {event.staleness}, "apply_s": {float(event.apply_s)!r}}}\n',
            [{"time": now, "client": event.client, "version": event.version, "staleness": event.staleness,
              "apply_s": event.apply_s}])

    def _rejected(self, event: Rejected) -> None:
        self.server_log.write({"time": self.clock(), "client": event.client, "rank": event.rank,
                               "rejected": event.reason})
        self.server_log.flush()  # rare, and what one looks for first

    def _dropped(self, event: Dropped) -> None:  # not an error: no version, no flush
        self.server_log.write({"time": self.clock(), "client": event.client, "staleness": event.staleness,
                               "dropped": event.reason})

    def _noise(self, event: NoiseMeasured) -> None:
        row = {"time": self.clock(), "samples": event.samples, "noise_scale": event.noise_scale}
        for name in ("fresh_batch", "gain", "grad_norm"):
            if getattr(event, name) is not None:
                row[name] = getattr(event, name)
        self.server_log.write(row)

    def _client_rows(self, event: ClientRows) -> None:
        self.client_log.write_many(event.rows)
        self.progress(event.minibatches)

    def _joined(self, event: Joined) -> None:
        spare = {} if event.spare_for is None else {"spare_for": event.spare_for}
        self.membership({"joined": event.client, "rank": event.rank, "host": event.host, "version": event.version,
                         **spare})
        # whoever runs the job sees the run grow back
        what = (f"client {event.spare_for} lost; spare rank {event.rank} joins as client {event.client}" if spare
                else f"rank {event.rank} (host {event.host}) joins as client {event.client} at version {event.version}")
        print(f"asgd: {what}", file=sys.stderr, flush=True)

    def _join_refused(self, event: JoinRefused) -> None:
        """Named on the console too: whoever runs the job should see who knocked."""
        self.membership({"rank": event.rank, "host": event.host, "join_refused": event.reason})
        print(f"asgd: join refused: rank {event.rank} (host {event.host}): {event.reason}", file=sys.stderr, flush=True)

    def membership(self, row: dict[str, Any]) -> None:
        """A server.jsonl row of the run's membership: a client lost, joined or refused (on
        disk at once)."""
        self.server_log.write({"time": self.clock(), **row})
        self.server_log.flush()

    def weights(self) -> np.ndarray:
        """The whole weight vector, as a copy of its own: this server's, or every slice."""
        own = self.state.store.weights
        return own.copy() if self.gather is None else self.gather(own)

    def snapshot(self, evaluated: bool = True, checkpoint: bool = True) -> None:
        """The weights for the test error (`evaluated`) and everything to resume from
        (`checkpoint`: with the clients' optimizer states the server holds), copied now
        and written in the background."""
        state, weights, now = self.state, self.weights(), self.clock()
        tally, store = state.tally, state.store
        self.server_log.flush()  # the rows the checkpoint counts are on disk before it is
        self.client_log.flush()
        point = Checkpoint(weights, store.version, now, (self.server_log.lines, self.client_log.lines),
                           (tally.minibatches, tally.samples, tally.rejected), tally.client_steps.copy(),
                           tally.client_pushes.copy(),
                           {k: np.array(v, copy=True) for k, v in state.arrays().items() if k != "weights"}
                           if checkpoint else {},  # the rule's state (K weight copies for DC-ASGD) only to write
                           client_optimizers={c: s.arrays for c, s in state.client_states.items()})
        self.files.submit(save_point, self.run, point, checkpoint, evaluated)
        if evaluated and self.after_snapshot is not None:
            self.files.wait()
            self.after_snapshot()

    def start(self) -> None:
        """The starting state (version 0) as snapshot and checkpoint, on disk before any
        row is: a run interrupted at any moment resumes from here at least."""
        self.snapshot()
        self.files.wait()

    def finish(self) -> None:
        """The last snapshot and checkpoint, every file out, the logs closed."""
        try:
            self.snapshot()
        finally:
            self.close()

    def close(self) -> None:
        """Every file out (a write's error is raised here), the logs closed."""
        try:
            self.files.close()
        finally:
            self.server_log.close()
            self.client_log.close()
