"""The curve of one run: its smoothed training curve and its test points against time, in
the run's measure (rundir/measure.py): error where the run classifies, else
the user's metric (beside the training loss, on an axis of its own), else the loss."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from plots.backend import plt
from plots.rundata import load_json, load_log, smoothed_curve
from rundir.measure import METRIC, Measure, recorded_measure
from rundir.smoothing import WINDOW


def time_label(config: dict) -> str:
    """The x axis of a run's curve: the simulator's clock is virtual."""
    return "virtual time (s, simulated)" if config.get("backend") == "sim" else "wall time (s)"


@dataclass(frozen=True)
class RunSeries:
    """What a run's figure draws, in the run's values (an error as a fraction): the smoothed
    training column beside the measure (`train_x`, `train_y`) and the measure's test points."""

    measure: Measure
    window: int
    train_x: np.ndarray
    train_y: np.ndarray
    test_x: list[float]
    test_y: list[float]

    @property
    def scale(self) -> float:
        return 100.0 if self.measure.percent else 1.0

    @property
    def twin(self) -> bool:
        """The training loss on an axis of its own: a metric's scale is not the loss's."""
        return self.measure.key == METRIC

    @property
    def ylabel(self) -> str:
        return "error (%)" if self.measure.percent else self.measure.name if self.twin else "loss"

    @property
    def train_label(self) -> str:
        return f"training {self.measure.train_key} (trailing {self.window} minibatches)"

    @property
    def test_label(self) -> str:
        return f"{self.measure.name} ({self.measure.direction()})" if self.twin else self.measure.name


def run_series(run_dir: str | Path, window: int = WINDOW) -> RunSeries:
    evals, measure = load_log(run_dir, "eval"), recorded_measure(run_dir)
    time, _, train = smoothed_curve(load_log(run_dir, "clients"), window, measure.train_key)
    evals = [e for e in evals if measure.key in e]  # a metric a resume added: from its points on
    return RunSeries(measure, window, time, train, [e["time"] for e in evals], [e[measure.key] for e in evals])


def plot_run(run_dir: str | Path, png: str | Path, window: int = WINDOW) -> Path:
    config = load_json(run_dir, "config")
    series = run_series(run_dir, window)
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    train_ax = ax.twinx() if series.twin else ax
    train_ax.plot(series.train_x, series.scale * series.train_y, color="tab:blue", label=series.train_label)
    if series.test_x:
        ax.plot(series.test_x, [series.scale * y for y in series.test_y], "o-", ms=3, color="tab:red",
                label=series.test_label)
    ax.set_xlabel(time_label(config))
    ax.set_ylabel(series.ylabel)
    if series.twin:
        train_ax.set_ylabel("training loss")
    model, data = (Path(str(config.get(key, "?"))).name for key in ("model", "data"))  # a user's file.py:name
    ax.set_title(f"{model} on {data}: {config.get('clients', '?')} clients, "
                 f"n_sync {config.get('n_sync', '?')}, seed {config.get('seed', '?')}", fontsize=9)
    ax.grid(alpha=0.3)
    handles = [h for a in ((ax, train_ax) if series.twin else (ax,)) for h in a.get_legend_handles_labels()[0]]
    ax.legend(handles=handles)
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)
    return Path(png)
