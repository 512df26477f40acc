"""Test error and loss of saved weight snapshots: the curve live, the final number after training.

Evaluating from snapshots keeps evaluation out of the timings that the curves plot: no
client ever waits for a test pass. `LiveCurve` measures each snapshot as it lands, on a
thread of its own beside the recording rank's work (the server's loop, or rank 0's
client in the collective modes), so eval.jsonl, and TensorBoard with it, grow while the
run trains; torch's kernels let go of the interpreter, so the thread takes a core's
time, not the server's turn. The curve's points are measured on one fixed, seeded subset
of the test split (`curve_samples`: 1,000 by default, as many as `eval_samples` says, or
the whole split when it is smaller), the final weights once more on the whole split,
after training: a short run is not dominated by its test passes, and its final number
is the honest one.

Every item a point needs is read once a run (`EvalItems`): the curve's test samples and
the BatchNorm recalibration batches, so a user's `__getitem__` runs once an item, not
once a snapshot (that was 12 of a 15-second evaluation).

Buffers: the flat weight vector holds parameters only, so a model with BatchNorm gets
its running statistics afresh for every weights it is evaluated (or exported) with
(`recalibrate`: forward passes in training mode over a fixed, seeded set of training
batches, as `torch.optim.swa_utils.update_bn` does for averaged weights). The server's
weights are a mix of every client's work, so no client's own statistics would fit them.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from clients.client import wrong
from clients.data import Split
from clients.user.metric import MetricTally
from clients.models import load_flat
from rundir.durable import load_arrays, save_arrays
from rundir.layout import RunDir
from rundir.measure import Stop, curve_measure

CURVE_SAMPLES = 1000  # test samples per point of the curve unless eval_samples says
_CURVE_STREAM = 0xC0  # the seeded choice of them
RECALIBRATE_SAMPLES = 256  # training samples whose statistics BatchNorm layers take
_RECALIBRATE_STREAM = 0xB7  # the seeded order they are drawn in: no client's
EVAL_BATCH = 256  # test items a forward pass


def has_running_stats(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats for m in model.modules())


def calibration_batches(train: Split, seed: int, batch_size: int = 128) -> list[torch.Tensor]:
    """The training inputs BatchNorm's statistics are taken over: a fixed, seeded set."""
    order = np.random.default_rng([seed, _RECALIBRATE_STREAM]).permutation(len(train))[:RECALIBRATE_SAMPLES]
    return [train.batch(order[i:i + batch_size])[0] for i in range(0, len(order), batch_size)]


def recalibrate(model: nn.Module, train: Split, seed: int) -> None:
    """BatchNorm running statistics for the model's current weights (nothing without BatchNorm)."""
    if has_running_stats(model):
        _update_bn(model, calibration_batches(train, seed))


@torch.no_grad()
def _update_bn(model: nn.Module, batches: list[torch.Tensor]) -> None:
    torch.optim.swa_utils.update_bn(batches, model, next(model.parameters()).device)


def curve_samples(size: int, eval_samples: int, seed: int) -> np.ndarray:
    """The test samples every point of the curve is measured on: a fixed seeded subset."""
    n = min(eval_samples or CURVE_SAMPLES, size)
    if n == size:
        return np.arange(size)
    return np.sort(np.random.default_rng([seed, _CURVE_STREAM]).choice(size, n, replace=False))


Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Metric = Callable[[torch.Tensor, torch.Tensor], Any]  # the user's: clients/user/metric.py


def test_metrics(model: nn.Module, split: Split, samples: np.ndarray | None = None, batch_size: int = EVAL_BATCH,
                 loss: Loss | None = None) -> tuple[float, float]:
    """(error rate, mean loss; cross-entropy by default) over `samples` of the split (None: all)."""
    scores = split_scores(model, split, samples, batch_size, loss)
    return scores["test_error"], scores["test_loss"]


@torch.no_grad()
def split_scores(model: nn.Module, split: Split, samples: np.ndarray | None = None, batch_size: int = EVAL_BATCH,
                 loss: Loss | None = None, metric: Metric | None = None) -> dict[str, float]:
    """test_error, test_loss and, with the user's `metric`, test_metric, over `samples` of
    the split (None: all)."""
    samples = np.arange(len(split)) if samples is None else samples
    batches = (split.batch(samples[start:start + batch_size]) for start in range(0, len(samples), batch_size))
    return _scores(model, batches, len(samples), loss, metric)


