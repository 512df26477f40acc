"""Test error and loss of saved weight snapshots, after training.

Evaluating from snapshots, once the clients are done, keeps evaluation out of the
timings that the curves plot: no client ever waits for a test pass.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from clients.data import Split
from clients.models import load_flat
from paramserver.rundir import RunDir
from paramserver.runlog import load_arrays


@torch.no_grad()
def test_metrics(model: nn.Module, split: Split, limit: int = 0, batch_size: int = 500) -> tuple[float, float]:
    """(error rate, mean cross-entropy) over the first `limit` test samples (0: all)."""
    model.eval()
    device = next(model.parameters()).device
    n = min(limit or len(split), len(split))
    wrong, loss = 0, 0.0
    for start in range(0, n, batch_size):
        x, y = split.batch(np.arange(start, min(start + batch_size, n)))
        x, y = x.to(device), y.to(device)
        logits = model(x)
        loss += nn.functional.cross_entropy(logits, y, reduction="sum").item()
        wrong += (logits.argmax(1) != y).sum().item()
    return wrong / n, loss / n


def evaluate_snapshots(run: RunDir, model: nn.Module, split: Split,
                       limit: int = 0, keep: bool = False) -> list[dict]:
    """Append an eval.jsonl row per snapshot (oldest first); delete snapshots unless `keep`."""
    rows = []
    with run.writer("eval") as log:
        for version, path in run.snapshots():
            arrays = load_arrays(path, checksummed=True)
            load_flat(model, arrays["weights"])
            error, loss = test_metrics(model, split, limit)
            time, minibatches = arrays["meta"]
            row = {"version": version, "time": float(time), "minibatches": int(minibatches),
                   "test_error": error, "test_loss": loss}
            log.write(row)
            rows.append(row)
            if not keep:
                path.unlink()
    return rows
