"""What one setting does to a run's end, seed by seed against a reference setting.

    python -m plots.paired results/kept/codecs-proxy --by compress,compress_pulls \\
        --reference none,False [--key loss]

Runs of a sweep whose configs differ only in the `--by` keys and that share a seed are a
pair: the same data order, initial weights and simulated costs, one change between them.
A target such as "within 0.2 points of float32's error" asks about that change, and the
seeds' own spread (2.4 points of test error over five seeds of a short Fashion-MNIST
run) hides it in a median of each side, while the difference in each seed does not
carry the spread. So for each setting a row: its median final value beside the
reference's, the difference seed by seed (absolute, and relative to the reference's
value) and their median. The final value is the summary's `final_<key>`: the run's
measure (rundir/measure.py) unless `--key` names another column.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

from plots.analysis import SweepRun, load_sweep
from rundir.layout import RunDir
from rundir.measure import ERROR, LOSS, METRIC, recorded_measure

KEYS = {"error": ERROR, "loss": LOSS, "metric": METRIC}
UNPAIRED = ("seed",)  # what differs within a pair besides the `--by` keys


def final(point: SweepRun, key: str | None) -> float | None:
    column = key or recorded_measure(str(point.run)).key
    value = RunDir(point.run).summary().get(f"final_{column}")
    return None if value is None or value != value else float(value)  # NaN: an error a model without classes lacks


def setting(point: SweepRun, by: list[str]) -> tuple[str, ...]:
    config = point.get("config", {})
    return tuple(str(config.get(name, point.get(name))) for name in by)


def group(point: SweepRun, by: list[str]) -> str:
    """The point's config without the `--by` keys and the seed: a pair shares it."""
    config = {k: v for k, v in point.get("config", {}).items() if k not in by and k not in UNPAIRED}
    return json.dumps({"task": point.get("task"), **config}, sort_keys=True, default=str)


def paired_table(points: list[SweepRun], by: list[str], reference: tuple[str, ...], key: str | None) -> list[dict]:
    """A row per (group, setting) that has a reference run in some seed: the group's task,
    the setting, the seeds paired, the medians of both sides' finals over those seeds, and
    the differences (setting - reference) seed by seed with their median, absolute and
    relative."""
    finals: dict[tuple[str, tuple[str, ...]], dict[int, float]] = {}
    tasks: dict[str, Any] = {}
    for point in points:
        value = final(point, key)
        if value is not None:
            finals.setdefault((group(point, by), setting(point, by)), {})[point.seed] = value
            tasks[group(point, by)] = point.get("task")
    rows = []
    for (where, chosen), values in finals.items():
        base = finals.get((where, reference))
        seeds = sorted(set(values) & set(base or {}))
        if chosen == reference or not seeds:
            continue
        diffs = [values[s] - base[s] for s in seeds]
        relative = [d / base[s] for d, s in zip(diffs, seeds)]
        rows.append({"task": tasks[where], "setting": dict(zip(by, chosen)), "seeds": seeds,
                     "reference": float(np.median([base[s] for s in seeds])),
                     "value": float(np.median([values[s] for s in seeds])),
                     "diffs": diffs, "median_diff": float(np.median(diffs)),
                     "median_relative": float(np.median(relative))})
    return rows


def markdown(rows: list[dict], reference: str) -> str:
    lines = [f"| task | setting | seeds | {reference} (median) | setting (median) | difference seed by seed "
             "| median difference | relative |", "|---|---|---:|---:|---:|---|---:|---:|"]
    for r in rows:
        said = ", ".join(f"{k} {v}" for k, v in r["setting"].items())
        lines.append(f"| {r['task'] or ''} | {said} | {len(r['seeds'])} | {r['reference']:.4g} | {r['value']:.4g} | "
                     f"{', '.join(f'{d:+.4f}' for d in r['diffs'])} | {r['median_diff']:+.4f} | "
                     f"{100 * r['median_relative']:+.2f} % |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", help="a sweep folder (or its kept copy)")
    parser.add_argument("--by", required=True, help="the config keys that make a setting, comma-separated")
    parser.add_argument("--reference", required=True, help="the reference setting's values of those keys, "
                                                           "comma-separated, as config.json writes them")
    parser.add_argument("--key", choices=sorted(KEYS), help="the final column compared (default: the runs' measure)")
    args = parser.parse_args(argv)
    by, reference = args.by.split(","), tuple(args.reference.split(","))
    if len(by) != len(reference):
        print(f"plots.paired: --by names {len(by)} keys and --reference gives {len(reference)} values",
              file=sys.stderr)
        return 2
    rows = paired_table(load_sweep(args.sweep).points, by, reference, KEYS.get(args.key))
    if not rows:
        print(f"plots.paired: no finished run of {args.sweep} pairs with a reference run "
              f"({', '.join(f'{k} {v}' for k, v in zip(by, reference))}) in a seed", file=sys.stderr)
        return 2
    print(markdown(rows, ", ".join(reference)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
