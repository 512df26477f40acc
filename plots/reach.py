"""How much sooner each method reaches what a reference method ends at, seed by seed.

    python -m plots.reach results/kept/scaling-lm-proxy --speeds spread --clients 16 \\
        --reference "local-sgd n16"

Issue 54's question under uneven speeds: does asynchronous DiLoCo reach synchronous
DiLoCo's final loss sooner? The target is not fixed before the runs (it is the
reference's own end), so this is no speedup of the scaling page (plots/scaling.py, whose
targets are): it is a ratio of two methods' times, kept apart from it. For each seed the
reference ran with, the target is the reference's final curve value (the mean of its
last `SMOOTH` evaluations, as the page's times are smoothed) and its time is when the
reference first reached that; each method's time is when its own smoothed curve first
reached it, in the same seed, and its ratio is the reference's time over its own (above
1: sooner). A seed a method never reaches the target in is not reached, and its median
counts it as the slowest, as the page's medians do (`scaling.median`): a method that
misses it in half its seeds or more has no median ratio.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from plots.analysis import Sweep, SweepRun, load_sweep
from plots.scaling import SMOOTH, measure, median, method, reached, speeds
from plots.rundata import load_log


def last_value(point: SweepRun) -> float | None:
    """The mean of the run's last `SMOOTH` evaluations of its measure."""
    key = measure(str(point.run)).key
    values = [r[key] for r in load_log(point.run, "eval") if r.get(key) is not None]
    return float(np.mean(values[-SMOOTH:])) if len(values) >= SMOOTH else None


def reach_table(sweep: Sweep, speed: str, clients: int, reference: str) -> list[dict]:
    """A row a method of the (speed, clients) group: seeds it reached the reference's end
    in, its ratios seed by seed (None: not reached) and the ratio at the median of its
    times over the reference's (a miss the slowest; None where that is a miss). Empty
    where the reference has no run there."""
    group = [p for p in sweep.points if speeds(p) == speed and p.clients == clients]
    ends = {}
    for point in (p for p in group if method(p) == reference):
        target = last_value(point)
        got = reached(point, target) if target is not None else None
        if got is not None:
            ends[point.seed] = (target, got[0])
    rows = []
    for name in dict.fromkeys(method(p) for p in group):
        ratios = {}
        for point in (p for p in group if method(p) == name and p.seed in ends):
            target, time = ends[point.seed]
            got = reached(point, target)
            ratios[point.seed] = time / got[0] if got is not None and got[0] > 0 else None
        if ratios:
            slower = median([1 / r if r else None for r in ratios.values()])
            rows.append({"method": name, "seeds": len(ratios), "reached": sum(r is not None for r in ratios.values()),
                         "median": 1 / slower if slower else None, "ratios": [ratios[s] for s in sorted(ratios)]})
    return rows


def markdown(rows: list[dict], reference: str) -> str:
    def cell(ratio: float | None) -> str:
        return "not reached" if ratio is None else f"{ratio:.2f}x"
    lines = [f"| method | seeds reaching {reference}'s end | median | seed by seed |", "|---|---:|---:|---|"]
    lines += [f"| {r['method']} | {r['reached']} of {r['seeds']} | {cell(r['median'])} | "
              f"{', '.join(cell(x) for x in r['ratios'])} |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", help="a scaling study's sweep folder (or its kept copy)")
    parser.add_argument("--speeds", default="equal", help="the speed model's name, as the page's tables give it")
    parser.add_argument("--clients", type=int, required=True)
    parser.add_argument("--reference", required=True, help="a method's name, as the page's tables give it")
    args = parser.parse_args(argv)
    rows = reach_table(load_sweep(args.sweep), args.speeds, args.clients, args.reference)
    if not rows:
        print(f"plots.reach: no finished run of {args.reference!r} at {args.speeds}, {args.clients} clients "
              f"in {args.sweep}", file=sys.stderr)
        return 2
    print(markdown(rows, args.reference))
    return 0


if __name__ == "__main__":
    sys.exit(main())
