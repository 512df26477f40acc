"""TensorBoard scalars of a run, from its log rows; HParams for a sweep.

    asgd train --tensorboard ...        the recording rank writes RUN/tensorboard/ as rows come
    asgd tensorboard RUN                the same, from a finished (or failed) run directory
    asgd tensorboard SWEEP              every point's, plus HParams, in SWEEP/tensorboard/
    tensorboard --logdir RUN/tensorboard

Both paths feed the same rows, in the order the logs hold them, through `Scalars`, so they
write the same values. Steps are minibatches of all clients (`train/*`, `test/*`) and
server versions (`server/*`); each event's wall time is the run's `time` (virtual seconds
in the simulator), so TensorBoard's "Relative" axis is the run's clock.

- `train/loss`, `train/error`: trailing mean over the last `window` minibatches of all
  clients, in arrival order (window: a twentieth of the run, at most 400).
- `train/lr`: the lr each minibatch trained with (the schedule's), as its row says.
- `test/error`, `test/loss`: eval.jsonl (written after training, from snapshots).
- `server/noise_scale` (B_simple, where pushes are gradients) and `server/fresh_batch`
  (the fresh rule's step) at each window, against samples pushed.
- `server/staleness` per push; `server/pushes_per_s` and `server/busy` (the fraction of
  time spent applying pushes) over the last `RATE_PUSHES` pushes.
"""
from __future__ import annotations

import math
import shutil
import threading
from collections import deque
from pathlib import Path
from typing import Any

from paramserver.config import ConfigError
from paramserver.rundir.layout import RunDir
from paramserver.rundir.smoothing import TrailingMean, window_for

RATE_PUSHES = 50


def summary_writer(folder: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError("tensorboard: the tensorboard package is not installed; pip install tensorboard "
                          "(make setup installs it)") from None
    return SummaryWriter(str(folder), flush_secs=5)


class Scalars:
    """A RunDir tap: `scalars(log, rows)` for every row a run writes (the live curve's
    eval rows come from a thread of their own: one lock guards the writer)."""

    def __init__(self, folder: Path, window: int) -> None:
        self.folder, self.writer = folder, None  # made at the first scalar: after the run directory
        self.lock = threading.Lock()
        self.losses, self.errors = TrailingMean(window), TrailingMean(window)
        self.pushes: deque[tuple[float, float]] = deque(maxlen=RATE_PUSHES)
        self.minibatches = 0

    @classmethod
    def for_run(cls, run: str | Path, config: dict[str, Any]) -> "Scalars":
        window = window_for(config.get("clients") or 1, config.get("steps", 1))
        return cls(Path(run) / "tensorboard", window)

    def __call__(self, log: str, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            if log == "clients":
                self._minibatch(row)
            elif log == "server" and "version" in row:
                self._push(row)
            elif log == "server" and "noise_scale" in row:  # the gradient noise scale, at the samples pushed
                self._add("server/noise_scale", row["noise_scale"], row["samples"], row["time"])
                self._add("server/fresh_batch", row.get("fresh_batch"), row["samples"], row["time"])
            elif log == "eval":
                for key in ("error", "loss"):
                    self._add(f"test/{key}", row[f"test_{key}"], row["minibatches"], row["time"])

    def _minibatch(self, row: dict[str, Any]) -> None:
        self.minibatches += 1
        self._add("train/loss", self.losses.add(row["loss"]), self.minibatches, row["time"])
        self._add("train/error", self.errors.add(row["error"]), self.minibatches, row["time"])
        if "lr" in row:  # rows of runs recorded before schedules have none
            self._add("train/lr", row["lr"], self.minibatches, row["time"])

    def _push(self, row: dict[str, Any]) -> None:
        self.pushes.append((row["time"], row["apply_s"]))
        self._add("server/staleness", row["staleness"], row["version"], row["time"])
        span = self.pushes[-1][0] - self.pushes[0][0]
        if span > 0:
            self._add("server/pushes_per_s", (len(self.pushes) - 1) / span, row["version"], row["time"])
            self._add("server/busy", sum(s for _, s in list(self.pushes)[1:]) / span, row["version"], row["time"])

    def _add(self, tag: str, value: float | None, step: int, time: float) -> None:
        if value is not None and math.isfinite(value):
            with self.lock:
                self.writer = self.writer or summary_writer(self.folder)
                self.writer.add_scalar(tag, value, step, walltime=time)

    def close(self) -> None:
        with self.lock:
            if self.writer is not None:
                self.writer.close()


def write_run(run: Path, folder: Path) -> None:
    """`folder` (emptied first) holds the run's scalars, from its logs."""
    record = RunDir(run)
    config = record.record("config")
    if not config:
        raise ConfigError(f"tensorboard: {run} is not a run directory (no config.json)")
    shutil.rmtree(folder, ignore_errors=True)
    scalars = Scalars(folder, window_for(config.get("clients") or 1, config.get("steps", 1)))
    try:
        for log in ("clients", "server", "eval"):
            scalars(log, record.rows(log))
    finally:
        scalars.close()


def write_sweep(sweep: Path, folder: Path) -> int:
    """Every point's scalars under `folder`/<id>, each with its HParams (grid values, and
    final test error and time as metrics); returns the number of runs written."""
    index = RunDir(sweep).record("index")
    written = 0
    shutil.rmtree(folder, ignore_errors=True)
    for point in index.get("points", []):
        run = sweep / point["run"] if not Path(point["run"]).is_absolute() else Path(point["run"])
        if not (run / "config.json").exists():
            continue
        write_run(run, folder / point["id"])
        summary = RunDir(run).summary()
        hparams = {k: v for k, v in point.items() if k not in ("id", "run", "status") and
                   isinstance(v, (int, float, str, bool))}
        metrics = {f"hparam/{k}": summary[k] for k in ("final_test_error", "time_s")
                   if isinstance(summary.get(k), (int, float))}
        with summary_writer(folder / point["id"]) as writer:
            writer.add_hparams(hparams, metrics, run_name=".")
        written += 1
    return written


def tensorboard(path: str, out: str | None) -> int:
    """`asgd tensorboard RUN_OR_SWEEP [--out DIR]`."""
    where = Path(path)
    folder = Path(out) if out else where / "tensorboard"
    if (where / "index.json").exists():
        count = write_sweep(where, folder)
        print(f"{count} runs with HParams in {folder}; tensorboard --logdir {folder}")
    else:
        write_run(where, folder)
        print(f"scalars in {folder}; tensorboard --logdir {folder}")
    return 0
