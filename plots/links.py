"""The links map (`make scaling-links`): where compression, fragments and more servers pay
over link bandwidth, and where they do not.

Read from a sweep whose spec says `study = "links"`, holds [tasks] (each with its
targets, in its own measure) and names each grid's `variant` (experiments/sweep/spec.py).
For each task, client count K and target, one table, the map:
- a row per link bandwidth (`sim_bandwidth`, fastest first), a column per variant (in the
  order the sweep lists them);
- a cell: the time to the target (plots/scaling.py's `reached`: the first evaluation at
  which the mean of the last 3 reaches it, in virtual seconds; the median over seeds, a
  miss counting as the slowest) over the reference's: the first variant (the default) at
  the highest bandwidth that ran, same task and K. Above 1: slower than the default on a
  fast link. `not reached`: not within the budget; a dash: not run.
Beside each map, the bytes each run pushed (median, MB), and a long table of every cell's
own numbers: the times, the final measure, the servers the run had (`servers = auto`
sizes them from the costs, the link included) and the busiest one's share of the run.
The variants table says what each column's runs set apart from the reference column's
(their recorded configs' differences: the fragments' rule, for one), and the runs table
which points ran with how many seeds, so a page from a cut-short sweep says what it covers. Times, never speedups against a single client: the question
is what a link costs each variant, not how well the method scales.
"""
from __future__ import annotations

from typing import Any

from plots.analysis import Sweep, SweepRun
from plots.rundata import load_json
from plots.scaling import final, median, reached

NOT_REACHED = "not reached"
DERIVED = {"eval_every", "steps"}  # follow from the budget and the variant's versions: not what sets it apart


def is_links_sweep(sweep: Sweep) -> bool:
    return sweep.meta.get("study") == "links"


def bandwidth_name(bytes_per_s: float) -> str:
    """A link's rate as its bits a second are named (1.25e10 B/s: 100 Gbps; 0, the
    simulator's "no bound", unlimited)."""
    if not bytes_per_s:
        return "unlimited"
    bits = 8 * bytes_per_s
    for unit, scale in (("Tbps", 1e12), ("Gbps", 1e9), ("Mbps", 1e6), ("kbps", 1e3)):
        if bits >= scale:
            return f"{bits / scale:g} {unit}"
    return f"{bits:g} bps"


def _task(point: SweepRun) -> str:
    return str(point.get("task") or "")


def _variants(point: SweepRun) -> list[str]:
    return list(point.get("variants") or [])


def _groups(sweep: Sweep) -> dict[tuple[str, int], dict[tuple[float, str], list[SweepRun]]]:
    """(task, K) -> (bandwidth, variant) -> the points (its seeds); a point stands in every
    column whose grid reached its config."""
    out: dict[tuple[str, int], dict[tuple[float, str], list[SweepRun]]] = {}
    for p in sweep.points:
        for variant in _variants(p):
            cell = (float(p.get("sim_bandwidth", 0.0)), variant)
            out.setdefault((_task(p), p.clients), {}).setdefault(cell, []).append(p)
    return out


def _columns(sweep: Sweep) -> list[str]:
    """The variants in the order the sweep's index lists them (the spec's grids' order)."""
    return list(dict.fromkeys(v for p in sweep.points for v in _variants(p)))


def _targets(sweep: Sweep, task: str) -> list[float]:
    return [float(t) for t in sweep.meta.get("tasks", {}).get(task, {}).get("targets", sweep.meta.get("targets", []))]


def _time(points: list[SweepRun], target: float) -> float | None:
    return median([(hit[0] if (hit := reached(p, target)) else None) for p in points])


def _fastest_first(rates: Any) -> list[float]:
    return sorted(set(rates), key=lambda r: -r if r else float("-inf"))  # 0: unlimited, first


def _rows_by_rate(cells: dict[tuple[float, str], Any]) -> list[float]:
    return _fastest_first(rate for rate, _ in cells)


