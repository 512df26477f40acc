"""The paper's figures from a sweep directory (Figs. 1-4, staleness, modes), as files.

Colour always means client count and line style n_sync, so figures can be read side by
side; every number plotted comes from plots.analysis.
"""
from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from plots.analysis import (Curve, SweepRun, Sweep, curve, default_start, speedups,
                            staleness_table)
from plots.backend import plt
from plots.rundata import load_json, load_log
from rundir.modes import Mode
from rundir.smoothing import WINDOW

LINESTYLES = ["-", "--", ":", "-."]
PAPER_SPEEDUP = (8, 3.2)  # Paine et al. 2013: 3.2x at 8 GPUs
MODE_COLOURS = {Mode.ASYNC: "tab:blue", Mode.SYNC: "tab:red", Mode.LOCAL_SGD: "tab:green"}


def client_colour(clients: int) -> tuple:
    """A fixed place on viridis for 1..32 clients (log2 spaced), the same in every figure."""
    return plt.cm.viridis(0.9 * min(np.log2(max(clients, 1)) / 5, 1.0))


def nsync_style(n_sync: int, n_syncs: Sequence[int]) -> str:
    """Solid, dashed, dotted, dash-dot in order of increasing n_sync within the sweep."""
    return LINESTYLES[sorted(n_syncs).index(n_sync) % len(LINESTYLES)]


def save(fig: Figure, stem: str | Path) -> list[Path]:
    """Write `fig` beside `stem` as PNG and PDF, and close it: a figure drawn to be saved is
    done with, and pyplot would otherwise hold it, and every one after, for the life of the
    process (a report run from a notebook or the API, the tests)."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_name(f"{stem.name}.png"), stem.with_name(f"{stem.name}.pdf")]
    try:
        fig.savefig(paths[0], dpi=150)
        fig.savefig(paths[1])
    finally:
        plt.close(fig)
    return paths


def _axes(axes: Axes | Sequence[Axes] | None, n: int, **kw) -> tuple[Figure, list[Axes], bool]:
    """Draw into the caller's axes when given; otherwise a new row of n panels that the caller owns."""
    if axes is None:
        fig, made = plt.subplots(1, n, figsize=(max(4.8, 3.6 * n), 3.8), squeeze=False, **kw)
        return fig, list(made[0]), True
    axes = [axes] if isinstance(axes, Axes) else list(axes)
    if len(axes) < n:
        raise ValueError(f"this figure needs {n} axes, got {len(axes)}")
    return axes[0].figure, axes[:n], False


def _finish(fig: Figure, owned: bool, sweep: Sweep, points: list[SweepRun], window: int | None = None,
            title: str | None = None) -> Figure:
    """Only a figure this module made gets the title and caption, so a caller's own layout is left alone."""
    if not owned:
        return fig
    if title:
        fig.suptitle(title)
    config = load_json(points[0].run, "config")
    seeds = ",".join(str(s) for s in sorted({p.seed for p in points}))
    parts = [f"sweep {sweep.name}", f"scale: {sweep.meta.get('scale', '?')}", f"data: {config.get('data', '?')}",
             f"model: {config.get('model', '?')}", f"seeds: {seeds}"]
    if window is not None:
        parts.append(f"{curve(points[0], window).name}: trailing mean over {window} minibatches")
    caption = textwrap.fill(" · ".join(parts), width=int(16 * fig.get_figwidth()))
    fig.tight_layout(rect=(0, 0.02 + 0.035 * (caption.count("\n") + 1), 1, 1))
    fig.text(0.5, 0.01, caption, ha="center", va="bottom", fontsize=7, color="0.3")
    return fig


def _value(c: Curve, value: float) -> str:
    """A value of the curve's column, named: `error 12.3%`, `loss 0.812`."""
    return f"error {100 * value:.1f}%" if c.column == "error" else f"{c.column} {value:.4g}"


def _clients(k: int) -> str:
    return f"{k} client{'s' * (k != 1)}"


