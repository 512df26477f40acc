"""TensorBoard scalars of a run, from its log rows, and its HParams.

    asgd train --tensorboard ...        the recording rank writes RUN/tensorboard/ as rows come
    asgd tensorboard RUN                the same, from a finished (or failed) run directory
    asgd tensorboard SWEEP              every point's, in SWEEP/tensorboard/<id>/
    tensorboard --logdir RUN/tensorboard

Both paths feed the same rows, in the order the logs hold them, through `Scalars`, so they
write the same values. Steps are minibatches of all clients (`train/*`, `test/*`) and
server versions (`server/*`). Each event's wall time is the run's start on the wall clock
(config.json's provenance `start_time`, to the second, taken during setup, before any
warm start, which the run's clock does not count) plus the row's `time`, so
TensorBoard's "Relative" axis is the run's clock and its "Wall" axis the date it ran.
In the simulator `time` is virtual: the wall axis is then the real start
plus virtual seconds, not when each row was computed. A resumed run's rows follow its
first start as if it never paused; a run recorded without a start time counts from 1970.
Closed, each run's folder gets HParams: its settings (a sweep's point: its grid values)
with its final value in the run's measure (`hparam/final_test_error`, or `final_test_loss`,
`final_test_metric`: rundir/measure.py) and time as metrics.

- `train/loss`, `train/error`: trailing mean over the last `window` minibatches of all
  clients, in arrival order (window: a twentieth of the run, at most 400).
- `train/lr`: the lr each minibatch trained with (the schedule's), as its row says.
- `test/error`, `test/loss`: eval.jsonl (measured from snapshots); the user's metric as
  `test/<its name>` (`test/perplexity`; clients/user/metric.py).
- `server/noise_scale` (B_simple, where pushes are gradients), `server/fresh_batch`
  (the fresh rule's step) and `server/gain` (its lr gain under adascale) at each window,
  against samples pushed (under adascale, the gain-weighted progress).
- `server/staleness` per push; `server/pushes_per_s` and `server/busy` (the fraction of
  time spent applying pushes) over the last `RATE_PUSHES` pushes.
"""
from __future__ import annotations

import math
import shutil
import threading
from collections import deque
from dataclasses import fields
from datetime import datetime
from pathlib import Path
from typing import Any

from experiments.run.provenance import START_TIME
from runconfig.settings import ConfigError, RunConfig
from rundir.layout import RunDir
from rundir.measure import ERROR, LOSS, METRIC, metric_measure, recorded_measure
from rundir.smoothing import TrailingMean, window_for

RATE_PUSHES = 50


