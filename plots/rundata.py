"""Reading run directories and smoothing their curves (numpy only)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from paramserver.rundir.layout import RunDir


def load_log(run_dir: str | Path, log: str) -> list[dict]:
    return RunDir(run_dir).rows(log)


def load_json(run_dir: str | Path, name: str) -> dict:
    return RunDir(run_dir).record(name)


def smoothed_error(rows: list[dict], window: int = 400) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(time, minibatches, error): the trailing mean over the last `window` minibatches
    of all clients merged in time order, as the paper smoothed its training curves."""
    rows = sorted(rows, key=lambda r: r["time"])
    time = np.array([r["time"] for r in rows], dtype=np.float64)
    error = np.array([r["error"] for r in rows], dtype=np.float64)
    sums = np.concatenate([[0.0], np.cumsum(error)])
    count = np.arange(1, len(error) + 1)
    lo = np.maximum(count - window, 0)
    return time, count, (sums[count] - sums[lo]) / (count - lo)
