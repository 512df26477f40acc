"""Test error and loss of saved weight snapshots, after training.

Evaluating from snapshots, once the clients are done, keeps evaluation out of the
timings that the curves plot: no client ever waits for a test pass. The curve's points
are measured on one fixed, seeded subset of the test split (`curve_samples`: 2,000 by
default, as many as `eval_samples` says, or the whole split when it is smaller), the
final weights once more on the whole split: a short run is not dominated by its test
passes, and its final number is the honest one.

Buffers: the flat weight vector holds parameters only, so a model with BatchNorm gets
its running statistics afresh for every weights it is evaluated (or exported) with
(`recalibrate`: forward passes in training mode over a fixed, seeded set of training
batches, as `torch.optim.swa_utils.update_bn` does for averaged weights). The server's
weights are a mix of every client's work, so no client's own statistics would fit them.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from torch import nn

from clients.client import wrong
from clients.data import Split
from clients.models import load_flat
from paramserver.rundir.durable import load_arrays
from paramserver.rundir.layout import RunDir

CURVE_SAMPLES = 2000  # test samples per point of the curve unless eval_samples says
_CURVE_STREAM = 0xC0  # the seeded choice of them
RECALIBRATE_SAMPLES = 1024  # training samples whose statistics BatchNorm layers take
_RECALIBRATE_STREAM = 0xB7  # the seeded order they are drawn in: no client's


def has_running_stats(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats for m in model.modules())


@torch.no_grad()
def recalibrate(model: nn.Module, train: Split, seed: int, batch_size: int = 128) -> None:
    """BatchNorm running statistics for the model's current weights (nothing without BatchNorm)."""
    if not has_running_stats(model):
        return
    device = next(model.parameters()).device
    order = np.random.default_rng([seed, _RECALIBRATE_STREAM]).permutation(len(train))[:RECALIBRATE_SAMPLES]
    batches = (train.batch(order[i:i + batch_size])[0] for i in range(0, len(order), batch_size))
    torch.optim.swa_utils.update_bn(batches, model, device)


def curve_samples(size: int, eval_samples: int, seed: int) -> np.ndarray:
    """The test samples every point of the curve is measured on: a fixed seeded subset."""
    n = min(eval_samples or CURVE_SAMPLES, size)
    if n == size:
        return np.arange(size)
    return np.sort(np.random.default_rng([seed, _CURVE_STREAM]).choice(size, n, replace=False))


@torch.no_grad()
def test_metrics(model: nn.Module, split: Split, samples: np.ndarray | None = None, batch_size: int = 500,
                 loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None) -> tuple[float, float]:
    """(error rate, mean loss; cross-entropy by default) over `samples` of the split (None: all)."""
    model.eval()
    device = next(model.parameters()).device
    samples = np.arange(len(split)) if samples is None else samples
    n = len(samples)
    errors, total = 0.0, 0.0
    for start in range(0, n, batch_size):
        x, y = split.batch(samples[start:start + batch_size])
        x, y = x.to(device), y.to(device)
        outputs = model(x)
        if loss is None:
            total += nn.functional.cross_entropy(outputs, y, reduction="sum").item()
        else:  # the user's loss is a mean over the batch, as in training
            total += loss(outputs, y).item() * len(y)
        errors += wrong(outputs, y)
    return errors / n, total / n


def evaluate_snapshots(run: RunDir, model: nn.Module, split: Split, samples: np.ndarray, keep: bool = False,
                       loss: Callable | None = None, train: Split | None = None, seed: int = 0,
                       progress: Callable[[int], None] = lambda done: None) -> tuple[list[dict], dict]:
    """Append an eval.jsonl row per snapshot (oldest first), measured on `samples` of the
    split, and measure the last one on the whole split too; delete snapshots unless
    `keep`. With `train`, BatchNorm statistics are recalibrated for each snapshot's
    weights. Returns the rows and the final measurement (test_error, test_loss, samples)."""
    rows, final = [], {}
    snapshots = run.snapshots()
    with run.writer("eval") as log:
        for done, (version, path) in enumerate(snapshots, start=1):
            arrays = load_arrays(path, checksummed=True)
            load_flat(model, arrays["weights"])
            if train is not None:
                recalibrate(model, train, seed)
            error, test_loss = test_metrics(model, split, samples, loss=loss)
            time, minibatches = arrays["meta"]
            row = {"version": version, "time": float(time), "minibatches": int(minibatches),
                   "test_error": error, "test_loss": test_loss}
            log.write(row)
            rows.append(row)
            if done == len(snapshots):
                whole = (error, test_loss) if len(samples) == len(split) else test_metrics(model, split, loss=loss)
                final = {"test_error": whole[0], "test_loss": whole[1], "samples": len(split)}
            if not keep:
                run.drop_snapshot(path)
            progress(done)
    return rows, final
