"""The scaling study (`make scaling`): every method's speedup beside the measured ceiling.

Read from a sweep whose spec says `study = "scaling"` and fixes its `targets` before the
runs, in the runs' own measure (rundir/measure.py: the test error of a
classifier, else the user's metric, else the test loss):
- time to a target: the first evaluation at which the mean of the measure over the last
  `SMOOTH` evaluations (the curve's fixed subset) reaches it, in the run's (virtual)
  time; a run that never gets there has none (its budget is a bound);
- the tuned single client: the best, over the lr grid, of one async client at the
  [base] batch b;
- the ceiling C(K) = the tuned single client's steps to the target / the best steps of
  one process at batch K x b (its lr grid, with warmup): what averaging K x b samples
  per update can gain at most, at equal speeds (McCandlish et al. 2018);
- per method (sync, sync with backup workers, local SGD, each async rule), client count
  and speed model (equal, or the spec's stragglers): the speedup (the tuned single
  client's time over the method's, medians over seeds, and their range where there are
  several), its fraction of C(K) (may pass
  1: model averaging is not bound by it), its ratio to tuned sync and to tuned sync with
  backup workers at the same K and speeds (the best median over their lrs and backup
  counts; above 1: faster than they), the share of seeds that
  reached the target, whether a run diverged, whether the simulated server was the
  bottleneck (busy most of the run), and, beside the times, the final measure and the
  megabytes pushed and pulled (`wire_mb`; medians): at equal samples, what a method that
  talks less (local updates, compression) paid for it; `equal_samples_table` states that
  once a method, as multiples of tuned sync's final test loss and bytes.
Speed models: `equal`, `stragglers` (per-minibatch noise, slow clients, jitter),
`spread` (each client's speed drawn once or listed), `failures` (a mean time between
failures); a point under several is named by all, joined with "+".
Every speedup is a time to a target fixed in advance, never a method's own final value
(which stands beside it).
"""
from __future__ import annotations

from collections import Counter

import numpy as np
from functools import lru_cache
from typing import Any

from matplotlib.figure import Figure

from plots.analysis import Sweep, SweepRun
from plots.backend import plt
from plots.rundata import load_json, load_log
from rundir.measure import ERROR, Measure, recorded_measure
from rundir.modes import Mode

SMOOTH = 3           # evaluations averaged before a target counts as reached
DIVERGED = 0.5       # a final test error above this (chance: 90%) counts as diverged; other measures: not finite
SERVER_BOUND = 0.9   # a server busy this share of the run's time was the bottleneck
# a sweep index entry's keys that say which run, not which method (plots/analysis.py, SweepRun)
NOT_A_METHOD = {"id", "seed", "steps", "config", "status", "run", "train_size"}


def is_scaling_sweep(sweep: Sweep) -> bool:
    return sweep.meta.get("study") == "scaling"


def targets(sweep: Sweep) -> list[float]:
    return [float(t) for t in sweep.meta["targets"]]


@lru_cache(maxsize=None)
def measure(run: str) -> Measure:
    """The recorded run's measure (a study's runs share their task, so theirs is one)."""
    return recorded_measure(run)


def reached(point: SweepRun, target: float) -> tuple[float, int] | None:
    """(time, minibatches in all) when the smoothed measure first reached `target`."""
    m = measure(str(point.run))
    rows = [r for r in load_log(point.run, "eval") if r.get(m.key) is not None]
    values = np.array([r[m.key] for r in rows], dtype=np.float64)
    for i in range(SMOOTH - 1, len(rows)):
        if m.reached(float(values[i - SMOOTH + 1:i + 1].mean()), target):
            return float(rows[i]["time"]), int(rows[i]["minibatches"])
    return None


def final(point: SweepRun) -> float | None:
    """The run's last value of its measure (the summary's), None where it has none."""
    value = load_json(point.run, "summary").get(f"final_{measure(str(point.run)).key}")
    return float(value) if isinstance(value, (int, float)) and np.isfinite(value) else None


def _diverged(point: SweepRun) -> bool:
    value = final(point)
    return value is None or (measure(str(point.run)).key == ERROR and value > DIVERGED)


def speeds(point: SweepRun) -> str:
    """`equal`, or the speed models the point ran under (the module docstring)."""
    sigma, slow = float(point.get("step_sigma", 0.0)), int(point.get("slow_clients", 0))
    models = [name for name, on in (("stragglers", sigma or slow or point.jitter),
                                    ("spread", float(point.get("speed_spread", 0.0)) or point.get("client_speeds")),
                                    ("failures", float(point.get("mtbf", 0.0)))) if on]
    return "+".join(models) or "equal"