def _time_label(sweep: Sweep, point: SweepRun) -> str:
    backend = sweep.meta.get("backend") or load_json(point.run, "config").get("backend", "mpi")
    return "virtual time (s)" if backend == "sim" else "wall time (s)"


def _need(items: list, what: str) -> list:
    if not items:
        raise ValueError(f"the sweep has no complete {what}")
    return items


def _plot_seeds(ax: Axes, points: list[SweepRun], window: int, label: str, x: str = "time", **style) -> None:
    """Every seed drawn in the same style; only the first labelled so the legend stays one line per setting."""
    for i, p in enumerate(sorted(points, key=lambda p: p.seed)):
        c = curve(p, window)
        ax.plot(getattr(c, x), c.scale * c.error, label=label if i == 0 else None, alpha=1.0 if i == 0 else 0.5,
                lw=1.2, **style)


def fig1_single_client(sweep: Sweep, window: int = WINDOW, ax: Axes | None = None) -> Figure:
    ones = _need(sweep.select(mode=Mode.ASYNC, clients=1, start="cold"), "cold 1-client async point")
    point = min(ones, key=lambda p: (p.n_sync, p.seed))
    fig, (ax,), owned = _axes(ax, 1)
    c = curve(point, window)
    ax.plot(c.epochs, c.scale * c.error, color=client_colour(1),
            label=f"{c.name} (trailing {window} minibatches)")
    evals = load_log(point.run, "eval")
    if evals:
        batch = load_json(point.run, "config").get("batch_size", 64)
        epochs = [e["minibatches"] * batch / point.train_size for e in evals]
        ax.plot(epochs, [c.scale * e[f"test_{c.column}"] for e in evals], "o-", ms=3, color="tab:red",
                label=f"test {c.column}")
    ax.set(xlabel="epochs", ylabel=c.label.removeprefix("training "),
           title=f"Fig. 1: one client (n_sync {point.n_sync}, seed {point.seed})")
    ax.grid(alpha=0.3)
    ax.legend()
    return _finish(fig, owned, sweep, [point], window)


def fig_start(sweep: Sweep, start: str = "cold", window: int = WINDOW, axes: Sequence[Axes] | None = None,
              x: str = "time") -> Figure:
    """Against time (the paper's axes: what more clients buy) or, with x="minibatches",
    against the minibatches of all clients (what staleness costs per unit of work)."""
    points = _need(sweep.select(mode=Mode.ASYNC, start=start), f"async points with start {start}")
    n_syncs = sweep.values("n_sync", mode=Mode.ASYNC, start=start)
    fig, panels, owned = _axes(axes, len(n_syncs), sharey=True)
    for ax, n in zip(panels, n_syncs):
        for k in sweep.values("clients", mode=Mode.ASYNC, start=start, n_sync=n):
            _plot_seeds(ax, sweep.select(mode=Mode.ASYNC, start=start, n_sync=n, clients=k), window,
                        _clients(k), x, color=client_colour(k), ls=nsync_style(n, n_syncs))
        ax.set(title=f"n_sync {n}", xlabel=_time_label(sweep, points[0]) if x == "time" else
               "minibatches (all clients)")
        if x == "minibatches":
            ax.set_xscale("log")  # 1 to 32 clients process 32x apart
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    panels[0].set_ylabel(curve(points[0], window).label)
    return _finish(fig, owned, sweep, points, window, f"Fig. {2 if start == 'cold' else 3}: {start} start")