def summary_writer(folder: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError("tensorboard: the tensorboard package is not installed; pip install tensorboard "
                          "(make setup installs it)") from None
    return SummaryWriter(str(folder), flush_secs=5)


def start_epoch(config: dict[str, Any]) -> float:
    """The wall clock at the run's start, in seconds since 1970; 0 for a run recorded
    without it (the events then sit where they always did)."""
    try:
        return datetime.strptime(config["provenance"]["start_time"], START_TIME).timestamp()
    except (KeyError, TypeError, ValueError):
        return 0.0


class Scalars:
    """A RunDir tap: `scalars(log, rows)` for every row run `run` writes; `close()` adds its
    HParams (`hparams`, by default its settings). The run's config.json is read when the
    first event is written, after the run wrote it (live) or long after (from the logs),
    so both paths place events alike."""

    def __init__(self, run: Path, folder: Path, window: int, hparams: dict[str, Any] | None = None) -> None:
        self.run, self.folder, self.hparams = RunDir(run), folder, hparams
        self.writer, self.start = None, 0.0  # made at the first scalar: after the run directory
        self.tests: dict[str, str] | None = None  # eval.jsonl's columns and their tags, read with config.json
        self.lock = threading.Lock()  # the live curve's eval rows come from a thread of their own
        self.losses, self.errors = TrailingMean(window), TrailingMean(window)
        self.pushes: deque[tuple[float, float]] = deque(maxlen=RATE_PUSHES)
        self.minibatches = 0

    @classmethod
    def for_run(cls, run: str | Path, config: dict[str, Any]) -> "Scalars":
        window = window_for(config.get("clients") or 1, config.get("steps", 1))
        return cls(Path(run), Path(run) / "tensorboard", window)

    def __call__(self, log: str, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            if log == "clients":
                self._minibatch(row)
            elif log == "server" and "version" in row:
                self._push(row)
            elif log == "server" and "noise_scale" in row:  # the gradient noise scale, at the samples pushed
                self._add("server/noise_scale", row["noise_scale"], row["samples"], row["time"])
                self._add("server/fresh_batch", row.get("fresh_batch"), row["samples"], row["time"])
                self._add("server/gain", row.get("gain"), row["samples"], row["time"])
                self._add("server/grad_norm", row.get("grad_norm"), row["samples"], row["time"])
            elif log == "eval":
                for key, tag in self._test_tags().items():
                    self._add(tag, row.get(key), row["minibatches"], row["time"])

    def _test_tags(self) -> dict[str, str]:
        """The tag of each test column: the metric's named as config.json records it."""
        if self.tests is None:
            metric = metric_measure(self.run.record("config")).name
            self.tests = {ERROR: "test/error", LOSS: "test/loss", METRIC: f"test/{metric}"}
        return self.tests

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
                self._open().add_scalar(tag, value, step, walltime=self.start + time)

    def _open(self) -> Any:
        if self.writer is None:
            self.start = start_epoch(self.run.record("config"))
            self.writer = summary_writer(self.folder)
        return self.writer

    def close(self) -> None:
        """Last, so the metrics are the summary's (written just before, live)."""
        config = self.run.record("config")
        if config:
            summary = self.run.summary()
            final = f"final_{recorded_measure(self.run.path).key}"
            metrics = {f"hparam/{k}": summary[k] for k in (final, "time_s")
                       if isinstance(summary.get(k), (int, float)) and math.isfinite(summary[k])}
            self._hparams(settings(config) if self.hparams is None else self.hparams, metrics,
                          summary.get("time_s") or 0.0)
        if self.writer is not None:
            self.writer.close()

    def _hparams(self, hparams: dict[str, Any], metrics: dict[str, float], time: float) -> None:
        """HParams as SummaryWriter.add_hparams writes them, but into this folder's own
        events and at the run's end (start plus `time`), not at the moment of writing: so the
        live run and `asgd tensorboard RUN` write the same."""
        from torch.utils.tensorboard.summary import hparams as hparams_summaries

        writer = self._open()
        for summary in hparams_summaries(hparams, metrics):
            writer.file_writer.add_summary(summary, walltime=self.start + time)
        for tag, value in metrics.items():
            writer.add_scalar(tag, value, walltime=self.start + time)


def settings(config: dict[str, Any]) -> dict[str, Any]:
    """A run's settings as HParams: its config's keys (config.json holds more: provenance,
    the data's fingerprint), those TensorBoard can show."""
    return plain(config, [key.name for key in fields(RunConfig)])


def plain(values: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    """The values of `keys` that HParams take: numbers, strings, booleans (not None)."""
    return {key: values[key] for key in keys if isinstance(values.get(key), (int, float, str, bool))}


def write_run(run: Path, folder: Path, hparams: dict[str, Any] | None = None) -> None:
    """`folder` (emptied first) holds the run's scalars, from its logs, and its HParams
    (`hparams`, by default its settings)."""
    record = RunDir(run)
    config = record.record("config")
    if not config:
        raise ConfigError(f"tensorboard: {run} is not a run directory (no config.json)")
    shutil.rmtree(folder, ignore_errors=True)
    scalars = Scalars(run, folder, window_for(config.get("clients") or 1, config.get("steps", 1)), hparams)
    try:
        for log in ("clients", "server", "eval"):
            scalars(log, record.rows(log))
    finally:
        scalars.close()


def write_sweep(sweep: Path, folder: Path) -> int:
    """Every point's scalars under `folder`/<id>, each with its HParams (grid values, and
    the final value in the run's measure and time as metrics); returns the number of runs written."""
    index = RunDir(sweep).record("index")
    written = 0
    shutil.rmtree(folder, ignore_errors=True)
    for point in index.get("points", []):
        run = sweep / point["run"] if not Path(point["run"]).is_absolute() else Path(point["run"])
        if not (run / "config.json").exists():
            continue
        write_run(run, folder / point["id"], plain(point, [k for k in point if k not in ("id", "run", "status")]))
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
        print(f"scalars and HParams in {folder}; tensorboard --logdir {folder}")
    return 0
