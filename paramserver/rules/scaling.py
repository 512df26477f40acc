"""The lr's batch-size scaling: one home for the schedule's (paramserver/schedule.py) and
for `fresh`'s step.
"""
from __future__ import annotations

import math


def batch_scale(scaling: str, minibatches: int) -> float:
    """The lr multiplier for an update that averages `minibatches` client minibatches:
    `linear` (Goyal et al. 2017, arXiv 1706.02677), `sqrt` (Krizhevsky 2014, arXiv
    1404.5997; Hoffer et al. 2017, arXiv 1705.08741: keeps the update's noise as at one
    minibatch) or `none`. The one home of the rule for the schedule and for `fresh`."""
    if scaling == "linear":
        return float(minibatches)
    return math.sqrt(minibatches) if scaling == "sqrt" else 1.0


def ramped_scale(scaling: str, minibatches: int, ramp: float) -> float:
    """`batch_scale` ramped in from 1 (one minibatch's lr) at ramp 0 to its whole value at
    1: Goyal et al.'s gradual warmup, which leaves one client's lr as it is."""
    return 1.0 + (batch_scale(scaling, minibatches) - 1.0) * ramp