def method(point: SweepRun) -> str:
    """The method's name, with its lr where the point's departs from [base]'s (the point's id
    names it): sync's lr grid gives one row an lr, the best of which is tuned sync."""
    lr = point.get("lr")
    own_lr = f", lr {lr}" if f"-lr{lr}-" in f"{point.id}-" else ""
    if point.mode == Mode.SYNC:  # the linear rule's lr apart
        backups = int(point.get("backup_workers", 0))
        name = "sync, linear rule" if point.get("lr_scaling") == "linear" else "sync" + own_lr
        return f"{name}, {backups} backup" if backups else name
    if point.mode == Mode.LOCAL_SGD:
        return f"local-sgd n{point.n_sync}" + _outer(point)
    return f"async {point.rule}" + (f" n{point.n_sync}" if point.n_sync > 1 else "") + own_lr + _outer(point)


def _outer(point: SweepRun) -> str:
    """An outer step the user set (synchronous or asynchronous DiLoCo's), named: the
    published 0.7 / 0.9 is another method than the tool's default."""
    said = [f"{name} {value}" for name, value in (("lr", _setting(point, "outer_lr")),
                                                   ("momentum", _setting(point, "nesterov_momentum")))
            if value is not None]
    return f", outer {' '.join(said)}" if said else ""


def _tuned(times: dict[tuple[str, str, int], list], speed: str, k: int, backup: bool) -> float | None:
    """Tuned sync at (speed, k): the best median time over its lrs (with `backup`, over its
    backup-worker counts and lrs too); the linear rule is not tuned."""
    medians = [median(ts) for (s, m, kk), ts in times.items() if s == speed and kk == k and m.startswith("sync")
               and "linear" not in m and (" backup" in m) == backup]  # a name may go on after it (_apart)
    found = [t for t in medians if t is not None]
    return min(found) if found else None


def _base_batch(sweep: Sweep) -> int:
    return min(int(p.get("batch_size", 64)) for p in sweep.select(mode=Mode.ASYNC, clients=1))