def _scores(model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]], n: int,
            loss: Loss | None, metric: Metric | None) -> dict[str, float]:
    model.eval()
    device = next(model.parameters()).device
    errors, total = 0.0, 0.0
    tally = MetricTally(metric) if metric is not None else None
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        outputs = model(x)
        if loss is None:
            total += nn.functional.cross_entropy(outputs, y, reduction="sum").item()
        else:  # the user's loss is a mean over the batch, as in training
            total += loss(outputs, y).item() * len(y)
        errors += wrong(outputs, y)
        if tally is not None:
            tally.add(outputs, y)
    scores = {"test_error": errors / n, "test_loss": total / n}
    return scores if tally is None else {**scores, "test_metric": tally.value()}


@dataclass
class EvalItems:
    """What every point of the curve is measured on, read once: the curve's test batches
    and, for a model with BatchNorm, the recalibration batches."""

    curve: list[tuple[torch.Tensor, torch.Tensor]]
    samples: int
    calibration: list[torch.Tensor] | None
    whole: bool           # the curve's samples are the whole test split

    @classmethod
    def read(cls, model: nn.Module, test: Split, samples: np.ndarray, train: Split | None, seed: int,
             batch_size: int = EVAL_BATCH) -> "EvalItems":
        curve = [test.batch(samples[i:i + batch_size]) for i in range(0, len(samples), batch_size)]
        calibration = calibration_batches(train, seed) if train is not None and has_running_stats(model) else None
        return cls(curve, len(samples), calibration, len(samples) == len(test))

    def load(self, model: nn.Module, weights: np.ndarray) -> None:
        """The model with `weights`, and BatchNorm's statistics for them."""
        load_flat(model, weights)
        if self.calibration is not None:
            _update_bn(model, self.calibration)

    @torch.no_grad()
    def measure(self, model: nn.Module, weights: np.ndarray, loss: Loss | None,
                metric: Metric | None = None) -> dict[str, float]:
        """The scores of `weights` on the curve's samples."""
        self.load(model, weights)
        return _scores(model, self.curve, self.samples, loss, metric)


def curve_row(items: EvalItems, model: nn.Module, version: int, path: Path, loss: Loss | None,
              metric: Metric | None = None) -> dict:
    """A snapshot's eval.jsonl row: its point of the curve."""
    arrays = load_arrays(path, checksummed=True)
    at, minibatches = arrays["meta"]
    return {"version": version, "time": float(at), "minibatches": int(minibatches),
            **items.measure(model, arrays["weights"], loss, metric)}


