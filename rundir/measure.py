"""What a run's curve measures, and the stop rules on it: decided here alone.

The rule: the classification error where the run has one (outputs that classify, as
clients/client.py's `classifies` says; its test error is then a number, else NaN); else
the user's metric, named and with its direction, where the run has one; else the test
loss. Error first, because the paper's figures, the sweeps' targets and every classifier
run recorded so far are read in error, and a classifier's metric (top-5 accuracy, say)
stays a column beside it; on a model without classes the user's metric comes before the
loss because the user chose it as the number that matters (perplexity, a token-weighted
mean). Everything after training reads the run's measure through `curve_measure` (a
recorded run's, `recorded_measure`): the best point (`keep_best`), the final console
line, the summary, `asgd report`'s line and figure, a sweep's curves, TensorBoard's HParams.

The metric's name and direction are the metric function's own (clients/user/code.py's
`metric_traits`), recorded in config.json as `metric_name` and `metric_higher_is_better`,
so readers of a run directory (plots, report, TensorBoard) need no user code.

Stop rules (`stop_at_error`, `stop_at_loss`, `stop_at_metric`; 0: none) each watch their
own column, whatever the curve's measure: the first point of the curve at or past any
target (at or below; at or above for a metric whose higher is better) stops the run.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from rundir.layout import RunDir

ERROR, LOSS, METRIC = "test_error", "test_loss", "test_metric"  # eval.jsonl's columns
METRIC_NAME, METRIC_HIGHER = "metric_name", "metric_higher_is_better"  # config.json's record of the metric


@dataclass(frozen=True)
class Measure:
    """One column of the curve: `key` in eval.jsonl (the summary's `final_<key>`), `name` for
    people, and which way is better."""

    key: str
    name: str
    higher_is_better: bool = False

    @property
    def train_key(self) -> str:
        """The clients.jsonl column drawn beside it: training error, else training loss (a
        metric is measured on test batches only)."""
        return "error" if self.key == ERROR else "loss"

    @property
    def percent(self) -> bool:
        """An error is read in percent."""
        return self.key == ERROR

    def badness(self, value: float) -> float:
        """Lower is better, whichever way the measure goes (for sorting points)."""
        return -value if self.higher_is_better else value

    def reached(self, value: float, target: float) -> bool:
        return value >= target if self.higher_is_better else value <= target

    def direction(self) -> str:
        return "higher is better" if self.higher_is_better else "lower is better"


def metric_measure(config: Mapping[str, Any]) -> Measure:
    """The user's metric as config.json records it (the column and the stop_at_metric rule)."""
    return Measure(METRIC, str(config.get(METRIC_NAME) or "metric"), bool(config.get(METRIC_HIGHER, False)))


def curve_measure(config: Mapping[str, Any], error: Any) -> Measure:
    """The run's measure: `config` is its config (config.json), `error` any test error it
    measured (an eval.jsonl row's, or the summary's final one): a number for a classifier,
    NaN (or None) without classes."""
    if isinstance(error, (int, float)) and math.isfinite(error):
        return Measure(ERROR, "test error")
    if config.get("metric"):
        return metric_measure(config)
    return Measure(LOSS, "test loss")


def recorded_measure(run_dir: str | Path) -> Measure:
    """The measure of a recorded run: from its config.json and its first point's test error
    (the summary's final one where the curve has no point, as a run that failed early)."""
    run = RunDir(run_dir)
    points = run.rows("eval")
    error = points[0]["test_error"] if points else run.summary().get("final_test_error")
    return curve_measure(run.record("config"), error)


@dataclass(frozen=True)
class Stop:
    """A stop rule: the curve's first point whose `measure` reaches `target` ends the run."""

    measure: Measure
    target: float

    def reached(self, row: Mapping[str, Any]) -> bool:
        value = row.get(self.measure.key)
        return isinstance(value, (int, float)) and math.isfinite(value) and self.measure.reached(value, self.target)

    def describe(self, row: Mapping[str, Any]) -> str:
        """`test loss 0.7912 <= 0.8`: the point's value against the target."""
        sign = ">=" if self.measure.higher_is_better else "<="
        return f"{self.measure.name} {row[self.measure.key]:.4f} {sign} {self.target:g}"


def stop_rules(config: Mapping[str, Any]) -> list[Stop]:
    """The run's stop rules, from its config (with the metric's record): those set (not 0)."""
    rules = [(config.get("stop_at_error"), Measure(ERROR, "test error")),
             (config.get("stop_at_loss"), Measure(LOSS, "test loss")),
             (config.get("stop_at_metric"), metric_measure(config))]
    return [Stop(measure, float(target)) for target, measure in rules if target]
