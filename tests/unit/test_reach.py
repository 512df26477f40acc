"""plots/reach.py by hand: a reference's end reached seed by seed, on curves written here."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from plots.analysis import load_sweep
from plots.reach import main, reach_table

# (mode, seed): the test error at each evaluation, 1 virtual second apart for sync, half a second for async
CURVES = {("sync", 0): [0.9, 0.5, 0.4, 0.3, 0.3], ("sync", 1): [0.9, 0.5, 0.4, 0.3, 0.3],
          ("async", 0): [0.9, 0.3, 0.3, 0.3, 0.3], ("async", 1): [0.9, 0.9, 0.9, 0.9, 0.9]}


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    points = []
    for (mode, seed), errors in CURVES.items():
        point = f"{mode}-c2-s{seed}"
        run = tmp_path / "runs" / point
        run.mkdir(parents=True)
        (run / "config.json").write_text(json.dumps({"mode": mode, "clients": 2}))
        (run / "summary.json").write_text(json.dumps({"status": "complete", "final_test_error": errors[-1]}))
        step = 1.0 if mode == "sync" else 0.5
        (run / "eval.jsonl").write_text("".join(
            json.dumps({"time": i * step, "minibatches": i, "test_error": e, "test_loss": e}) + "\n"
            for i, e in enumerate(errors)))
        points.append({"id": point, "mode": mode, "clients": 2, "n_sync": 1, "seed": seed, "rule": "add",
                       "run": f"runs/{point}", "status": "complete"})
    (tmp_path / "index.json").write_text(json.dumps({"name": "s", "points": points}))
    return tmp_path


def test_each_method_s_time_to_the_reference_s_end_in_the_same_seed(sweep, capsys):
    rows = {r["method"]: r for r in reach_table(load_sweep(sweep), "equal", 2, "sync")}
    # sync ends at mean(0.4, 0.3, 0.3) = 1/3, first reached at 4 s; async's smoothed curve
    # is at 1/3 or below from its fourth point, 1.5 s, in seed 0, never in seed 1
    assert rows["sync"]["ratios"] == [1.0, 1.0]
    assert rows["async add"]["ratios"] == [pytest.approx(4 / 1.5), None]
    assert (rows["async add"]["reached"], rows["async add"]["seeds"]) == (1, 2)
    assert rows["async add"]["median"] is None  # a miss counts as the slowest: the median of two is one
    assert rows["sync"]["median"] == 1.0
    assert main([str(sweep), "--clients", "2", "--reference", "sync"]) == 0
    assert "| async add | 1 of 2 | not reached | 2.67x, not reached |" in capsys.readouterr().out


def test_a_reference_with_no_run_there_is_one_line_and_exit_2(sweep, capsys):
    assert main([str(sweep), "--clients", "8", "--reference", "sync"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
