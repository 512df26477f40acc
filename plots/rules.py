"""The rules sweep (`make rules`): every server update rule side by side, as numbers and a figure.

For each setting (cost profile, start, speed jitter) the baseline is one client of the
paper's rule (`add`, at nominal speed, the shortest such run): the target is its final
smoothed training error + 5%, as in Fig. 4. For every async point the table gives the
time to that target, the speedup against that one client, against one client of the
same rule (where the sweep has one; the rules that reduce to `add` at one client use
it) and against `--mode sync` at the same K (above 1: async is faster); the speedup at
its own final error (how much sooner it got there than the longest one-client run,
which also counts runs too short for the common target); its final test error against
one client's after as many minibatches in all (that run's evaluations: the same data
seen), and whether it diverged.
"""
from __future__ import annotations

from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")  # files only
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from plots.analysis import SweepRun, Sweep, curve, time_to_target  # noqa: E402
from plots.rundata import load_json, load_log  # noqa: E402

DIVERGED = 0.5  # a final test error above this (chance: 90% on ten classes) counts as diverged
VARIANTS = ("rule", "momentum", "jitter", "profile")


def is_rules_sweep(sweep: Sweep) -> bool:
    """A sweep that varies the server's rule, momentum, speed jitter or cost profile."""
    return any(len({getattr(p, key) for p in sweep.points}) > 1 for key in VARIANTS)


REDUCE_TO_ADD = ("add", "scaled", "staleness", "dcasgd")  # exactly add with one client (tests/sim/test_client.py)


def _ones(sweep: Sweep, profile: str, start: str, rule: str = "add") -> list[SweepRun]:
    """One client at nominal speed with `rule`, shortest run first, then smallest n_sync."""
    ones = [p for p in sweep.select(mode="async", clients=1, profile=profile, start=start, rule=rule)
            if p.jitter == 0]
    return sorted(ones, key=lambda p: (p.steps, p.n_sync, p.seed))


def test_error_after(point: SweepRun, minibatches: int) -> float | None:
    """The test error of the first evaluation after `minibatches` in all; None if the run
    is shorter."""
    later = [r for r in load_log(point.run, "eval") if r.get("minibatches", 0) >= minibatches]
    return later[0].get("test_error") if later else None


def _time(point: SweepRun | None, target: float, window: int) -> float | None:
    return None if point is None else time_to_target(curve(point, window), target, window)


def _speedup_at_own_error(point: SweepRun, one: SweepRun, window: int) -> float | None:
    """How much sooner this run reached the error it ended at than one client did: a
    speedup for every run that learned, even one too short for the common target (for
    a run that ends below anything the one client reached, a lower bound)."""
    mine = curve(point, window)
    if mine.minibatches[-1] < window:
        return None
    error = float(mine.error[-1])
    t = time_to_target(mine, error, window)
    t1 = time_to_target(curve(one, window), error, window)
    if t1 is None:
        t1 = float(curve(one, window).time[-1])
    return _ratio(t1, t)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def rules_table(sweep: Sweep, window: int) -> list[dict]:
    """One row per async point (seeds not averaged: a rules sweep runs one seed)."""
    rows = []
    settings = sorted({(p.profile, p.start, p.jitter) for p in sweep.points})
    for profile, start, jitter in settings:
        ones = _ones(sweep, profile, start)
        if not ones:
            continue
        base, longest = ones[0], max(ones, key=lambda p: p.steps)
        target = 1.05 * float(curve(base, window).error[-1])
        t1 = _time(base, target, window)
        points = [p for p in sweep.select(mode="async", profile=profile, start=start)
                  if p.jitter == jitter and p not in ones[1:]]
        for p in sorted(points, key=lambda p: (p.rule, p.momentum, p.n_sync, p.clients, p.seed)):
            t = _time(p, target, window)
            own = _ones(sweep, profile, start, "add" if p.rule in REDUCE_TO_ADD else p.rule)[:1]
            sync = [s for s in sweep.select(mode="sync", clients=p.clients, profile=profile, start=start)
                    if s.jitter == jitter]
            final = load_json(p.run, "summary").get("final_test_error")
            diverged = final is None or not np.isfinite(final) or final > DIVERGED
            one = test_error_after(longest, int(curve(p, window).minibatches[-1]))
            rows.append({"profile": profile, "start": start, "jitter": jitter, "rule": p.rule,
                         "momentum": p.momentum, "n_sync": p.n_sync, "clients": p.clients, "target": target,
                         "time_to_target": t, "speedup": _ratio(t1, t),
                         "speedup_at_own_error": None if diverged else _speedup_at_own_error(p, longest, window),
                         "speedup_same_rule": _ratio(_time(own[0], target, window), t) if own else None,
                         "vs_sync": _ratio(_time(sync[0], target, window), t) if sync else None,
                         "final_test_error": final, "one_client_test_error": one,
                         "gap_points": None if one is None or final is None else 100 * (final - one),
                         "diverged": diverged})
    return rows


