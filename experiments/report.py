"""`asgd report RUN_DIR`: the run's summary in a few lines and its training-error figure."""
from __future__ import annotations

import sys
from pathlib import Path

from plots.curves import plot_run
from plots.rundata import load_json


def report(run_dir: str, window: int = 400) -> int:
    summary = load_json(run_dir, "summary")
    if not summary:
        print(f"asgd: error: run_dir: {run_dir} has no summary.json (not a finished run?)", file=sys.stderr)
        return 2
    png = plot_run(run_dir, Path(run_dir) / "training_error.png", window)
    error = summary.get("final_test_error")
    print(f"{run_dir}: {summary['status']}; test error {error if error is None else f'{error:.4f}'}; "
          f"{summary['minibatches']} minibatches in {summary['time_s']:.1f} s; "
          f"{summary['pushes_applied']} pushes, {summary['pushes_rejected']} rejected; "
          f"staleness mean {summary['staleness']['mean']:.2f} max {summary['staleness']['max']}")
    print(f"figure: {png}")
    return 0
