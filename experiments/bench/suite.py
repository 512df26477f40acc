"""`asgd bench` (also `make bench`): every performance figure of the tool, side by side.

    asgd bench [--out results/bench.json] [--markdown PAGE.md] [--quick]

One run measures, on this machine:
1. wire: push + pull through the server against raw MPI plus the apply, and the apply
   against memcpy (experiments/bench/wire.py);
2. server under load: 1, 2, 4, 8 clients pushing without compute (oversubscribed where
   cores are few), and whether a waiting rank leaves the cores to the others
   (experiments/bench/idle_wait.py);
3. server-bound: pushes/s of our server and of a torch.distributed.rpc parameter server
   with no-compute clients, 1e4 to 1.6e7 floats with 1 and 2 clients, and at the proxy
   CNN's size with 1, 2 and 4 (experiments/bench/versus.py);
4. peers: samples/s of our async server (n_sync 1 and 10) and sync mode against torch
   DDP (gloo) and a torch.distributed.rpc parameter server (experiments/bench/peers.py),
   same model, data, clients and batch;
5. simulator: its wall time against the pure compute of the same minibatches.
Every comparison runs its two sides in turn, trial by trial after a warm-up
(experiments/bench/trials.py), and reports the median of the per-trial ratios with their
interquartile range; a median below a physical lower bound is flagged as a measurement
error. Nothing here asserts a time: the numbers are for reading. About 12 minutes on 2
cores; `--quick` is a smoke run.

The JSON is rewritten after every section; at the end the same tables that are printed
go to a Markdown page (default: beside the JSON; `make bench` writes
docs/results/bench.md, the page docs/performance.md links to), so no measured number is
ever copied by hand.
"""
from __future__ import annotations

import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from experiments.bench.trials import SPREAD, interleave, ratio_cell, summarise
from experiments.parent.mpiexec import find_mpiexec
from paramserver.rundir.durable import read_jsonl, write_json_atomic, write_text_atomic
from paramserver.rundir.layout import RunDir

PYTHON = [sys.executable, "-m"]
WARMUP = 5


