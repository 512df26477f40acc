"""Training efficiency under churn, in the simulator: how much of K clients' time goes into
steps while clients fail and come back (issue 55's figure).

    python -m bench.studies.churn_efficiency [--clients 8] [--mtbf 1000,400,165,100,60,29]
        [--down 20] [--seeds 3] [--steps 400] [--jobs 2] [--page docs/results/churn.md]

Efficiency is the minibatches that entered a step over K x the run's elapsed minibatch
times (its virtual seconds over a minibatch's): 1 only where every client computed all
the time and nothing it computed was lost. A failure costs a client `--down` minibatch
times down, the work it had not pushed, and what the method makes the others wait
for it. Each client fails after exponential times of mean `--mtbf` minibatch
times (the simulator's `mtbf`, `failure_length`: its failures come back as the same
client, as a killed joiner's replacement takes its shard over MPI: docs/joining.md).
The cap is each run's own: the failure-free efficiency less the share of the clients'
time its failures held them down (failures x down over K x the elapsed minibatch times).

Methods, each at the tool's defaults but for what names it: the default `fresh`, `add`
(the paper's), delayed Nesterov (`nesterov`, asynchronous DiLoCo) at n_sync 16,
synchronous SGD (`--mode sync`, which waits for a failed client), and synchronous DiLoCo
(`--mode local-sgd` at n_sync 16: it waits likewise, and the failed client loses its round). The study's costs (a
minibatch 6 ms, a push 0.23 ms: experiments/configs/proxy/scaling.toml) on the tiny data
set of the tests: what is measured is time, which the data does not change (a run
that diverges there is counted apart, its efficiency left out: a refused push enters no
step, whatever churn does). It prints a table (median and range over seeds) and with `--page` writes it and the figure (the
figure beside the page, in docs/figures/). Measured, never asserted.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from plots.churn import churn_figure
from rundir.status import DIVERGED, EXIT_DIVERGED, word
from tests.conftest import make_tiny_npz

ASGD = str(Path(sys.executable).with_name("asgd"))
STEP_S, PUSH_S = 0.006, 0.00023
METHODS = {"fresh (the default)": [], "add": ["--rule", "add"],
           "delayed Nesterov, n_sync 16": ["--rule", "nesterov", "--n-sync", "16"],
           "sync": ["--mode", "sync"],
           "synchronous DiLoCo (local SGD), n_sync 16": ["--mode", "local-sgd", "--n-sync", "16"]}


def efficiency(summary: dict, clients: int) -> float:
    """Minibatches in steps over K x the elapsed minibatch times."""
    return summary["minibatches_in_steps"] / (clients * summary["time_s"] / STEP_S)


def trained(summaries: list[dict]) -> list[dict]:
    """The runs that did not diverge: a diverged run's refused pushes entered no step, which
    measures its learning rate, not what churn costs (each table row counts them apart)."""
    return [s for s in summaries if word(s["status"]) != DIVERGED]


def one_run(folder: Path, data: Path, method: list[str], clients: int, steps: int, mtbf: float, down: float,
            seed: int, costs: tuple[float, float] = (STEP_S, PUSH_S)) -> dict:
    """`costs`: a minibatch's and a push's virtual seconds (bench/studies/churn_mpi.py
    gives those it measured over MPI)."""
    failures = ["--mtbf", f"{mtbf:g}", "--failure-length", f"{down:g}"] if math.isfinite(mtbf) else []
    command = [ASGD, "train", "--backend", "sim", "--quiet", "--data", str(data), "--clients", str(clients),
               "--steps", str(steps), "--seed", str(seed), "--batch-size", "32", "--eval-samples", "100",
               "--sim-step-time", f"{costs[0]:g}", "--sim-apply-time", f"{costs[1]:g}", "--threads", "1",
               "--checkpoint-every", "0", *failures, *method, "--out", str(folder)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode not in (0, EXIT_DIVERGED):
        raise RuntimeError(f"{' '.join(command)}: exit {done.returncode}\n{done.stderr}")
    return json.loads((folder / "summary.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--mtbf", default="1000,400,165,100,60,29", help="a client's mean minibatch times between "
                                                                        "failures (the failure-free run is added)")
    parser.add_argument("--down", type=float, default=20.0, help="minibatch times a failed client is down")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=400, help="a client's share of the run's budget")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once")
    parser.add_argument("--page", type=Path, help="write the table here, the figure to docs/figures/")
    args = parser.parse_args()
    mtbfs = [math.inf, *(float(m) for m in args.mtbf.split(","))]
    points = [(name, mtbf, seed) for name in METHODS for mtbf in mtbfs for seed in range(args.seeds)]
    with tempfile.TemporaryDirectory() as tmp:
        data = make_tiny_npz(Path(tmp) / "tiny.npz")
        with ThreadPoolExecutor(args.jobs) as pool:
            summaries = list(pool.map(lambda p: one_run(Path(tmp) / f"{list(METHODS).index(p[0])}-{p[1]:g}-{p[2]}",
                                                        data, METHODS[p[0]], args.clients, args.steps, p[1],
                                                        args.down, p[2]), points))
    got: dict[tuple[str, float], list[dict]] = {}
    for (name, mtbf, _), summary in zip(points, summaries):
        got.setdefault((name, mtbf), []).append(summary)
    rows = []
    for (name, mtbf), both in got.items():
        runs = trained(both)
        if not runs:
            continue  # every seed diverged: no time to measure, no row
        values = [efficiency(s, args.clients) for s in runs]
        free_runs = trained(got[(name, math.inf)])
        free = statistics.median(efficiency(s, args.clients) for s in free_runs) if free_runs else math.nan
        caps = [free * (1 - s.get("failures", 0) * args.down / (args.clients * s["time_s"] / STEP_S)) for s in runs]
        rows.append({"method": name, "mtbf": mtbf, "efficiency": statistics.median(values), "low": min(values),
                     "high": max(values), "cap": statistics.median(caps),
                     "failures": statistics.median(s.get("failures", 0) for s in runs),
                     "lost": statistics.median(s.get("minibatches_lost", 0) for s in runs),
                     "diverged": len(both) - len(runs)})
    table = _table(rows, args)
    print(table)
    if args.page:
        figure = args.page.parent.parent / "figures" / f"{args.page.stem}.png"
        args.page.parent.mkdir(parents=True, exist_ok=True)
        churn_figure(rows, args.down, figure)
        args.page.write_text(f"# Training efficiency under churn (the simulator)\n\nWritten by `python -m "
                             f"bench.studies.churn_efficiency {' '.join(sys.argv[1:])}`; do not edit. "
                             f"{_frame(args)}\n\n![efficiency over MTBF](../figures/{figure.name})\n\n{table}\n")


def _frame(args: argparse.Namespace) -> str:
    return (f"{args.clients} simulated clients, {args.steps} minibatches each (the run's budget), a minibatch "
            f"{STEP_S * 1e3:g} ms and a push {PUSH_S * 1e3:g} ms of virtual time, a failed client down "
            f"{args.down:g} minibatch times; median over {args.seeds} seeds (range). Efficiency: minibatches that "
            "entered a step over K x the elapsed minibatch times. Cap: what the down time alone leaves of the "
            "failure-free efficiency (each run's failures x down over K x its elapsed minibatch times taken off).")


def _table(rows: list[dict], args: argparse.Namespace) -> str:
    lines = ["| method | MTBF (minibatch times) | efficiency | range | cap | failures | minibatches lost | diverged |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        mtbf = "none" if not math.isfinite(row["mtbf"]) else f"{row['mtbf']:g}"
        lines.append(f"| {row['method']} | {mtbf} | {row['efficiency']:.3f} | {row['low']:.3f}-{row['high']:.3f} | "
                     f"{row['cap']:.3f} | {row['failures']:g} | {row['lost']:g} | {row['diverged']} of "
                     f"{args.seeds} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
