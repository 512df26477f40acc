"""The user's metric (`--metric package.module:function`): how it is called, summed over a
test pass, named and read.

    def perplexity(outputs, targets):            # each test batch, in eval mode, no grad
        total = nn.functional.cross_entropy(outputs.flatten(0, 1), targets.flatten(), reduction="sum")
        return total, targets.numel()             # a (total, count) pair: summed over batches
    perplexity.finish = math.exp                  # applied once to total / count
    perplexity.higher_is_better = False           # the default; accuracy would say True

A batch's number (a float or a one-element tensor) is the batch's mean, weighted by its
items (`len(targets)`); a `(total, count)` pair is summed over the batches and divided
once, so a mean over tokens, not over batches, and with `finish`, any function of it
(perplexity = exp of the mean token loss), is what the curve shows. The metric's name is
its `name` attribute, else the function's own; its direction, `higher_is_better` (False
unless set). Both go into config.json (`metric_traits`), so that the report, TensorBoard
and the stop rule read them without importing user code (rundir/measure.py).
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch

from clients.user.code import resolve
from runconfig.settings import USER_CODE, ConfigError
from rundir.measure import METRIC_HIGHER, METRIC_NAME


def metric_function(spec: str) -> Callable | None:
    """The user's metric, or None without one."""
    return resolve(spec, "metric") if spec else None


def metric_traits(spec: str) -> dict[str, Any]:
    """The metric's name and direction as config.json records them ({} without a metric);
    a ConfigError naming `metric` where its attributes are not a name, a bool, a function."""
    metric = metric_function(spec)
    if metric is None:
        return {}
    name = getattr(metric, "name", None) or getattr(metric, "__name__", None) or USER_CODE.fullmatch(spec)["name"]
    higher = getattr(metric, "higher_is_better", False)
    finish = getattr(metric, "finish", None)
    if not isinstance(name, str) or not isinstance(higher, bool) or not (finish is None or callable(finish)):
        raise ConfigError(f"metric: {spec}'s attributes must be name (a str), higher_is_better (a bool) and "
                          f"finish (a function of one number); got {name!r}, {higher!r}, {finish!r}")
    return {METRIC_NAME: name, METRIC_HIGHER: higher}


class MetricTally:
    """The metric over one test pass: `add` each batch, then `value()`."""

    def __init__(self, metric: Callable):
        self.metric = metric
        self.total, self.count = 0.0, 0.0

    def add(self, outputs: torch.Tensor, targets: torch.Tensor) -> None:
        value = self.metric(outputs, targets)
        if isinstance(value, (tuple, list)):
            total, count = value
            self.total, self.count = self.total + float(total), self.count + float(count)
        else:  # a batch's mean
            self.total, self.count = self.total + float(value) * len(targets), self.count + len(targets)

    def value(self) -> float:
        mean = self.total / self.count if self.count else math.nan
        finish = getattr(self.metric, "finish", None)
        return mean if finish is None else float(finish(mean))
