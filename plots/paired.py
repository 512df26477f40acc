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

from plots.analysis import Sweep, SweepRun, load_sweep, markdown_table
from rundir.layout import RunDir
from rundir.measure import ERROR, LOSS, METRIC, recorded_measure

KEYS = {"error": ERROR, "loss": LOSS, "metric": METRIC}
UNPAIRED = ("seed",)  # what differs within a pair besides the `--by` keys


def final(point: SweepRun, column: str) -> float | None:
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
    the setting, the column compared, the seeds paired, the medians of both sides' finals
    over those seeds, and the differences (setting - reference) seed by seed with their
    median, absolute and relative."""
    finals: dict[tuple[str, tuple[str, ...]], dict[int, float]] = {}
    about: dict[str, tuple[Any, str]] = {}
    for point in points:
        column = key or recorded_measure(str(point.run)).key
        value = final(point, column)
        if value is not None:
            where = group(point, by)
            finals.setdefault((where, setting(point, by)), {})[point.seed] = value
            about[where] = (point.get("task"), column)
    rows = []
    for (where, chosen), values in finals.items():
        base = finals.get((where, reference))
        seeds = sorted(set(values) & set(base or {}))
        if chosen == reference or not seeds:
            continue
        diffs = [values[s] - base[s] for s in seeds]
        relative = [d / base[s] for d, s in zip(diffs, seeds)]
        rows.append({"task": about[where][0], "setting": dict(zip(by, chosen)), "column": about[where][1],
                     "seeds": seeds, "reference": float(np.median([base[s] for s in seeds])),
                     "value": float(np.median([values[s] for s in seeds])),
                     "diffs": diffs, "median_diff": float(np.median(diffs)),
                     "median_relative": float(np.median(relative))})
    return rows


def display(rows: list[dict]) -> list[dict]:
    """The rows as a page's table (plots.analysis.markdown_table): one cell a value."""
    return [{"task": r["task"], "setting": ", ".join(f"{k} {v}" for k, v in r["setting"].items()),
             "final": r["column"], "seeds": len(r["seeds"]), "reference": r["reference"], "setting's": r["value"],
             "difference seed by seed": ", ".join(f"{d:+.4f}" for d in r["diffs"]),
             "median difference": r["median_diff"], "relative %": 100 * r["median_relative"]} for r in rows]


def is_paired_sweep(sweep: Sweep) -> bool:
    return sweep.meta.get("study") == "paired"


def sections(sweep: Sweep) -> dict[str, list[dict]]:
    """A paired sweep's page (`study = "paired"`, its spec's `paired = {by, reference}`):
    each setting against the reference in the runs' own measure, and in test loss."""
    by = list(sweep.meta["paired"]["by"])
    reference = tuple(str(v) for v in sweep.meta["paired"]["reference"])
    named = ", ".join(f"{k} {v}" for k, v in zip(by, reference))
    return {f"Against {named}: the runs' measure": display(paired_table(sweep.points, by, reference, None)),
            f"Against {named}: test loss": display(paired_table(sweep.points, by, reference, LOSS))}


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
    print(markdown_table(display(rows)), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
