"""The paper's smoothing of training curves, in one place: the trailing mean of the last
`window` minibatches of all clients, merged in time order (400 by default, as the paper).

The figures and reports take a whole log at once (`smoothed`); TensorBoard's scalars
take it row by row as the run writes it (`TrailingMean`); both are this mean. A run too
short for the default gets a twentieth of its minibatches (`window_for`).
"""
from __future__ import annotations

from collections import deque

import numpy as np

WINDOW = 400  # minibatches


def window_for(clients: int, steps: int) -> int:
    """The default window for one run: a twentieth of its minibatches, at most `WINDOW`."""
    return max(1, min(WINDOW, clients * steps // 20))


def smoothed(values: np.ndarray, window: int = WINDOW) -> np.ndarray:
    """The trailing mean over the last `window` of `values` (fewer at the start)."""
    sums = np.concatenate([[0.0], np.cumsum(values, dtype=np.float64)])
    count = np.arange(1, len(values) + 1)
    lo = np.maximum(count - window, 0)
    return (sums[count] - sums[lo]) / (count - lo)


class TrailingMean:
    """`smoothed`, one value at a time."""

    def __init__(self, window: int = WINDOW) -> None:
        self.values: deque[float] = deque(maxlen=window)

    def add(self, value: float) -> float:
        self.values.append(value)
        return sum(self.values) / len(self.values)
