"""The lr's batch-size scaling: one home for the schedule's (paramserver/schedule.py) and
for `fresh`'s step, whose `adascale` gain comes from the measured gradient noise.
"""
from __future__ import annotations

import math


def batch_scale(scaling: str, minibatches: int) -> float:
    """The lr multiplier for an update that averages `minibatches` client minibatches:
    `linear` (Goyal et al. 2017, arXiv 1706.02677), `sqrt` (Krizhevsky 2014, arXiv
    1404.5997; Hoffer et al. 2017, arXiv 1705.08741: keeps the update's noise as at one
    minibatch) or `none`; `adascale`'s is not fixed by the count but measured (`gain`,
    which only `fresh` applies), so here it is 1. The one home of the rule for the
    schedule and for `fresh`."""
    if scaling == "linear":
        return float(minibatches)
    return math.sqrt(minibatches) if scaling == "sqrt" else 1.0


def ramped_scale(scaling: str, minibatches: int, ramp: float) -> float:
    """`batch_scale` ramped in from 1 (one minibatch's lr) at ramp 0 to its whole value at
    1: Goyal et al.'s gradual warmup, which leaves one client's lr as it is."""
    return 1.0 + (batch_scale(scaling, minibatches) - 1.0) * ramp


def gain(minibatches: int, noise_scale: float | None, batch_size: int) -> float:
    """AdaScale's gain (Johnson et al., ICML 2020, arXiv 2007.05105) for a step averaging
    S = `minibatches` minibatches of `batch_size` samples: r = (s2 + g2) / (s2 / S + g2),
    s2 the variance of one minibatch's gradient, g2 the squared norm of the true one; in
    the noise scale B = tr(Sigma) / |G|^2 = s2 b / g2 (McCandlish et al. 2018) that is

        r = (1 + B / b) / (1 + B / (S b)) = S (b + B) / (S b + B),

    1 where the noise is small (B << b: a bigger batch buys nothing), S where it dominates
    (B >> S b: the linear rule), 1 at S = 1. `noise_scale` None: no signal above the
    noise (the estimate of |G|^2 is not positive), B infinite, r = S. A negative estimate
    (noise below what one window can resolve) counts as 0: r stays in [1, S]."""
    if noise_scale is None:
        return float(minibatches)
    noise = max(0.0, noise_scale)
    return minibatches * (batch_size + noise) / (minibatches * batch_size + noise)