def rules_summary(rows: list[dict]) -> list[dict]:
    """One row per (rule, momentum), over its runs with more than one client: how often it
    diverged, its worst gap to one client at equal minibatches, its cold-start speedups
    at 8 and 32 clients (measured costs, no jitter, n_sync 1; against one client of the
    paper's rule and of its own) and its worst standing against sync under speed jitter."""
    out = []
    for rule, momentum in sorted({(r["rule"], r["momentum"]) for r in rows}):
        mine = [r for r in rows if r["rule"] == rule and r["momentum"] == momentum and r["clients"] > 1]
        if not mine:
            continue

        def speedup(k: int, column: str = "speedup") -> float | None:
            hit = [r[column] for r in mine if r["clients"] == k and r["n_sync"] == 1 and r["start"] == "cold"
                   and r["jitter"] == 0 and r["profile"] == "measured"]
            return hit[0] if hit else None
        gaps = [r["gap_points"] for r in mine if r["gap_points"] is not None]
        jittered = [r["vs_sync"] for r in mine if r["jitter"] > 0 and r["time_to_target"] is not None]
        out.append({"rule": rule, "momentum": momentum, "runs": len(mine),
                    "diverged": sum(r["diverged"] for r in mine) / len(mine),
                    "worst_gap_points": max(gaps) if gaps else None,
                    "speedup_8": speedup(8), "speedup_32": speedup(32),
                    "same_rule_8": speedup(8, "speedup_same_rule"), "same_rule_32": speedup(32, "speedup_same_rule"),
                    "own_error_8": speedup(8, "speedup_at_own_error"),
                    "own_error_32": speedup(32, "speedup_at_own_error"),
                    "worst_vs_sync_jitter": min((v for v in jittered if v is not None), default=None)})
    return out


def fig_rules(sweep: Sweep, window: int, rows: list[dict] | None = None) -> Figure:
    """Speedup at each run's own final error against clients, cold start and no jitter
    (the common target is out of reach of most short runs): a row of panels per cost
    profile, one panel per n_sync, one line per (rule, momentum); a diverged run is an x
    at 0."""
    rows = [r for r in (rows or rules_table(sweep, window)) if r["start"] == "cold" and r["jitter"] == 0]
    if not rows:
        raise ValueError("the sweep has no cold-start points without jitter to draw")
    profiles = sorted({r["profile"] for r in rows})
    n_syncs = sorted({r["n_sync"] for r in rows})
    fig, axes = plt.subplots(len(profiles), len(n_syncs), figsize=(3.6 * len(n_syncs) + 2.4, 3.2 * len(profiles)),
                             squeeze=False, sharey=True)
    variants = sorted({(r["rule"], r["momentum"]) for r in rows})
    colours = dict(zip(variants, plt.cm.tab10(np.arange(len(variants)) % 10)))
    for i, profile in enumerate(profiles):
        for j, n_sync in enumerate(n_syncs):
            ax = axes[i][j]
            mine = [r for r in rows if r["profile"] == profile and r["n_sync"] == n_sync]
            if not mine:
                ax.set_visible(False)
                continue
            _panel(ax, mine, variants, colours)
            ax.set_title(f"{profile} costs, n_sync {n_sync}", fontsize=9)
            ax.set_xlabel("clients")
            if j == 0:
                ax.set_ylabel("speedup at own final error")
    handles = {}
    for ax in axes.flat:  # every variant once, whichever panel drew it
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    fig.legend(handles.values(), handles.keys(), fontsize=7, loc="center right")
    fig.suptitle(f"update rules, cold start: how much sooner than one client each run reached its final error "
                 f"({sweep.name})", fontsize=10)
    fig.tight_layout(rect=(0, 0, 0.8, 1))
    return fig


def _panel(ax, rows: list[dict], variants: Sequence[tuple[str, str]], colours: dict) -> None:
    ks = sorted({r["clients"] for r in rows})
    if ks:
        ax.plot(ks, ks, color="0.8", lw=1, ls=":", label="linear")
    for variant in variants:
        mine = sorted((r for r in rows if (r["rule"], r["momentum"]) == variant), key=lambda r: r["clients"])
        reached = [r for r in mine if r["speedup_at_own_error"] is not None]
        missed = [r for r in mine if r["speedup_at_own_error"] is None]  # diverged: an x on the axis
        label = f"{variant[0]} (momentum {variant[1]})"
        if reached:
            ax.plot([r["clients"] for r in reached], [r["speedup_at_own_error"] for r in reached], marker="o", ms=3,
                    color=colours[variant], label=label)
        if missed:
            ax.scatter([r["clients"] for r in missed], [0.0] * len(missed), marker="x", s=18,
                       color=colours[variant], label=None if reached else label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_yscale("symlog", base=2, linthresh=1)
    ax.grid(alpha=0.3)
