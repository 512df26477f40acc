"""Numbers over a sweep directory: curves, time to target, speedups, staleness, the paper's findings.

numpy only, so `asgd report` and the notebooks share one definition of every number the
figures and tables show.
"""
from __future__ import annotations

import csv
import functools
import json
import os
from collections import Counter
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from plots.rundata import load_json, load_log, smoothed_curve
from rundir.lock import RunDirError
from rundir.measure import recorded_measure
from rundir.modes import Mode
from rundir.smoothing import WINDOW
from rundir.status import finished

ROOT = Path(__file__).resolve().parents[1]  # relative sweep paths in notebooks start here

MODE_ORDER = {Mode.ASYNC: 0, Mode.SYNC: 1, Mode.LOCAL_SGD: 2}


@dataclass(frozen=True)
class SweepRun:
    """One run of a sweep. `train_size` comes from the index so a curve can be put in epochs."""
    id: str
    mode: str
    clients: int
    n_sync: int
    start: str
    seed: int
    run: Path
    status: str
    train_size: int = 60000
    rule: str = "add"          # the rules sweep's axes (experiments/configs/*/rules.toml)
    momentum: str = "0.9"      # as configured: a number, or "auto"
    jitter: float = 0.0
    profile: str = "measured"
    steps: int = 0             # minibatches a client, as the grid set them (0: not recorded)
    settings: dict[str, Any] = field(default_factory=dict, compare=False)  # the whole index entry: every axis

    def get(self, key: str, default: Any = None) -> Any:
        """An axis of the point as the index recorded it (lr, batch_size, backup_workers...)."""
        return self.settings.get(key, default)


@dataclass(frozen=True)
class Sweep:
    name: str
    path: Path
    meta: dict[str, Any]
    points: list[SweepRun]

    @property
    def window(self) -> int:
        """The smoothing window the spec set (minibatches), as `asgd report` uses it."""
        return int(self.meta.get("window", WINDOW))

    def select(self, **criteria: Any) -> list[SweepRun]:
        names = {f.name for f in fields(SweepRun)} - {"settings"}
        if unknown := set(criteria) - names:
            raise TypeError(f"unknown point fields: {sorted(unknown)}")
        return [p for p in self.points if all(getattr(p, k) == v for k, v in criteria.items())]

    def values(self, field: str, **criteria: Any) -> list:
        """The distinct values of one field among the selected points, sorted: the axes of a sweep."""
        return sorted({getattr(p, field) for p in self.select(**criteria)})


@dataclass(frozen=True)
class Curve:
    """Smoothed training curve of one run in its measure's training column (`column`: error,
    or loss where the run has no error rate: rundir/measure.py), in `error`
    either way; arrays are read-only because they are cached and shared."""
    time: np.ndarray
    minibatches: np.ndarray
    error: np.ndarray
    epochs: np.ndarray
    column: str = "error"

    @property
    def scale(self) -> float:
        """An error is drawn in percent."""
        return 100.0 if self.column == "error" else 1.0

    @property
    def name(self) -> str:
        return f"training {self.column}"

    @property
    def label(self) -> str:
        """The axis's: in percent for an error."""
        return self.name + (" (%)" if self.column == "error" else "")


def load_sweep(sweep_dir: str | Path) -> Sweep:
    """Only finished points are kept (complete, diverged, untrained): pending and failed runs have no
    final numbers to compare."""
    path = Path(sweep_dir).resolve()
    try:
        index = json.loads((path / "index.json").read_text())
        meta = {k: v for k, v in index.items() if k != "points"}
        train_size = int(meta.get("train_size", 60000))
        points = [SweepRun(id=p["id"], mode=p["mode"], clients=int(p["clients"]), n_sync=int(p["n_sync"]),
                           start=p.get("start", "cold"), seed=int(p.get("seed", 0)),
                           run=(path / p["run"]).resolve(), status=p["status"], train_size=train_size,
                           rule=p.get("rule", "add"), momentum=str(p.get("momentum", 0.9)),
                           jitter=float(p.get("speed_jitter", 0.0)), profile=p.get("sim_profile", "measured"),
                           steps=int(p.get("steps", 0)), settings=dict(p))
                  for p in index["points"] if finished(p.get("status", ""))]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise RunDirError(f"cannot read the sweep index {path / 'index.json'} ({type(error).__name__}: {error})") \
            from None
    return Sweep(name=meta.get("name", path.name), path=path, meta=meta, points=points)


def notebook_sweep(default: str) -> tuple[Sweep, int]:
    """The sweep a notebook draws, read as `asgd report` reads it: ASGD_SWEEP (else
    `default`), a relative path taken from the repository root wherever Jupyter started,
    and ASGD_WINDOW, else the spec's own window."""
    path = Path(os.environ.get("ASGD_SWEEP", default))
    sweep = load_sweep(path if path.is_absolute() else ROOT / path)
    return sweep, int(os.environ.get("ASGD_WINDOW") or sweep.window)