def map_tables(sweep: Sweep) -> dict[str, list[dict]]:
    """Heading -> the map's rows: per task, K and target, time over the reference's."""
    columns, out = _columns(sweep), {}
    for (task, k), cells in sorted(_groups(sweep).items()):
        rates = _rows_by_rate(cells)
        for target in _targets(sweep, task):
            reference = next((cells[(r, columns[0])] for r in rates if (r, columns[0]) in cells), None)
            t0 = _time(reference, target) if reference else None
            rows = []
            for rate in rates:
                row: dict[str, Any] = {"bandwidth": bandwidth_name(rate)}
                for variant in columns:
                    points = cells.get((rate, variant))
                    t = _time(points, target) if points else None
                    row[variant] = None if not points else NOT_REACHED if t is None else t / t0 if t0 else None
                rows.append(row)
            out[f"{task or 'the task'}, K = {k}, target {target:g}"] = rows
    return out


def bytes_tables(sweep: Sweep) -> dict[str, list[dict]]:
    """Heading -> per task and K: the bytes a run pushed (median over seeds, MB)."""
    columns, out = _columns(sweep), {}
    for (task, k), cells in sorted(_groups(sweep).items()):
        rows = []
        for rate in _rows_by_rate(cells):
            row: dict[str, Any] = {"bandwidth": bandwidth_name(rate)}
            for variant in columns:
                pushed = [load_json(p.run, "summary").get("bytes_pushed") for p in cells.get((rate, variant), [])]
                row[variant] = median([v / 1e6 if isinstance(v, (int, float)) else None for v in pushed]) \
                    if pushed else None
            rows.append(row)
        out[f"{task or 'the task'}, K = {k}: MB pushed a run"] = rows
    return out


def cell_table(sweep: Sweep) -> list[dict]:
    """Every (task, K, bandwidth, variant): its runs' own numbers (medians over seeds)."""
    rows = []
    for (task, k), cells in sorted(_groups(sweep).items()):
        for rate in _rows_by_rate(cells):
            for variant in _columns(sweep):
                points = cells.get((rate, variant))
                if not points:
                    continue
                summaries = [load_json(p.run, "summary") for p in points]
                rows.append({"task": task, "K": k, "bandwidth": bandwidth_name(rate),
                             "variant": variant, "seeds": len(points),
                             **{f"time_to_{t:g}": _time(points, t) for t in _targets(sweep, task)},
                             "final": median([final(p) for p in points]),
                             "servers": _servers(points), "server_busy": median([s.get("server_busy")
                                                                                  for s in summaries]),
                             "MB_pushed": median([s.get("bytes_pushed", 0) / 1e6 for s in summaries])})
    return rows


def _servers(points: list[SweepRun]) -> str:
    """The server counts the runs had (auto's pick, from each run's config.json)."""
    return "/".join(sorted({str(load_json(p.run, "config").get("servers", "?")) for p in points}))


def runs_table(sweep: Sweep) -> list[dict]:
    """Which points ran: per task, K and variant, the runs, their bandwidths and seeds."""
    seen: dict[tuple[str, int, str], list[SweepRun]] = {}
    for p in sweep.points:
        for variant in _variants(p):
            seen.setdefault((_task(p), p.clients, variant), []).append(p)
    order = {v: i for i, v in enumerate(_columns(sweep))}
    return [{"task": task, "K": k, "variant": variant, "runs": len(points),
             "bandwidths": ", ".join(bandwidth_name(r)
                                     for r in _fastest_first(float(p.get("sim_bandwidth", 0.0)) for p in points)),
             "seeds": ", ".join(map(str, sorted({p.seed for p in points})))}
            for (task, k, variant), points in sorted(seen.items(), key=lambda e: (e[0][0], e[0][1], order[e[0][2]]))]


def variants_table(sweep: Sweep) -> list[dict]:
    """Per task, each variant's settings where its config departs from the reference
    column's at the same K and bandwidth (the first such pair that ran)."""
    columns, rows = _columns(sweep), []
    tasks = dict.fromkeys(task for task, _ in _groups(sweep))
    for task in tasks:
        for variant in columns:
            pair = next(((cells[key][0], cells[(key[0], columns[0])][0]) for (t, _), cells in _groups(sweep).items()
                         if t == task for key in cells if key[1] == variant and (key[0], columns[0]) in cells), None)
            if pair is None:
                continue
            mine, theirs = (p.settings.get("config", {}) for p in pair)
            shown = [f"{key} {mine[key]}" for key in mine if mine[key] != theirs.get(key) and key not in DERIVED]
            rows.append({"task": task, "variant": variant, "settings": ", ".join(shown) or "the reference"})
    return rows