def fig4_speedup(sweep: Sweep, target: float | None = None, start: str | None = None,
                 ax: Axes | None = None, window: int = WINDOW) -> Figure:
    """Speedup in time to a common target error; the star is the paper's number for comparison."""
    start = start or default_start(sweep)
    points = _need(sweep.select(mode=Mode.ASYNC, start=start), f"async points with start {start}")
    rows = [r for r in speedups(sweep, target, start, window) if r["mode"] == Mode.ASYNC]
    n_syncs = sorted({r["n_sync"] for r in rows})
    fig, (ax,), owned = _axes(ax, 1)
    for n in n_syncs:
        xy = [(r["clients"], r["speedup"]) for r in rows if r["n_sync"] == n and r["speedup"] is not None]
        if xy:
            ax.plot(*zip(*xy), marker="o", color="0.15", ls=nsync_style(n, n_syncs), label=f"n_sync {n}")
    top = max([r["clients"] for r in rows] + [PAPER_SPEEDUP[0]])
    ticks = [2 ** i for i in range(int(np.log2(top)) + 1)]
    ax.plot(ticks, ticks, ls="--", color="0.6", label="ideal (linear)")
    ax.plot(*PAPER_SPEEDUP, marker="*", ms=14, color="tab:orange", ls="none")
    ax.annotate("paper: 3.2x at 8 GPUs", PAPER_SPEEDUP, xytext=(-10, 10), textcoords="offset points",
                ha="right", va="bottom", fontsize=8, color="tab:orange")
    ax.set_xscale("log", base=2)  # log2 both ways: linear speedup is the diagonal
    ax.set_yscale("log", base=2)
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.set_yticks(ticks, [str(t) for t in ticks])
    ax.set(xlabel="clients", ylabel="speedup to target (x)",
           title=f"Fig. 4: {start} start, target {_value(curve(points[0], window), rows[0]['target'])}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _finish(fig, owned, sweep, points)


def fig_staleness(sweep: Sweep, axes: Sequence[Axes] | None = None) -> Figure:
    n_syncs = _need(sweep.values("n_sync", mode=Mode.ASYNC), "async points")
    rows = _need([r for r in staleness_table(sweep) if r["n_sync"] == n_syncs[0] and r["histogram"]],
                 f"async points at n_sync {n_syncs[0]} with staleness histograms")
    fig, panels, owned = _axes(axes, len(rows))
    for ax, r in zip(panels, rows):
        ax.bar(list(r["histogram"]), list(r["histogram"].values()), width=0.8, color=client_colour(r["clients"]))
        ax.set_yscale("log")
        top = max(r["histogram"])
        ax.set_xticks(range(0, top + 1, max(1, -(-(top + 1) // 10))))
        ax.set_xlim(-0.6, top + 0.6)
        ax.set(title=f"{_clients(r['clients'])}: mean {r['mean']:.2f}, max {r['max']}",
               xlabel="staleness (server versions)")
        ax.grid(alpha=0.3, axis="y")
    panels[0].set_ylabel("pushes")
    return _finish(fig, owned, sweep, sweep.select(mode=Mode.ASYNC, n_sync=n_syncs[0]),
                   title=f"Staleness of pushes, async, n_sync {n_syncs[0]}")


def fig_modes(sweep: Sweep, window: int = WINDOW, axes: Sequence[Axes] | None = None) -> Figure:
    """Panels only at client counts where some non-async mode ran, so every panel compares modes."""
    others = _need([p for p in sweep.points if p.mode != Mode.ASYNC], "points of modes other than async")
    counts = sorted({p.clients for p in others})
    starts = {p.start for p in others}
    fig, panels, owned = _axes(axes, len(counts), sharey=True)
    shown = []
    for ax, k in zip(panels, counts):
        points = [p for p in sweep.select(clients=k) if p.start in starts]
        shown += points
        settings = sorted({(p.mode, p.n_sync, p.start) for p in points})
        for mode, n, start in sorted(settings, key=lambda s: (s[0] != Mode.ASYNC, s)):
            label = mode if mode == Mode.SYNC else f"{mode}, n_sync {n}"
            n_syncs = sorted({p.n_sync for p in points if p.mode == mode})
            _plot_seeds(ax, [p for p in points if (p.mode, p.n_sync, p.start) == (mode, n, start)], window,
                        label + (f" ({start})" if len(starts) > 1 else ""), color=MODE_COLOURS.get(mode, "0.3"),
                        ls=nsync_style(n, n_syncs))
        ax.set(title=_clients(k), xlabel=_time_label(sweep, points[0]))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    panels[0].set_ylabel(curve(points[0], window).label)
    return _finish(fig, owned, sweep, shown, window, "Modes: async vs sync vs local-sgd")