def curve(point: SweepRun, window: int = WINDOW) -> Curve:
    """The cache key includes the log's size and mtime, so a resumed run is read again."""
    log = point.run / "clients.jsonl"
    stamp = (log.stat().st_mtime_ns, log.stat().st_size) if log.exists() else (0, 0)
    return _curve(point.run, window, point.train_size, stamp)


@functools.lru_cache(maxsize=256)
def _curve(run: Path, window: int, train_size: int, _stamp: tuple[int, int]) -> Curve:
    column = recorded_measure(run).train_key
    time, minibatches, error = smoothed_curve(load_log(run, "clients"), window, column)
    batch_size = load_json(run, "config").get("batch_size", 64)
    arrays = [time, minibatches.astype(np.float64), error, minibatches * batch_size / train_size]
    for a in arrays:
        a.flags.writeable = False
    return Curve(*arrays, column=column)


def time_to_target(c: Curve, target: float, window: int = 1) -> float | None:
    """On the smoothed curve, so one lucky minibatch does not count as arriving, and only
    once the window is full: a mean of the first few minibatches is still noise (a warm
    start's first rows can sit below the target by chance)."""
    hit = np.flatnonzero((c.error <= target) & (c.minibatches >= window))
    return float(c.time[hit[0]]) if hit.size else None


def _error_at(c: Curve, minibatches: float) -> float:
    """Smoothed error after `minibatches` in total (the last value if the run is shorter)."""
    i = int(np.searchsorted(c.minibatches, minibatches))
    return float(c.error[min(i, len(c.error) - 1)])


def _single_client(sweep: Sweep, start: str) -> SweepRun:
    points = sweep.select(mode=Mode.ASYNC, clients=1, start=start)
    if not points:
        raise ValueError(f"sweep {sweep.name} has no complete 1-client async point with start {start}")
    return min(points, key=lambda p: (p.n_sync, p.seed))


def default_target(sweep: Sweep, window: int = WINDOW, start: str = "cold") -> float:
    """The 1-client run's final smoothed training error times 1.05.

    The 1-client async run (smallest n_sync, lowest seed, the given start) is the
    paper's baseline, so its final error is what "trained" means at this budget; the
    5% slack lets noisy or slightly worse multi-client curves reach it instead of
    counting them as never arriving because of a last-digit difference."""
    return 1.05 * float(curve(_single_client(sweep, start), window).error[-1])


def default_start(sweep: Sweep) -> str:
    """Warm when the sweep has a warm 1-client baseline: without the cold start's early slowdown the
    speedup measures the steady state, which is what adding clients is for."""
    return "warm" if sweep.select(mode=Mode.ASYNC, clients=1, start="warm") else "cold"


def speedups(sweep: Sweep, target: float | None = None, start: str = "cold", window: int = WINDOW) -> list[dict]:
    """One row per (mode, n_sync, clients), seeds averaged.

    With one client the weights do not depend on n_sync (every push is the client's own
    weights), so when no 1-client run has a row's n_sync the smallest one present is
    the baseline; `baseline_n_sync` says which was used."""
    if target is None:
        target = default_target(sweep, window, start)
    times: dict[tuple[str, int, int], list[float | None]] = {}
    for p in sweep.select(start=start):
        times.setdefault((p.mode, p.n_sync, p.clients), []).append(time_to_target(curve(p, window), target, window))
    means = {k: (float(np.mean(r)) if (r := [t for t in v if t is not None]) else None) for k, v in times.items()}
    ones = sorted(n for (mode, n, k) in times if mode == Mode.ASYNC and k == 1)
    rows = []
    for key in sorted(times, key=lambda k: (MODE_ORDER.get(k[0], 9), k[0], k[1], k[2])):
        mode, n_sync, clients = key
        base_n = n_sync if n_sync in ones else (ones[0] if ones else None)
        t, t1 = means[key], means.get((Mode.ASYNC, base_n, 1))
        speedup = t1 / t if t and t1 is not None else None
        rows.append({"mode": mode, "n_sync": n_sync, "clients": clients, "start": start, "seeds": len(times[key]),
                     "target": target, "time_to_target": t, "speedup": speedup,
                     "efficiency": speedup / clients if speedup is not None else None,
                     "reached": sum(x is not None for x in times[key]) / len(times[key]),
                     "baseline_n_sync": base_n})
    return rows


