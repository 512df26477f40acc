"""The churn study's arithmetic (bench/studies/churn_efficiency.py) and its figure."""
from __future__ import annotations

import math

import pytest

from bench.studies.churn_efficiency import STEP_S, efficiency
from plots.churn import churn_figure


def test_efficiency_is_the_minibatches_in_steps_over_k_times_the_elapsed_minibatch_times():
    # 4 clients for 100 minibatch times could have computed 400; 300 entered a step
    assert efficiency({"minibatches_in_steps": 300, "time_s": 100 * STEP_S}, 4) == pytest.approx(0.75)


def test_the_figure_is_written_with_the_failure_free_point_beside_the_failing_ones(tmp_path):
    rows = [{"method": method, "mtbf": mtbf, "efficiency": e, "low": e - 0.01, "high": e + 0.01, "cap": e + 0.05}
            for method in ("fresh", "sync") for mtbf, e in ((math.inf, 0.9), (100.0, 0.7), (29.0, 0.5))]
    paths = churn_figure(rows, 20.0, tmp_path / "churn.png")
    assert [p.name for p in paths] == ["churn.png", "churn.pdf"] and all(p.stat().st_size > 0 for p in paths)
