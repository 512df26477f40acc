"""Reading run directories and smoothing their curves (numpy only)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from rundir.layout import RunDir
from rundir.smoothing import WINDOW, smoothed


def load_log(run_dir: str | Path, log: str) -> list[dict]:
    return RunDir(run_dir).rows(log)


def load_json(run_dir: str | Path, name: str) -> dict:
    return RunDir(run_dir).record(name)


def smoothed_curve(rows: list[dict], window: int = WINDOW,
                   column: str = "error") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(time, minibatches, values): the paper's smoothed training curve
    (rundir/smoothing.py) of one column of all clients' rows (`error`, or
    `loss` where the run has no error rate) merged in time order."""
    rows = sorted(rows, key=lambda r: r["time"])
    time = np.array([r["time"] for r in rows], dtype=np.float64)
    values = np.array([r[column] for r in rows], dtype=np.float64)
    return time, np.arange(1, len(values) + 1), smoothed(values, window)
