"""The training-error curve of one run: smoothed training error and test error vs time."""
from __future__ import annotations

from pathlib import Path

from paramserver.rundir.smoothing import WINDOW
from plots.backend import plt
from plots.rundata import load_json, load_log, smoothed_error


def time_label(config: dict) -> str:
    """The x axis of a run's curve: the simulator's clock is virtual."""
    return "virtual time (s, simulated)" if config.get("backend") == "sim" else "wall time (s)"


def plot_run(run_dir: str | Path, png: str | Path, window: int = WINDOW) -> Path:
    config = load_json(run_dir, "config")
    time, _, error = smoothed_error(load_log(run_dir, "clients"), window)
    evals = load_log(run_dir, "eval")
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    ax.plot(time, 100 * error, label=f"training error (trailing {window} minibatches)")
    if evals:
        ax.plot([e["time"] for e in evals], [100 * e["test_error"] for e in evals], "o-", ms=3,
                label="test error")
    ax.set_xlabel(time_label(config))
    ax.set_ylabel("error (%)")
    model, data = (Path(str(config.get(key, "?"))).name for key in ("model", "data"))  # a user's file.py:name
    ax.set_title(f"{model} on {data}: {config.get('clients', '?')} clients, "
                 f"n_sync {config.get('n_sync', '?')}, seed {config.get('seed', '?')}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)
    return Path(png)