def staleness_table(sweep: Sweep) -> list[dict]:
    """Async points only (sync modes have no server); the mean is weighted by each run's pushes."""
    groups: dict[tuple[int, int], list[dict]] = {}
    for p in sweep.select(mode=Mode.ASYNC):
        groups.setdefault((p.clients, p.n_sync), []).append(load_json(p.run, "summary").get("staleness", {}))
    rows = []
    for (clients, n_sync), stats in sorted(groups.items()):
        hist: Counter[int] = Counter()
        weights = []
        for s in stats:
            counts = {int(a): int(b) for a, b in s.get("histogram", {}).items()}
            hist.update(counts)
            weights.append(sum(counts.values()) or 1)
        means = [s.get("mean") for s in stats]
        known = [(m, w) for m, w in zip(means, weights) if m is not None]
        rows.append({"clients": clients, "n_sync": n_sync, "runs": len(stats), "pushes": sum(hist.values()),
                     "mean": sum(m * w for m, w in known) / sum(w for _, w in known) if known else None,
                     "max": max((s["max"] for s in stats if s.get("max") is not None), default=None),
                     "histogram": dict(sorted(hist.items()))})
    return rows


def _cell(value: Any, markdown: bool) -> str:
    if value is None:
        return "–" if markdown else ""
    if isinstance(value, bool):
        return ("yes" if value else "no") if markdown else str(value)
    if isinstance(value, float | np.floating):
        if not markdown or not np.isfinite(value):
            return repr(float(value))
        return np.format_float_positional(value, precision=3, unique=False, fractional=False, trim="-")
    if isinstance(value, dict):
        return " ".join(f"{k}:{v}" for k, v in value.items())
    return str(value)