def mpi(ranks: int, module: str, *args: str, timeout: float = 300) -> Any:
    """Run a benchmark module on `ranks` MPI ranks; what rank 0 wrote to --json."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "result.json"
        command = [find_mpiexec() or "mpiexec", "-n", str(ranks), *PYTHON, module, *args, "--json", str(out)]
        subprocess.run(command, check=True, timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})
        return json.loads(out.read_text())


def wire(quick: bool) -> list[dict]:
    sizes = "1e5,1e6,4e6" if quick else "1e5,1e6,4e6,1.6e7"
    return mpi(2, "experiments.bench.wire", "wire", "--sizes", sizes, "--trials", "3" if quick else "7",
               "--repeats", "5" if quick else "10")


def ours_load(servers: int, clients: int, size: float, seconds: float) -> dict:
    """`wire.py load` once."""
    return mpi(servers + clients, "experiments.bench.wire", "load", "--size", str(size), "--seconds", str(seconds),
               "--servers", str(servers))


def median_of(runs: list[dict]) -> dict:
    """The run with the median pushes/s: on a machine with fewer cores than ranks one
    run's rate depends on how the scheduler happened to place them."""
    runs = sorted(runs, key=lambda r: r["pushes_per_s"])
    return {**runs[len(runs) // 2], "repeats_pushes_per_s": [r["pushes_per_s"] for r in runs]}


def load(quick: bool) -> list[dict]:
    """Clients 1..8 on one server (1e6 floats), then 4 clients on 1, 2 and 4 sharded servers
    (4e6 floats: enough bytes per push that splitting them can pay), then 1, 2 and 4 clients
    at the proxy CNN's size, where the server's own time a push has its target."""
    seconds, repeats = (0.5, 1) if quick else (1.0, 3)
    runs = [(1, k, 1e6) for k in (1, 2, 4, 8)] + [(s, 4, 4e6) for s in (1, 2, 4)]
    runs += [(1, k, proxy_floats()) for k in ((1,) if quick else (1, 2, 4))]
    return [median_of([ours_load(servers, k, size, seconds) for _ in range(repeats)]) for servers, k, size in runs]


def idle() -> dict:
    return mpi(3, "experiments.bench.idle_wait", "2")


def proxy_floats() -> int:
    """Floats in the default model (`asgd train`'s, on Fashion-MNIST's shape): a push of the proxy CNN."""
    from clients.models import build_model
    from experiments.bench.peer_setup import SHAPES
    from paramserver.config import RunConfig

    cfg = RunConfig()
    shape, classes = SHAPES[cfg.model]
    return sum(p.numel() for p in build_model(cfg.model, shape, classes, cfg.seed).parameters())


def server_bound(quick: bool) -> dict:
    """Our server (one, no-compute clients) against the RPC parameter server, trial by trial
    (versus.py): pushes/s across sizes with 1 and 2 clients, and at the proxy CNN's size
    with 4 clients too, the target table. Bigger pushes get longer windows (a few per window)."""
    from experiments.bench.versus import server_bound as measure

    proxy = proxy_floats()
    sizes = [10**4, proxy] if quick else sorted({10**4, proxy, 10**5, 10**6, 4 * 10**6, 16 * 10**6})
    seconds = {size: (0.3 if quick else 0.5) * (3 if size >= 4 * 10**6 else 1) for size in sizes}
    trials = 2 if quick else 5
    rows = [row for k in (1, 2) for row in measure(k, sizes, trials, seconds)]
    if not quick:
        rows += measure(4, [proxy], trials, seconds)
    return {"proxy_floats": proxy, "rows": rows}


def asgd_train(out: Path, *flags: str, timeout: float = 600) -> dict:
    """One `asgd train` run (it starts its own MPI job); its summary."""
    command = [sys.executable, "-m", "experiments.cli", "train", "--quiet", "--out", str(out), *flags]
    subprocess.run(command, check=True, timeout=timeout)
    return RunDir(out).summary()


def timed_rate(run: Path, clients: int, steps: int, batch: int) -> float:
    """samples/s over steps WARMUP+1 .. WARMUP+steps, timed by the slowest client (as the peers are)."""
    times = {(r["client"], r["step"]): r["time"] for r in read_jsonl(run / "clients.jsonl")}
    slowest = max(times[(c, WARMUP + steps)] - times[(c, WARMUP)] for c in range(clients))
    return clients * steps * batch / slowest


OURS_N1 = "ours: async, n_sync 1"  # the row every peer is compared with


def peers(quick: bool, clients: int = 2, batch: int = 64) -> list[dict]:
    """Every system once a trial, in turn (ours async n_sync 1, DDP, the RPC PS, ours
    n_sync 10, ours sync), `trials` trials: each row's per-trial ratio is ours async n_sync
    1 over that system in the same trial, so a machine that drifts between trials moves
    both sides of a ratio alike."""
    from experiments.bench.peer_setup import fashion_mnist_installed
    from experiments.bench.peers import ddp_throughput, rpc_ps_throughput
    from paramserver.config import RunConfig

    if not fashion_mnist_installed():
        return [{"system": "skipped: Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)"}]
    steps, trials = (40, 1) if quick else (150, 4)
    flags = ["--clients", str(clients), "--steps", str(WARMUP + steps), "--threads", "1", "--batch-size", str(batch),
             "--eval-samples", "100"]
    with tempfile.TemporaryDirectory() as folder:
        runs = itertools.count()

        def ours(*more: str) -> Callable[[], float]:
            def rate() -> float:
                run = Path(folder) / f"run{next(runs)}"
                asgd_train(run, *flags, *more)
                return timed_rate(run, clients, steps, batch)
            return rate

        def peer(measure: Callable[..., dict]) -> Callable[[], float]:
            return lambda: measure(clients, steps, batch, warmup=WARMUP, threads=1)["samples_per_s"]

        systems = {OURS_N1: ours("--n-sync", "1"), "torch DDP (gloo)": peer(ddp_throughput),
                   "torch.distributed.rpc PS": peer(rpc_ps_throughput),
                   "ours: async, n_sync 10": ours("--n-sync", "10"), "ours: sync (allreduce)": ours("--mode", "sync")}
        rates: dict[str, list[float]] = {name: [] for name in systems}
        for _ in range(trials):
            for name, rate in systems.items():
                rates[name].append(rate())
    rule = RunConfig().rule  # asgd train's default: the rule our async rows measured
    return [{"system": name, "samples_per_s": statistics.median(values), "trials": values,
             "vs": summarise(rates[OURS_N1], values), **({"rule": rule} if name.startswith("ours") else {})}
            for name, values in rates.items()]


def simulator(quick: bool) -> list[dict]:
    """The sim backend's wall time for K clients against pure compute of as many minibatches
    in this process (a lower bound), trial by trial: its overhead (events, binding K clients
    to one model, the server). Both run here, so no process start-up is timed."""
    total, trials, clients = (160, 1, (8,)) if quick else (240, 3, (1, 8, 32))
    compute = compute_steps()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for k in clients:
            runs = iter(range(1, 100))

            def sim(k: int = k) -> float:
                return sim_train(Path(folder) / f"sim{k}-{next(runs)}", k, total // k)["train_wall_s"]

            # One warm-up pair, before the first: the process stays warm for the rest.
            vs = interleave(sim, lambda: compute(total), trials, warmup=int(k == clients[0]), lower_bound=True)
            rows.append({"clients": k, "minibatches": total, "trials": trials, "sim_wall_s": vs["ours_median"],
                         "compute_s": vs["other_median"], "overhead": vs})
    return rows


def sim_train(out: Path, clients: int, steps: int) -> dict:
    """One simulated run (`asgd train --backend sim`'s) in this process; its summary."""
    from experiments.simulator import run_sim
    from paramserver.config import RunConfig

    cfg = RunConfig(quiet=True, backend="sim", clients=clients, steps=steps, eval_samples=100, threads=1, out=str(out))
    run_sim(cfg, str(out), clients)
    return RunDir(out).summary()


def compute_steps() -> Callable[[int], float]:
    """Seconds for n steps of the default model on one client in this process, set up once."""
    import torch

    from clients.data import load_dataset
    from clients.models import run_model
    from experiments.assemble import make_client, make_replica
    from paramserver.config import RunConfig

    torch.set_num_threads(1)
    cfg = RunConfig()
    dataset = load_dataset(cfg.data)
    client = make_client(cfg, make_replica(cfg, run_model(cfg, dataset), "cpu", 1), dataset, 1, 0)
    for _ in range(WARMUP):
        client.step()

    def seconds(minibatches: int) -> float:
        torch.set_num_threads(1)  # again: a run in this process restores the count it found when it ends
        start = time.perf_counter()
        for _ in range(minibatches):
            client.step()
        return time.perf_counter() - start
    return seconds


def run_bench(out: str, quick: bool, markdown: str | None = None) -> int:
    """Measure everything, print the tables, write `out` (JSON) and `markdown` (the
    tables as a page; default: `out` with the suffix .md)."""
    from mpi4py import MPI

    started = time.perf_counter()
    results: dict[str, Any] = {"machine": {"cores": os.cpu_count(), "mpi": MPI.Get_library_version().splitlines()[0],
                                           "quick": quick, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}}
    for name, measure in (("wire", wire), ("load", load), ("idle", lambda quick: idle()),
                          ("server_bound", server_bound), ("peers", peers), ("simulator", simulator)):
        print(f"bench: {name} ...", file=sys.stderr, flush=True)
        results[name] = measure(quick)
        write_json_atomic(Path(out), results)  # a crash later loses only the section under way
    results["machine"]["bench_s"] = time.perf_counter() - started
    write_json_atomic(Path(out), results)
    print(tables(results))
    page = write_markdown(Path(markdown) if markdown else Path(out).with_suffix(".md"), results)
    print(f"written: {out}, {page}", file=sys.stderr)
    return 0


def write_markdown(path: Path, results: dict[str, Any]) -> Path:
    """The tables as a Markdown page that says where and when they were measured, written
    atomically (its folder made first): what the docs show is always a whole bench run."""
    machine = results["machine"]
    note = " A `--quick` smoke run: too few repeats to quote." if machine.get("quick") else ""
    text = (f"# Benchmarks, as measured\n\nWritten by `asgd bench` (`make bench`) on "
            f"{machine.get('date', 'an unknown date')} in {machine.get('bench_s', 0) / 60:.0f} min; do not edit: rerun "
            f"it to regenerate. What the numbers mean and their targets: docs/performance.md.{note}\n\n"
            f"{tables(results)}\n")
    write_text_atomic(path, text)
    return path


def tables(r: dict[str, Any]) -> str:
    """The results as Markdown tables: what the bench prints and docs/results/bench.md holds."""
    per_trial = f"median of per-trial ratios ({SPREAD})"
    lines = [f"{r['machine']['cores']} cores, {r['machine']['mpi']}", "",
             f"Each ratio compares its two sides measured in turn, trial by trial: the {per_trial}. A median "
             "below a physical lower bound (raw MPI + apply; memcpy; pure compute) is marked as a measurement error.",
             "", "| floats | MB | raw one-way ms | push+pull ms | apply ms | apply / memcpy, " + per_trial +
             " | push+pull / (2 x raw one-way + apply), " + per_trial + " (target <= 1.25) |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {w['floats']:.0e} | {w['mbytes']:.1f} | {w['raw_one_way_ms']:.3f} | {w['round_trip_ms']:.3f} | "
              f"{w['apply_ms']:.3f} | {ratio_cell(w['apply_vs_copy'])} | {ratio_cell(w['vs_bound'])} |"
              for w in r["wire"]]
    lines += ["", "| servers | clients (no compute) | floats | pushes/s | MB/s through the servers | server 0 busy | "
              "server 0's own us a push, wall: receive + check + apply + reply + record = total; its CPU "
              "(target at the proxy size: <= 150) |", "|---:|---:|---:|---:|---:|---:|---|"]
    lines += [f"| {x['servers']} | {x['clients']} | {x['floats']:.3g} | {x['pushes_per_s']:.0f} | "
              f"{x['mbytes_per_s']:.0f} | {x['server_busy']:.0%} | {push_cost_cell(x.get('server_push_us'))} |"
              for x in r["load"]]
    idle = r["idle"]
    lines += ["", f"A waiting rank (2 computing ranks beside it): blocking Recv burns {idle['blocking_cpu_s']:.2f} s "
              f"CPU, our wait {idle['polled_cpu_s']:.2f} s; the computing ranks do {idle['speedup']:.2f}x the work "
              f"beside ours."]
    lines += server_tables(r["server_bound"], per_trial)
    peers = r["peers"]
    if "samples_per_s" in peers[0]:
        rule = next((f"; ours with --rule {p['rule']}" for p in peers if "rule" in p), "")
        trials = len(peers[0]["trials"])
        lines += ["", f"| system (2 clients, same model, data, batch{rule}; {trials} trial(s), every system once a "
                  f"trial) | samples/s (median) | ours async n_sync 1 / it, {per_trial} (target >= 1 against DDP "
                  "and the RPC PS) |", "|---|---:|---:|"]
        lines += [f"| {p['system']} | {p['samples_per_s']:.0f} | {ratio_cell(p['vs'])} |" for p in peers]
    else:
        lines += ["", f"peers: {peers[0]['system']}"]
    lines += ["", "| simulated clients | minibatches a trial | sim wall s | pure compute s | sim / compute, "
              f"{per_trial} (target <= 1.15) |", "|---:|---:|---:|---:|---:|"]
    lines += [f"| {x['clients']} | {x['minibatches']} | {x['sim_wall_s']:.2f} | {x['compute_s']:.2f} | "
              f"{ratio_cell(x['overhead'])} |" for x in r["simulator"]]
    return "\n".join(lines)


def push_cost_cell(cost: dict[str, float] | None) -> str:
    """The server's phases a push (experiments/bench/wire.py's load), or "-" where a result predates them."""
    if not cost:
        return "-"
    return (" + ".join(f"{cost[p]:.0f}" for p in ("receive", "check", "apply", "reply", "record"))
            + f" = {cost['total']:.0f}; {cost['cpu']:.0f}")


def server_tables(bound: dict[str, Any], per_trial: str) -> list[str]:
    """Our server against the RPC PS, server-bound: across sizes, then the target table at the proxy CNN's size."""
    def row(x: dict, *first: str) -> str:
        return (f"| {' | '.join(first)} | {x['ours_pushes_per_s']:.0f} | {x['rpc_ps_pushes_per_s']:.0f} | "
                f"{ratio_cell(x['vs_rpc_ps'])} |")

    proxy = bound["proxy_floats"]
    lines = ["", f"| floats | MB | clients (no compute) | ours pushes/s (target >= 10,000 at 1e4 floats, 1 client) "
             f"| RPC PS pushes/s | ours / RPC, {per_trial} |",
             "|---:|---:|---:|---:|---:|---:|"]
    lines += [row(x, f"{x['floats']:.3g}", f"{4 * x['floats'] / 1e6:.2f}", str(x["clients"]))
              for x in bound["rows"] if x["clients"] < 4]
    lines += ["", f"| clients (no compute, the proxy CNN: {proxy} floats) | ours pushes/s (target >= 2,500 with 1 "
              f"client) | RPC PS pushes/s | ours / RPC, {per_trial} (target >= 2) |", "|---:|---:|---:|---:|"]
    lines += [row(x, str(x["clients"])) for x in bound["rows"] if x["floats"] == proxy]
    return lines