class LiveCurve:
    """The curve as the run goes: with a `share`, a thread that measures every snapshot
    once it lands (looking every POLL_S), oldest first, appending its row to eval.jsonl (and,
    through the run directory's tap, to TensorBoard). While the run trains the thread rests
    after each point so that it measures at most `share` of the time (LIVE_SHARE where its
    host has a core to spare; SHARED_CORE_SHARE, a trickle, where the run's ranks fill the
    cores, so that the curve shows while a client loses little of its core and the server
    few turns at the interpreter); what is left when training ends, `finish` measures at
    full speed (all of it, with a share of 0). A snapshot measured before (a resumed run's)
    is not measured again. `stops`: the run's stop rules (rundir/measure.py);
    the first point that reaches one is `reached`, and the rule `stopped_by`."""

    POLL_S = 0.5
    LIVE_SHARE = 0.25
    SHARED_CORE_SHARE = 0.05

    def __init__(self, run: RunDir, model: nn.Module, read: Callable[[], EvalItems], loss: Loss | None,
                 share: float = LIVE_SHARE, stops: Sequence[Stop] = (), metric: Metric | None = None):
        self.run, self.model, self.read, self.loss, self.stops = run, model, read, loss, list(stops)
        self.share = share
        self.metric = metric
        self.measured = {row["version"] for row in run.rows("eval")}
        self.reached: dict | None = None  # the first point that reached a stop rule's target
        self.stopped_by: Stop | None = None
        self.live = 0                     # points measured while the run trained
        self.items: EvalItems | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="asgd-live-curve", daemon=True) if share else None
        if self.thread is not None:
            self.thread.start()

    def _run(self) -> None:
        try:
            self.items = self.read()
            with self.run.writer("eval") as log:
                while not self.done.is_set():
                    self.live += self._measure_new(log, rest=True)
                    self.done.wait(self.POLL_S)
        except BaseException as error:  # noqa: BLE001 - raised again by finish, on the run's thread
            self.error = error

    def _measure_new(self, log, rest: bool = False, progress: Callable[[int], None] = lambda done: None) -> int:
        """Measure the snapshots not measured yet; returns how many. `rest`: pause after
        each point for (1 / share - 1) times its time, ending early when training does."""
        new = [(v, p) for v, p in self.run.snapshots() if v not in self.measured]
        for done, (version, path) in enumerate(new, start=1):
            start = time.perf_counter()
            row = curve_row(self.items, self.model, version, path, self.loss, self.metric)
            log.write(row)
            log.flush()
            self.measured.add(version)
            if self.reached is None:
                self.stopped_by = next((stop for stop in self.stops if stop.reached(row)), None)
                self.reached = row if self.stopped_by is not None else None
            progress(done)
            if rest and self.done.wait((time.perf_counter() - start) * (1 / self.share - 1)):
                return done
        return len(new)

    @property
    def inline(self) -> bool:
        """A stop rule with no thread to watch for it: each snapshot is measured as it is taken."""
        return bool(self.stops) and self.thread is None

    def catch_up(self, progress: Callable[[int], None] = lambda done: None) -> None:
        """The snapshots on disk measured now, on the caller's thread (a curve that is not
        live: the simulator's, so that a target stops a run at the same point every time)."""
        self.items = self.items or self.read()
        with self.run.writer("eval") as log:
            self._measure_new(log, progress=progress)

    def pending(self) -> int:
        return sum(1 for v, _ in self.run.snapshots() if v not in self.measured)

    def finish(self, progress: Callable[[int], None] = lambda done: None) -> EvalItems:
        """Training is over: the thread stops, the snapshots it had not reached are
        measured here; a failure of the thread is raised here."""
        self.stop()
        if self.error is not None:
            raise self.error
        self.catch_up(progress)
        return self.items

    def stop(self) -> None:
        """Training ended (or failed): the thread ends after the point it is measuring, and
        a point measured from now on reaches no target (the run can no longer stop at it)."""
        self.stops = []
        self.done.set()
        if self.thread is not None:
            self.thread.join()


def keep_best(run: RunDir, config: Mapping[str, Any]) -> dict:
    """The curve's best point in the run's measure (`curve_measure`, from `config`; the
    earliest of equals) saved to best.npz, unless the one kept before (by the run a resume
    continues) is better; returns its version and value (`best_test_error`, or
    `best_test_loss`, `best_test_metric`)."""
    snapshots, rows = dict(run.snapshots()), run.rows("eval")
    if not rows:
        return {}
    measure = curve_measure(config, rows[0]["test_error"])
    points = [row for row in rows if row["version"] in snapshots and measure.key in row]  # a resume's new metric
    kept = load_arrays(run.best_path, checksummed=True) if run.best_path.exists() else None
    best = min(points, key=lambda row: (measure.badness(row[measure.key]), row["version"]), default=None)
    if best is not None and (kept is None or
                             measure.badness(best[measure.key]) < measure.badness(float(kept["point"][1]))):
        arrays = load_arrays(snapshots[best["version"]], checksummed=True)
        save_arrays(run.best_path, {"weights": arrays["weights"], "meta": arrays["meta"],
                                    "point": np.array([best["version"], best[measure.key]], np.float64)})
        return {"best_version": best["version"], f"best_{measure.key}": best[measure.key]}
    if kept is None:  # no point of the curve left a snapshot
        return {}
    version, value = kept["point"]
    return {"best_version": int(version), f"best_{measure.key}": float(value)}


def final_measurement(run: RunDir, items: EvalItems, model: nn.Module, test: Split, loss: Loss | None,
                      keep: bool, metric: Metric | None = None) -> dict:
    """The last snapshot's weights on the whole test split (test_error, test_loss,
    [test_metric,] samples); the snapshots deleted unless `keep`."""
    snapshots = run.snapshots()
    last = run.rows("eval")[-1]
    whole = {k: v for k, v in last.items() if k.startswith("test_")}
    if not items.whole:
        items.load(model, load_arrays(snapshots[-1][1], checksummed=True)["weights"])
        whole = split_scores(model, test, loss=loss, metric=metric)
    if not keep:
        for _, path in snapshots:
            run.drop_snapshot(path)
    return {**whole, "samples": len(test)}
