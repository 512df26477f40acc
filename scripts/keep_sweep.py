"""Keep a sweep's results in the repository: its finished runs' records, without their logs.

    python scripts/keep_sweep.py results/sweeps/NAME            # -> results/kept/NAME
    cp -r results/kept/NAME results/sweeps/NAME                # on a fresh clone: go on
    asgd sweep SPEC --out results/sweeps/NAME                  # runs only what is missing

A study's sweep can outlast the machine that runs it (the language-model study's 355
runs are many hours of both cores of the 2-core reference machine), and results/ is
scratch that a fresh clone does not have. What its page (`asgd report --docs`) reads of a run is
small: config.json, summary.json and eval.jsonl, about 12 KB, where the logs and the
checkpoint are megabytes. So this copies those three of every finished run, the folder's
specs and its index, into results/kept/NAME (which git tracks), and nothing else: the
copy is a sweep folder of its own, `asgd report` reads it as it reads the original, and
a copy of it in results/sweeps/ is a folder `asgd sweep` goes on with, running only
the points without a finished run. A point not finished when kept is `pending` in the
kept index, so the copy never claims a run it does not hold, unless the copy holds a
finished run of it already (kept from an earlier folder): that stays. A run finished in
the folder is copied again (a resumed run's record may have changed); nothing in the
destination outside what this writes is touched.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rundir.durable import write_json_atomic  # noqa: E402
from rundir.layout import RunDir  # noqa: E402
from rundir.status import PENDING  # noqa: E402

RECORDS = ("config.json", "summary.json", "eval.jsonl")


def keep(folder: Path, dest: Path) -> tuple[int, int]:
    """(runs kept, points in all)."""
    index = json.loads((folder / "index.json").read_text())
    dest.mkdir(parents=True, exist_ok=True)
    for spec in folder.glob("spec*.toml"):
        shutil.copyfile(spec, dest / spec.name)
    kept = 0
    for point in index["points"]:
        run, before = RunDir(folder / point["run"]), RunDir(dest / point["run"])
        if not run.finished():  # kept before, from a folder this one does not continue: stays
            point["status"] = before.status() if before.finished() else PENDING
            kept += before.finished()
            continue
        point["status"] = run.status()
        (dest / point["run"]).mkdir(parents=True, exist_ok=True)
        for name in RECORDS:
            if (run.path / name).exists():
                shutil.copyfile(run.path / name, dest / point["run"] / name)
        kept += 1
    write_json_atomic(dest / "index.json", index)
    return kept, len(index["points"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a sweep folder (results/sweeps/NAME)")
    parser.add_argument("dest", type=Path, nargs="?", help="where to keep it (default: results/kept/NAME)")
    args = parser.parse_args(argv)
    if not (args.folder / "index.json").is_file():
        parser.error(f"{args.folder} is not a sweep folder (no index.json)")
    dest = args.dest or ROOT / "results" / "kept" / args.folder.resolve().name
    kept, points = keep(args.folder, dest)
    print(f"kept {kept} finished runs of {points} points in {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
