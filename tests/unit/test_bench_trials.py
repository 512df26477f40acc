"""The bench's one way to compare (experiments/bench/trials.py): both sides in turn, trial
by trial, summarised by the median of per-trial ratios; an impossible ratio is flagged."""
from __future__ import annotations

import pytest

from experiments.bench.trials import ERROR, interleave, ratio_cell, summarise


def test_sides_take_turns_after_the_warm_up_and_the_ratio_is_per_trial():
    calls = []

    def side(name, values):
        values = iter(values)
        return lambda: calls.append(name) or next(values)

    # A machine that slows 10x between trials: each trial's ratio is still 2.
    summary = interleave(side("a", [99, 2, 20, 200]), side("b", [1, 1, 10, 100]), trials=3, warmup=1)
    assert calls == ["a", "b"] * 4
    assert summary["ratios"] == [2, 2, 2] and summary["ratio"] == 2
    assert summary["ours"] == [2, 20, 200] and summary["other_median"] == 10
    assert not summary["below_bound"]
    with pytest.raises(ValueError):
        interleave(lambda: 1, lambda: 1, trials=0)


def test_a_median_below_a_lower_bound_is_a_measurement_error():
    impossible = summarise([0.9, 0.95, 1.1], [1.0, 1.0, 1.0], lower_bound=True)
    assert impossible["below_bound"] and ratio_cell(impossible) == f"0.95 ({ERROR})"
    plain = summarise([0.9, 0.95, 1.1], [1.0, 1.0, 1.0])  # a peer is no bound: 0.95 is a result
    assert not plain["below_bound"] and ratio_cell(plain) == "0.95 (0.93-1.02)"
