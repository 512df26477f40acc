"""Every comparison of the bench, one way: its two sides take turns, trial by trial.

On a shared machine the speed of the moment drifts by 2x over seconds, so a ratio of two
medians measured one after the other says as much about the moment as about the code.
`interleave(ours, other, trials)` runs, after `warmup` untimed pairs, ours, other, ours,
other, ...; each trial's ratio compares two measurements taken back to back, and the
summary is the median of those per-trial ratios with their interquartile range.

A comparison against a physical lower bound (raw MPI plus the apply; pure compute) whose
median comes out below 1 is impossible: the summary says so (`below_bound`) and
`ratio_cell` prints it as a measurement error, not as a result.
"""
from __future__ import annotations

import statistics
from typing import Callable

SPREAD = "interquartile range"  # of the per-trial ratios: what the tables print beside each median
ERROR = "below the lower bound: measurement error"


def interleave(ours: Callable[[], float], other: Callable[[], float], trials: int, warmup: int = 1,
               lower_bound: bool = False) -> dict:
    """`ours()` and `other()` alternately, `warmup` pairs discarded then `trials` kept; per-trial
    ratios ours / other summarised. `lower_bound`: `other` is a physical lower bound of `ours`."""
    if trials < 1 or warmup < 0:
        raise ValueError(f"trials must be >= 1 and warmup >= 0, got {trials} and {warmup}")
    pairs = []
    for trial in range(warmup + trials):
        pair = ours(), other()  # in this order: a tuple's items are evaluated left to right
        if trial >= warmup:
            pairs.append(pair)
    return summarise([a for a, _ in pairs], [b for _, b in pairs], lower_bound)


def summarise(ours: list[float], other: list[float], lower_bound: bool = False) -> dict:
    """Both sides' per-trial values and medians, and the median and quartiles of their ratios."""
    ratios = [a / b for a, b in zip(ours, other)]
    q1, q3 = (statistics.quantiles(ratios, n=4, method="inclusive")[::2] if len(ratios) > 1
              else (ratios[0], ratios[0]))
    ratio = statistics.median(ratios)
    return {"ours": ours, "other": other, "ours_median": statistics.median(ours),
            "other_median": statistics.median(other), "ratios": ratios, "ratio": ratio, "ratio_q1": q1,
            "ratio_q3": q3, "spread": SPREAD, "lower_bound": lower_bound,
            "below_bound": lower_bound and ratio < 1}


def ratio_cell(summary: dict) -> str:
    """'1.22 (1.10-1.35)': the median per-trial ratio and its interquartile range, or the
    median flagged as a measurement error when it is below a physical lower bound."""
    if summary["below_bound"]:
        return f"{summary['ratio']:.2f} ({ERROR})"
    return f"{summary['ratio']:.2f} ({summary['ratio_q1']:.2f}-{summary['ratio_q3']:.2f})"