def markdown_table(rows: list[dict]) -> str:
    """Rounded to 3 significant digits; None is a dash; a `|` in a cell is escaped; no rows
    is a sentence, not a table of no columns (which renders as a stray line)."""
    if not rows:
        return "(none in this sweep)\n"
    columns = list(dict.fromkeys(k for row in rows for k in row))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row.get(c), True).replace("|", "\\|") for c in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_table(rows: list[dict], csv_path: str | Path, md_path: str | Path) -> tuple[Path, Path]:
    """CSV keeps full precision for machines (None is empty); Markdown as `markdown_table`."""
    columns = list(dict.fromkeys(k for row in rows for k in row))
    csv_path, md_path = Path(csv_path), Path(md_path)
    with open(csv_path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows([_cell(row.get(c), False) for c in columns] for row in rows)
    md_path.write_text(markdown_table(rows), encoding="utf-8")
    return csv_path, md_path


def _early_errors(sweep: Sweep, start: str, n_sync: int, window: int) -> tuple[int, dict[int, float]] | None:
    """Mean smoothed error per client count after 10% of the smallest count's minibatches."""
    points = sweep.select(mode=Mode.ASYNC, start=start, n_sync=n_sync)
    counts = sorted({p.clients for p in points})
    if len(counts) < 2:
        return None
    base = min(sweep.select(mode=Mode.ASYNC, start=start, n_sync=n_sync, clients=counts[0]), key=lambda p: p.seed)
    m = max(1, int(0.1 * curve(base, window).minibatches[-1]))
    return m, {k: float(np.mean([_error_at(curve(p, window), m) for p in points if p.clients == k])) for k in counts}


def _fmt(errors: dict[int, float], label: str = "{} clients") -> str:
    return ", ".join(f"{label.format(k)}: {v:.4f}" for k, v in errors.items())


def _column(sweep: Sweep, window: int) -> str:
    """What the findings' curves measure: the training error, or the loss of a model without
    classes (one sweep, one task)."""
    return curve(sweep.points[0], window).column if sweep.points else "error"


def _missing(why: str) -> dict:
    return {"holds": None, "evidence": f"not enough points: {why}"}


def _cold_start_slowdown(sweep: Sweep, window: int) -> dict:
    n_syncs = sweep.values("n_sync", mode=Mode.ASYNC, start="cold")
    early = _early_errors(sweep, "cold", n_syncs[0], window) if n_syncs else None
    if early is None:
        return _missing("needs cold async points at two client counts")
    m, errors = early
    lo, hi = min(errors), max(errors)
    return {"holds": errors[hi] > errors[lo],
            "evidence": f"cold, async, n_sync {n_syncs[0]}: smoothed {_column(sweep, window)} after {m} minibatches "
                        f"(10% of the {lo}-client run): {_fmt(errors)}"}


def _n_sync_hurts(sweep: Sweep, window: int) -> dict:
    """Judged at every client count above 1 with two n_sync values (not only the largest,
    where every run may have failed alike; one client's weights do not depend on n_sync):
    holds when the largest n_sync is worse at most of them."""
    counts = [k for k in sweep.values("clients", mode=Mode.ASYNC, start="cold")
              if k > 1 and len(sweep.values("n_sync", mode=Mode.ASYNC, start="cold", clients=k)) >= 2]
    if not counts:
        return _missing("needs cold async points at two n_sync values at one client count")
    worse, parts = 0, []
    for k in counts:
        n_syncs = sweep.values("n_sync", mode=Mode.ASYNC, start="cold", clients=k)
        groups = {n: sweep.select(mode=Mode.ASYNC, start="cold", clients=k, n_sync=n) for n in n_syncs}
        m = min(curve(p, window).minibatches[-1] for n in (n_syncs[0], n_syncs[-1]) for p in groups[n])
        final = {n: float(np.mean([_error_at(curve(p, window), m) for p in groups[n]])) for n in n_syncs}
        jagged = {n: float(np.mean([np.abs(np.diff(curve(p, window).error[:int(m)], 2)).mean()
                                    for p in groups[n]])) for n in n_syncs}
        worse += final[n_syncs[-1]] > final[n_syncs[0]]
        parts.append(f"{k} clients at {int(m)} minibatches: {_fmt(final, 'n_sync {}')} (jaggedness "
                     + ", ".join(f"{v:.1e}" for v in jagged.values()) + ")")
    return {"holds": worse > len(counts) / 2,
            "evidence": f"cold, async, smoothed {_column(sweep, window)}; larger n_sync worse at {worse} of "
                        f"{len(counts)} client counts; jaggedness = mean |2nd difference| of the smoothed curve. "
                        + "; ".join(parts)}


def _warm_start_helps(sweep: Sweep, window: int) -> dict:
    common = sorted(set(sweep.values("n_sync", mode=Mode.ASYNC, start="cold"))
                    & set(sweep.values("n_sync", mode=Mode.ASYNC, start="warm")))
    early = {s: _early_errors(sweep, s, common[0], window) for s in ("cold", "warm")} if common else {}
    if not early or None in early.values() or min(early["cold"][1]) != min(early["warm"][1]):
        return _missing("needs cold and warm async points at the same n_sync and client counts")
    lo = min(early["cold"][1])
    k = max(set(early["cold"][1]) & set(early["warm"][1]))
    if k == lo:
        return _missing("cold and warm share no client count above the smallest")
    gap = {s: early[s][1][k] - early[s][1][lo] for s in early}
    return {"holds": gap["warm"] < 0.5 * gap["cold"],
            "evidence": f"async, n_sync {common[0]}, {k} vs {lo} clients, early smoothed-{_column(sweep, window)} gap: "
                        f"cold {gap['cold']:.4f} (at {early['cold'][0]} minibatches), "
                        f"warm {gap['warm']:.4f} (at {early['warm'][0]} minibatches)"}


def _speedup_grows(sweep: Sweep, window: int) -> dict:
    start = default_start(sweep)
    n_syncs = sweep.values("n_sync", mode=Mode.ASYNC, start=start)
    if not sweep.select(mode=Mode.ASYNC, clients=1, start=start) or not n_syncs:
        return _missing(f"needs a 1-client async point with start {start}")
    rows = [r for r in speedups(sweep, start=start, window=window)
            if r["mode"] == Mode.ASYNC and r["n_sync"] == n_syncs[0]]
    base = [r for r in rows if r["clients"] == 1]
    many = {r["clients"]: r["speedup"] for r in rows if r["clients"] > 1}
    if len(many) < 2 or not base or base[0]["time_to_target"] is None:
        return _missing(f"needs two client counts above 1 at n_sync {n_syncs[0]} and a 1-client run that "
                        f"reaches the target")
    lo, hi = min(many), max(many)
    listed = ", ".join(f"{k} clients: {'never reached' if s is None else f'{s:.2f}x'}" for k, s in many.items())
    return {"holds": (many[hi] or 0.0) > (many[lo] or 0.0),
            "evidence": f"{start} start, async, n_sync {n_syncs[0]}, target {rows[0]['target']:.4f}: {listed}"}


CLAIMS = {
    "cold_start_slowdown": ("cold start: more clients learn more slowly per minibatch early on", _cold_start_slowdown),
    "n_sync_hurts": ("larger n_sync gives worse error at equal minibatches", _n_sync_hurts),
    "warm_start_helps": ("a warm start removes most of the early slowdown", _warm_start_helps),
    "speedup_grows": ("time-to-target speedup grows with clients", _speedup_grows),
}


def findings(sweep: Sweep, window: int = WINDOW) -> dict[str, dict]:
    """Each of the paper's qualitative claims checked on this sweep; `holds` is None when it cannot be."""
    return {key: {"claim": claim, **check(sweep, window)} for key, (claim, check) in CLAIMS.items()}