def _single(sweep: Sweep) -> tuple[list[SweepRun], dict[int, list[SweepRun]]]:
    """The single-client lr grid at batch b, and the one-process runs at K x b by K."""
    b = _base_batch(sweep)
    ones = [p for p in sweep.select(mode=Mode.ASYNC, clients=1, n_sync=1) if speeds(p) == "equal"]
    big: dict[int, list[SweepRun]] = {}
    for p in ones:
        big.setdefault(int(p.get("batch_size", b)) // b, []).append(p)
    return big.pop(1, []), big


def _best(points: list[SweepRun], target: float, index: int) -> tuple[SweepRun, float] | None:
    """The point that reached `target` soonest (index 0: time, 1: minibatches), and that."""
    hits = [(p, hit[index]) for p in points if (hit := reached(p, target))]
    return min(hits, key=lambda h: h[1]) if hits else None


def ceiling(sweep: Sweep, target: float) -> dict[str, dict]:
    """C(K) by K (as a string key), with the lr and warmup that achieved it."""
    grid, big = _single(sweep)
    one = _best(grid, target, 1)
    out = {}
    for k, points in sorted(big.items()):
        best = _best(points, target, 1)
        out[str(k)] = {"ceiling": one[1] / best[1] if one and best else None,
                       "lr": best[0].get("lr") if best else None,
                       "lr_warmup": best[0].get("lr_warmup") if best else None,
                       "steps": best[1] if best else None, "tried": len(points)}
    return out


def median(values: list[float | None]) -> float | None:
    """The median, a missing value (a target not reached, a run that diverged) counting as
    the slowest: the median of 3 seeds of which 2 did not reach is "not reached". The
    links map (plots/links.py) takes its medians so too."""
    if not values:
        return None
    middle = float(np.median([np.inf if v is None else v for v in values]))
    return None if not np.isfinite(middle) else middle


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def scaling_table(sweep: Sweep) -> list[dict]:
    """One row per (target, speeds, method, K): see the module docstring."""
    grid, _ = _single(sweep)
    rows = []
    for target in targets(sweep):
        tuned = _best(grid, target, 0)
        t1 = tuned[1] if tuned else None
        caps = ceiling(sweep, target)
        groups = _groups(sweep)
        times = {key: [(hit[0] if (hit := reached(p, target)) else None) for p in points]
                 for key, points in groups.items()}
        for (speed, name, k), points in sorted(groups.items(), key=lambda g: (g[0][0], g[0][1], g[0][2])):
            t = median(times[(speed, name, k)])
            sync, backup = _tuned(times, speed, k, backup=False), _tuned(times, speed, k, backup=True)
            cap = caps.get(str(k), {}).get("ceiling")
            summaries = [load_json(p.run, "summary") for p in points]
            each = [_ratio(t1, x) for x in times[(speed, name, k)] if x is not None]
            rows.append({"target": target, "speeds": speed, "method": name, "clients": k, "seeds": len(points),
                         "reached": sum(x is not None for x in times[(speed, name, k)]) / len(points),
                         "time_to_target": t, "speedup": _ratio(t1, t),
                         "speedup_range": f"{min(each):.2f}-{max(each):.2f}" if len(points) > 1 and each else None,
                         "ceiling": cap,
                         "of_ceiling": _ratio(_ratio(t1, t), cap),
                         "vs_sync": _ratio(sync, t) if not (name.startswith("sync") and "backup" not in name
                                                            and "linear" not in name) else None,
                         "vs_sync_backup": _ratio(backup, t) if not name.startswith("sync") else None,
                         "diverged": any(_diverged(p) for p in points),
                         "server_bound": any(_server_bound(s) for s in summaries),
                         "final": median([final(p) for p in points]),
                         "wire_mb": _ratio(median([_wire_bytes(s) for s in summaries]), 1e6)})
    return rows


def _groups(sweep: Sweep) -> dict[tuple[str, str, int], list[SweepRun]]:
    """The points of more than one client by (speeds, method, K): a row's seeds."""
    groups: dict[tuple[str, str, int], list[SweepRun]] = {}
    for p in sweep.points:
        if p.clients > 1:
            groups.setdefault((speeds(p), method(p), p.clients), []).append(p)
    return _apart(groups)


def equal_samples_table(sweep: Sweep) -> list[dict]:
    """One row per (speeds, method, K), every method at K having seen the same samples:
    the final measure and test loss (medians over seeds, the loss's range), both bytes
    pushed and pulled, and each as a multiple of tuned sync's at the same K and speeds
    (the sync row of the lowest median loss): what local updates and compression pay in
    loss for what they save on the wire, the question a user of DiLoCo asks."""
    groups = _groups(sweep)
    summaries = {key: [load_json(p.run, "summary") for p in points] for key, points in groups.items()}
    losses = {key: [_loss(s) for s in each] for key, each in summaries.items()}
    loss = {key: median(values) for key, values in losses.items()}
    wire = {key: median([_wire_bytes(s) for s in each]) for key, each in summaries.items()}
    rows = []
    for (speed, name, k), points in sorted(groups.items(), key=lambda g: (g[0][0], g[0][2], g[0][1])):
        syncs = [key for key in groups if key[0] == speed and key[2] == k and key[1].startswith("sync")
                 and "backup" not in key[1] and "linear" not in key[1] and loss[key] is not None]
        sync = min(syncs, key=lambda key: loss[key]) if syncs else None
        each = [x for x in losses[(speed, name, k)] if x is not None]
        rows.append({"speeds": speed, "clients": k, "method": name, "seeds": len(points),
                     "final": median([final(p) for p in points]), "loss": loss[(speed, name, k)],
                     "loss_range": f"{min(each):.3f}-{max(each):.3f}" if len(each) > 1 else None,
                     "x_sync_loss": _ratio(loss[(speed, name, k)], loss[sync]) if sync else None,
                     "wire_mb": _ratio(wire[(speed, name, k)], 1e6),
                     "x_sync_bytes": _ratio(wire[(speed, name, k)], wire[sync]) if sync else None,
                     "diverged": any(_diverged(p) for p in points)})
    return rows


def _loss(summary: dict) -> float | None:
    value = summary.get("final_test_loss")
    return float(value) if isinstance(value, (int, float)) and np.isfinite(value) else None


def _apart(groups: dict[tuple[str, str, int], list[SweepRun]]) -> dict[tuple[str, str, int], list[SweepRun]]:
    """A group's points in rows of their own where they differ in a setting the method's name
    does not show (a grid over `max_staleness` beside the default's points), so one median
    never mixes two methods' seeds: the row's name gains each such key and its value, but
    for the value most points of that name hold across the sweep (the default's, at every
    other K), which keeps the plain name and so stays on the method's line."""
    named: dict[str, list[SweepRun]] = {}
    for (_, name, _), points in groups.items():
        named.setdefault(name, []).extend(points)
    out: dict[tuple[str, str, int], list[SweepRun]] = {}
    for (speed, name, k), points in groups.items():
        keys = sorted({key for p in points for key in p.settings} - NOT_A_METHOD)
        apart = [key for key in keys if len({repr(_setting(p, key)) for p in points}) > 1]
        usual = {key: _usual(named[name], key) for key in apart}
        for p in points:
            shown = "".join(f", {key} {_setting(p, key)}" for key in apart if repr(_setting(p, key)) != usual[key])
            out.setdefault((speed, name + shown, k), []).append(p)
    return out


def _usual(points: list[SweepRun], key: str) -> str | None:
    """The repr of the value of `key` that most of `points` hold (None on a tie)."""
    counts = Counter(repr(_setting(p, key)) for p in points).most_common(2)
    return None if len(counts) > 1 and counts[0][1] == counts[1][1] else counts[0][0]


def _setting(point: SweepRun, key: str) -> Any:
    """An axis of the point, else its recorded config's value (a point run before a later
    spec made the key an axis has it only there)."""
    return point.settings.get(key, point.settings.get("config", {}).get(key))


def _wire_bytes(summary: dict) -> float | None:
    """What a run put on the wire, pushes and pulls (None: a run that did not count them)."""
    sent = [summary.get(key) for key in ("bytes_pushed", "bytes_pulled")]
    return float(sum(sent)) if all(isinstance(v, (int, float)) for v in sent) else None


def _server_bound(summary: dict) -> bool:
    busy, time = summary.get("server_busy_s"), summary.get("time_s")
    return bool(busy and time and busy / time > SERVER_BOUND)


def baselines(sweep: Sweep) -> list[dict]:
    """The single client's lr grid and the ceiling's, per target: what the table divides by."""
    grid, big = _single(sweep)
    rows = []
    for target in targets(sweep):
        for k, points in [(1, grid), *sorted(big.items())]:
            for p in sorted(points, key=lambda p: float(p.get("lr", 0))):
                hit = reached(p, target)
                rows.append({"target": target, "batch_of_K": k, "lr": p.get("lr"), "lr_warmup": p.get("lr_warmup"),
                             "steps_to_target": hit[1] if hit else None, "time_to_target": hit[0] if hit else None,
                             "final": final(p)})
    return rows


def fig_scaling(sweep: Sweep, rows: list[dict] | None = None) -> Figure:
    """Speedup against K, one row of panels per target, one panel per speed model (equal
    first) side by side: the linear line, the measured ceiling, every method (x at the
    axis: not reached)."""
    rows = rows if rows is not None else scaling_table(sweep)
    if not rows:
        raise ValueError("the sweep has no multi-client points")
    marks, panels = targets(sweep), sorted({r["speeds"] for r in rows}, key=lambda s: (s != "equal", s))
    names = sorted({r["method"] for r in rows})
    legend_in = 0.6 + 0.065 * max(len(name) for name in names)  # inches the legend's longest name takes
    width = 5.5 * len(panels)
    fig, axes = plt.subplots(len(marks), len(panels), figsize=(width + legend_in, 3.6 * len(marks)), squeeze=False,
                             sharey=True)
    m = measure(str(sweep.points[0].run))
    floor = min([0.2] + [0.5 * r["speedup"] for r in rows if r["speedup"]])  # every speedup above the not-reached x
    colours = dict(zip(names, plt.cm.tab20(np.arange(len(names)) % 20)))
    for i, target in enumerate(marks):
        caps = {int(k): v["ceiling"] for k, v in ceiling(sweep, target).items() if v["ceiling"]}
        for j, speed in enumerate(panels):
            ax, mine = axes[i][j], [r for r in rows if r["target"] == target and r["speeds"] == speed]
            ks = sorted({r["clients"] for r in mine} | set(caps))
            ax.plot(ks, ks, color="0.8", lw=1, ls=":", label="linear")
            if caps:
                ax.plot(sorted(caps), [caps[k] for k in sorted(caps)], color="k", lw=2, marker="_", ms=14, label="ceiling C(K)")
            for name in names:
                line = sorted((r for r in mine if r["method"] == name), key=lambda r: r["clients"])
                hit = [r for r in line if r["speedup"] is not None]
                if hit:
                    ax.plot([r["clients"] for r in hit], [r["speedup"] for r in hit], marker="o", ms=3,
                            color=colours[name], label=name)
                missed = [r["clients"] for r in line if r["speedup"] is None]
                if missed:
                    ax.scatter(missed, [1.15 * floor] * len(missed), marker="x", s=18, color=colours[name],
                               label=None if hit else name)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log", base=2)
            ax.set_ylim(floor, max(ks) * 1.2 if ks else 2)
            ax.set_xticks(ks, [str(k) for k in ks])
            ax.grid(alpha=0.3)
            goal = f"{target:.0%}" if m.percent else f"{target:g}"
            ax.set_title(f"{'equal speeds' if speed == 'equal' else speed}, target {goal} {m.name}",
                         fontsize=9)
            ax.set_xlabel("clients K")
            if j == 0:
                ax.set_ylabel("speedup vs tuned 1 client")
    handles = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    fig.legend(handles.values(), handles.keys(), fontsize=7, loc="center right")
    fig.suptitle(f"time to target against the tuned single client ({sweep.name})\nx at the bottom: not reached "
                 "within the budget", fontsize=10)  # two lines: one is wider than a single panel
    fig.tight_layout(rect=(0, 0, width / (width + legend_in), 1))  # the legend beside the panels, never on them
    return fig
