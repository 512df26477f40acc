"""`asgd bench` (also `make bench`): every performance figure of the tool, side by side.

    asgd bench [--out results/bench.json] [--markdown PAGE.md] [--quick]
               [--cluster | --hosts H1,H2,H3] [--only SECTION,...]

One run measures, on this machine:
1. wire: push + pull through the server against raw MPI plus the apply, and the apply
   against memcpy (bench/wire.py);
2. server under load: 1, 2, 4, 8 clients pushing without compute (oversubscribed where
   cores are few), and whether a waiting rank leaves the cores to the others
   (bench/idle_wait.py);
3. server-bound: pushes/s of our server and of a torch.distributed.rpc parameter server
   with no-compute clients, 1e4 to 1.6e7 floats with 1 and 2 clients, and at the proxy
   CNN's size with 1, 2 and 4 (bench/versus.py);
4. peers: samples/s of our async server (n_sync 1 and 10) and sync mode against torch
   DDP (gloo) and a torch.distributed.rpc parameter server (bench/peers/run.py),
   same model, data, clients and batch;
5. simulator: its wall time against the pure compute of the same minibatches;
6. with --cluster or --hosts, across hosts: the server on one, clients on others, over
   TCP: the wire, no-compute load and training against DDP (bench/hosts.py).
Every comparison runs its two sides in turn, trial by trial after a warm-up
(bench/trials.py), and reports the median of the per-trial ratios with their
interquartile range; a median below a physical lower bound is flagged as a measurement
error. Nothing here asserts a time: the numbers are for reading. About 12 minutes on 2
cores; `--quick` is a smoke run.

The JSON is rewritten after every section; at the end the same tables that are printed
go to a Markdown page (default: beside the JSON; `make bench` writes
docs/results/bench.md, the page docs/performance.md links to), so no measured number is
ever copied by hand. `--only` measures some sections again and keeps the others from the JSON.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from bench.hosts import measure_across
from bench.hosts import tables as hosts_tables
from bench.jobs import WARMUP, Hosts, load_avg, loads_cell, median_of, mpi, ours_load, proxy_floats, trainer
from bench.scale import FULL, QUICK, Scale
from bench.trials import SPREAD, interleave, ratio_cell, summarise
from runconfig.settings import ConfigError
from rundir.durable import write_json_atomic, write_text_atomic
from rundir.layout import RunDir


def wire(scale: Scale) -> list[dict]:
    return mpi(2, "bench.wire", "wire", "--sizes", scale.wire_sizes, "--trials", str(scale.wire_trials),
               "--repeats", str(scale.wire_repeats))


def load(scale: Scale) -> list[dict]:
    """Clients 1..8 on one server (1e6 floats), then 4 clients on 1, 2 and 4 sharded servers
    (4e6 floats: enough bytes per push that splitting them can pay), then 1, 2 and 4 clients
    at the proxy CNN's size, where the server's own time a push has its target."""
    runs = [(1, k, 1e6) for k in scale.load_clients] + [(s, 4, 4e6) for s in scale.load_servers]
    runs += [(1, k, proxy_floats()) for k in scale.load_proxy_clients]
    return [median_of([ours_load(servers, k, size, scale.load_seconds) for _ in range(scale.load_repeats)])
            for servers, k, size in runs]


def idle(scale: Scale) -> dict:
    return mpi(3, "bench.idle_wait", str(scale.idle_seconds))


def server_bound(scale: Scale) -> dict:
    """Our server (one, no-compute clients) against the RPC parameter server, trial by trial
    (versus.py): pushes/s across sizes with 1 and 2 clients, and at the proxy CNN's size
    with 4 clients too, the target table. Bigger pushes get longer windows (a few per window)."""
    from bench.versus import server_bound as measure

    proxy = proxy_floats()
    sizes = sorted({proxy, *scale.bound_sizes})
    seconds = {size: scale.bound_seconds * (3 if size >= 4 * 10**6 else 1) for size in sizes}
    trials = scale.bound_trials
    rows = [row for k in scale.bound_clients for row in measure(k, sizes, trials, seconds)]
    if scale.bound_four_clients:
        rows += measure(4, [proxy], trials, seconds)
    return {"proxy_floats": proxy, "rows": rows}


OURS_N1 = "ours: async, n_sync 1"  # the row every peer is compared with


def peers(scale: Scale, clients: int = 2, batch: int = 64) -> list[dict]:
    """Every system once a trial, in turn (ours async n_sync 1, DDP, the RPC PS, ours
    n_sync 10, ours sync), `trials` trials: each row's per-trial ratio is ours async n_sync
    1 over that system in the same trial, so a machine that drifts between trials moves
    both sides of a ratio alike."""
    from bench.peers.setup import fashion_mnist_installed
    from bench.peers.run import ddp_throughput, rpc_ps_throughput
    from runconfig.settings import RunConfig

    if not fashion_mnist_installed():
        return [{"system": "skipped: Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)"}]
    steps, trials = scale.peers_steps, scale.peers_trials
    with tempfile.TemporaryDirectory() as folder:
        def ours(*more: str) -> Callable[[], float]:
            return trainer(folder, clients, steps, batch, *more)

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


def simulator(scale: Scale) -> list[dict]:
    """The sim backend's wall time for K clients against pure compute of as many minibatches
    in this process (a lower bound), trial by trial: its overhead (events, binding K clients
    to one model, the server). Both run here, so no process start-up is timed."""
    from clients.devices import threads_kept

    total, trials, clients = scale.sim_minibatches, scale.sim_trials, scale.sim_clients
    rows = []
    with tempfile.TemporaryDirectory() as folder, threads_kept():
        compute = compute_steps()
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
    from experiments.sim.simulator import run_sim
    from runconfig.settings import RunConfig

    cfg = RunConfig(quiet=True, backend="sim", clients=clients, steps=steps, eval_samples=100, threads=1, out=str(out))
    run_sim(cfg, str(out), clients)
    return RunDir(out).summary()


def compute_steps() -> Callable[[int], float]:
    """Seconds for n steps of the default model on one client in this process, set up once."""
    import torch

    from clients.data import load_dataset
    from clients.models import run_model
    from experiments.run.assemble import ClientSettings, make_client, make_replica
    from runconfig.settings import RunConfig

    torch.set_num_threads(1)
    cfg = RunConfig()
    dataset = load_dataset(cfg.data)
    settings = ClientSettings.from_config(cfg, 1)
    client = make_client(settings, make_replica(settings, run_model(cfg, dataset), "cpu"), dataset, 1, 0)
    for _ in range(WARMUP):
        client.step()

    def seconds(minibatches: int) -> float:
        torch.set_num_threads(1)  # again: set here, never inherited from the simulated run before it
        start = time.perf_counter()
        for _ in range(minibatches):
            client.step()
        return time.perf_counter() - start
    return seconds


SECTIONS = ("wire", "load", "idle", "server_bound", "peers", "simulator", "hosts")


def run_bench(out: str, quick: bool, markdown: str | None = None, across: Hosts | str | None = None,
              only: tuple[str, ...] = ()) -> int:
    """Measure everything (or the sections in `only`, the others kept from `out`), print
    the tables, write `out` (JSON) and `markdown` (the tables as a page; default: `out`
    with the suffix .md). `across`: also the section across hosts (bench/hosts.py)."""
    measures = chosen(across, only)
    started = time.perf_counter()
    results = start_results(Path(out), quick, only)
    loads = results["machine"].setdefault("load_avg", {})
    for name, measure in measures.items():
        print(f"bench: {name} ...", file=sys.stderr, flush=True)
        start = load_avg()
        results[name] = measure(QUICK if quick else FULL)
        loads[name] = [start, load_avg()]
        write_json_atomic(Path(out), results)  # a crash later loses only the section under way
    if not only:
        results["machine"]["bench_s"] = time.perf_counter() - started
    write_json_atomic(Path(out), results)
    print(tables(results))
    page = write_markdown(Path(markdown) if markdown else Path(out).with_suffix(".md"), results)
    print(f"written: {out}, {page}", file=sys.stderr)
    return 0


def chosen(across: Hosts | str | None, only: tuple[str, ...]) -> dict[str, Callable[[Scale], Any]]:
    """The sections to measure, in order; a bad `only` refused before anything runs."""
    unknown = [name for name in only if name not in SECTIONS]
    if unknown:
        raise ConfigError(f"bench: --only: no section {unknown[0]!r} (the sections: {', '.join(SECTIONS)})")
    if "hosts" in only and across is None:
        raise ConfigError("bench: --only hosts needs --cluster or --hosts (where to measure across hosts)")
    measures = {"wire": wire, "load": load, "idle": idle, "server_bound": server_bound, "peers": peers,
                "simulator": simulator}
    if across is not None:
        measures["hosts"] = lambda scale: measure_across(scale.quick, across)
    return {name: measure for name, measure in measures.items() if not only or name in only}


def start_results(out: Path, quick: bool, only: tuple[str, ...]) -> dict[str, Any]:
    """Where a run starts: this machine's description, or, measuring `only` some
    sections, the results already at `out` (the other sections kept as they are)."""
    from mpi4py import MPI

    if only and out.exists():
        return json.loads(out.read_text())
    return {"machine": {"cores": os.cpu_count(), "mpi": MPI.Get_library_version().splitlines()[0], "quick": quick,
                        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}}


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
             "below a physical lower bound (raw MPI + apply; memcpy; pure compute) is marked as a measurement error."]
    if r["machine"].get("load_avg"):
        lines[0] += "; load average (1 min) as each section started and ended: " + ", ".join(
            f"{name} {loads_cell(loads)}" for name, loads in r["machine"]["load_avg"].items())
    for name, table in (("wire", wire_table), ("load", load_table), ("idle", idle_line),
                        ("server_bound", server_tables), ("peers", peers_table), ("simulator", simulator_table),
                        ("hosts", hosts_tables)):
        if name in r:
            lines += table(r[name], per_trial)
    return "\n".join(lines)


def wire_table(wire: list[dict], per_trial: str) -> list[str]:
    lines = ["", "| floats | MB | raw one-way ms | push+pull ms | apply ms | apply / memcpy, " + per_trial +
             " | push+pull / (2 x raw one-way + apply), " + per_trial + " (target <= 1.25) |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    return lines + [f"| {w['floats']:.0e} | {w['mbytes']:.1f} | {w['raw_one_way_ms']:.3f} | "
                    f"{w['round_trip_ms']:.3f} | {w['apply_ms']:.3f} | {ratio_cell(w['apply_vs_copy'])} | "
                    f"{ratio_cell(w['vs_bound'])} |" for w in wire]


def load_table(load: list[dict], per_trial: str) -> list[str]:
    lines = ["", "| servers | clients (no compute) | floats | pushes/s | MB/s through the servers | server 0 busy | "
             "server 0's own us a push, wall: receive + check + apply + reply + record = total; its CPU "
             "(target at the proxy size: <= 150) |", "|---:|---:|---:|---:|---:|---:|---|"]
    return lines + [f"| {x['servers']} | {x['clients']} | {x['floats']:.3g} | {x['pushes_per_s']:.0f} | "
                    f"{x['mbytes_per_s']:.0f} | {x['server_busy']:.0%} | {push_cost_cell(x.get('server_push_us'))} |"
                    for x in load]


def idle_line(idle: dict, per_trial: str) -> list[str]:
    return ["", f"A waiting rank (2 computing ranks beside it): blocking Recv burns {idle['blocking_cpu_s']:.2f} s "
            f"CPU, our wait {idle['polled_cpu_s']:.2f} s; the computing ranks do {idle['speedup']:.2f}x the work "
            f"beside ours."]


def peers_table(peers: list[dict], per_trial: str) -> list[str]:
    if "samples_per_s" not in peers[0]:
        return ["", f"peers: {peers[0]['system']}"]
    rule = next((f"; ours with --rule {p['rule']}" for p in peers if "rule" in p), "")
    trials = len(peers[0]["trials"])
    lines = ["", f"| system (2 clients, same model, data, batch{rule}; {trials} trial(s), every system once a "
             f"trial) | samples/s (median) | ours async n_sync 1 / it, {per_trial} (target >= 1 against DDP "
             "and the RPC PS) |", "|---|---:|---:|"]
    return lines + [f"| {p['system']} | {p['samples_per_s']:.0f} | {ratio_cell(p['vs'])} |" for p in peers]


def simulator_table(simulator: list[dict], per_trial: str) -> list[str]:
    lines = ["", "| simulated clients | minibatches a trial | sim wall s | pure compute s | sim / compute, "
             f"{per_trial} (target <= 1.15) |", "|---:|---:|---:|---:|---:|"]
    return lines + [f"| {x['clients']} | {x['minibatches']} | {x['sim_wall_s']:.2f} | {x['compute_s']:.2f} | "
                    f"{ratio_cell(x['overhead'])} |" for x in simulator]


def push_cost_cell(cost: dict[str, float] | None) -> str:
    """The server's phases a push (bench/wire.py's load), or "-" where a result predates them."""
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
