"""Across hosts: the bench's section with the server on one host and its clients on
others, over TCP.

    asgd bench --cluster --only hosts      # on a test cluster it brings up (scripts/cluster.sh; root, ip netns)
    asgd bench --hosts node1,node2,node3   # on your hosts, reached as mpiexec reaches them (ssh)

The server (rank 0) on the first host, a client on each of the other two:
1. wire: 1 client on the second host, `wire.py wire` at 1e4 floats, the proxy CNN's size
   and 1e6: push + pull round trips/s through the real server loop, and per trial the
   ratio to raw MPI over the same link (Isend/Irecv there and back) plus the apply, a
   lower bound (target <= 1.25 at 1e6);
2. load: 2 no-compute clients, on the second and third hosts: `wire.py load` pushes/s
   at 1e4 floats and the proxy size, the median of 3 runs;
3. training: samples/s of `asgd train` (2 clients, n_sync 1) against torch DDP (gloo)
   with its 2 ranks on the same two client hosts, in turn, trial by trial (target >= 0.9).
Every job runs the one-host sections' code (jobs.py), placed by one `mpiexec` across the
hosts; DDP's ranks are started by `mpiexec` too (they never start MPI) and meet over
gloo's TCP at the first of their hosts. Each row keeps the machine's load average (1
min) as it started and ended: a test cluster's hosts share one machine's cores. Across
real hosts the bench's temporary folder (TMPDIR) must be on a file system they share, as
`asgd train`'s run directory must.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable

from bench.cluster import bench_cluster, missing
from bench.jobs import (PYTHON, WARMUP, Hosts, load_avg, loads_cell, median_of, mpi, mpiexec, ours_load,
                                    proxy_floats, trainer)
from bench.trials import interleave, ratio_cell
from experiments.parent.mpiexec import launcher_rank
from runconfig.settings import ConfigError, RunConfig

CLUSTER = "cluster"  # `--cluster`: the section's hosts are a test cluster it brings up
TEST_CLUSTER_LINK = ("a test cluster on one machine (scripts/cluster.sh): each host a network namespace, joined by "
                     "veth pairs on a Linux bridge, so the link is the kernel's TCP through veth and a bridge, "
                     "no network card; every host shares the machine's cores")


def parse_hosts(text: str) -> Hosts:
    """`--hosts`: three distinct names, the server's first; a clear error before any launch."""
    names = tuple(name.strip() for name in text.split(","))
    if len(names) != 3 or "" in names or len(set(names)) != 3:
        raise ConfigError(f"bench: --hosts takes three distinct host names, the server's first "
                          f"(e.g. node1,node2,node3), not {text!r}")
    return Hosts(names)


def measure_across(quick: bool, hosts: Hosts | str) -> dict:
    """The section on `hosts`, or on the test cluster (CLUSTER), brought up for it; where
    this machine cannot hold one, the reason, in place of the numbers."""
    if isinstance(hosts, Hosts):
        return {**measure(quick, hosts), "link": f"hosts {', '.join(hosts.names)}, reached by mpiexec (ssh)"}
    why = missing()
    if why:
        print(f"bench: hosts: not measured: {why}", file=sys.stderr)
        return {"skipped": why}
    with bench_cluster() as cluster:
        return {**measure(quick, cluster), "link": TEST_CLUSTER_LINK}


def measure(quick: bool, hosts: Hosts) -> dict:
    proxy = proxy_floats()
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "hosts": list(hosts.names),
            "proxy_floats": proxy, "wire": wire_rows(quick, hosts, proxy),
            "load": load_rows(quick, hosts, proxy), "training": training(quick, hosts)}


def noting(measure: Callable[[], float], loads: list[float]) -> Callable[[], float]:
    """`measure`, noting the load average as each call starts."""
    def noted() -> float:
        loads.append(load_avg())
        return measure()
    return noted


def wire_rows(quick: bool, hosts: Hosts, proxy: int) -> list[dict]:
    """wire.py's `wire` with the server on the first host and the client on the second."""
    start = load_avg()
    rows = mpi(2, "bench.wire", "wire", "--sizes", f"1e4,{proxy},1e6", "--trials", "3" if quick else "7",
               "--repeats", "5" if quick else "20", hosts=hosts.part(0, 2))
    loads = [start, load_avg()]
    return [{**row, "round_trips_per_s": 1e3 / row["round_trip_ms"],
             "raw_round_trips_per_s": 1e3 / (2 * row["raw_one_way_ms"]), "load_avg": loads} for row in rows]


def load_rows(quick: bool, hosts: Hosts, proxy: int) -> list[dict]:
    """2 no-compute clients (second and third hosts) on the server (first host)."""
    seconds, repeats = (0.5, 1) if quick else (1.0, 3)
    rows = []
    for size in (10**4, proxy):
        start = load_avg()
        row = median_of([ours_load(1, 2, size, seconds, hosts=hosts) for _ in range(repeats)])
        rows.append({**row, "load_avg": [start, load_avg()]})
    return rows


def training(quick: bool, hosts: Hosts, clients: int = 2, batch: int = 64) -> dict:
    """Ours (server on the first host, a client on each other) against DDP (its ranks on
    those client hosts), in turn, trial by trial; samples/s as the one-host peers count them."""
    from bench.peers.setup import fashion_mnist_installed

    if not fashion_mnist_installed():
        return {"skipped": "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)"}
    steps, trials = (40, 1) if quick else (150, 4)
    loads: list[float] = []
    with tempfile.TemporaryDirectory() as folder:
        ours = trainer(folder, clients, steps, batch, "--n-sync", "1", hosts=hosts)
        ddp = lambda: ddp_across(hosts.part(1, clients), steps, batch)["samples_per_s"]  # noqa: E731
        vs = interleave(noting(ours, loads), noting(ddp, loads), trials, warmup=0)
    return {"clients": clients, "steps": steps, "batch_size": batch, "trials": trials, "rule": RunConfig().rule,
            "ours_samples_per_s": vs["ours_median"], "ddp_samples_per_s": vs["other_median"], "vs_ddp": vs,
            "load_avg": loads + [load_avg()]}


def ddp_across(hosts: Hosts, steps: int, batch: int, timeout: float = 300) -> dict:
    """torch DDP (gloo), one rank a host on `hosts`, training what peers.ddp_throughput
    trains; its summary. Each rank writes its (seconds, digest) to a shared folder."""
    from bench.peers.setup import make_workload
    from bench.peers.run import ddp_summary

    w = replace(make_workload(len(hosts.names), steps, batch, "cnn", WARMUP, 1, timeout), host=hosts.names[0])
    launch, env = mpiexec(w.clients, hosts)
    env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # not c10d's warning that a peer's address has no name
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        subprocess.run([*launch, *PYTHON, "bench.hosts", json.dumps(asdict(w), separators=(",", ":")),
                        folder], check=True, timeout=timeout, env=env)
        call_s = time.perf_counter() - start
        ranks = [tuple(json.loads((Path(folder) / f"rank{rank}.json").read_text())) for rank in range(w.clients)]
    return ddp_summary(w, ranks, call_s)


def ddp_process(workload: str, folder: str) -> None:
    """A DDP rank that mpiexec started (`python -m bench.hosts WORKLOAD FOLDER`)."""
    from bench.peers.setup import Workload, prepare
    from bench.peers.run import ddp_rank

    w = Workload(**json.loads(workload))
    rank = launcher_rank()
    if rank is None:
        raise SystemExit("bench: a DDP rank across hosts is started by mpiexec (no launcher rank here)")
    prepare(w)
    (Path(folder) / f"rank{rank}.json").write_text(json.dumps(ddp_rank(rank, w)))


def tables(section: dict, per_trial: str) -> list[str]:
    """The section's tables, or why it was not measured."""
    if "skipped" in section:
        return ["", f"Across hosts: not measured: {section['skipped']}."]
    first, *others = section["hosts"]
    lines = ["", f"Across hosts (measured {section['date']}): the server on {first}, clients on "
             f"{' and '.join(others)}; {section['link']}. The last column: the machine's load average (1 min) as the row's measurement started and ended."]
    lines += ["", f"| floats | MB | raw MPI round trips/s ({first} <-> {others[0]}) | ours: push+pull round trips/s, "
              f"1 client | apply ms | push+pull / (2 x raw one-way + apply), {per_trial} (target <= 1.25 at 1e6) "
              "| load |", "|---:|---:|---:|---:|---:|---:|---|"]
    lines += [f"| {w['floats']:.3g} | {w['mbytes']:.2f} | {w['raw_round_trips_per_s']:.0f} | "
              f"{w['round_trips_per_s']:.0f} | {w['apply_ms']:.3f} | {ratio_cell(w['vs_bound'])} | "
              f"{loads_cell(w['load_avg'])} |" for w in section["wire"]]
    lines += ["", f"| clients (no compute, on {' and '.join(others)}) | floats | pushes/s (median of runs) | "
              "server busy | load |", "|---:|---:|---:|---:|---|"]
    lines += [f"| {x['clients']} | {x['floats']:.3g} | {x['pushes_per_s']:.0f} | {x['server_busy']:.0%} | "
              f"{loads_cell(x['load_avg'])} |" for x in section["load"]]
    return lines + training_table(section["training"], first, others, per_trial)


def training_table(t: dict, first: str, others: list[str], per_trial: str) -> list[str]:
    if "skipped" in t:
        return ["", f"Training across hosts: not measured: {t['skipped']}."]
    vs = t["vs_ddp"]
    return ["", f"| {t['clients']} clients on {' and '.join(others)}, batch {t['batch_size']}, {t['steps']} timed "
            f"steps; {t['trials']} trial(s), in turn | samples/s (median) | ours / DDP, {per_trial} (target >= 0.9) "
            "| load over the trials |", "|---|---:|---:|---|",
            f"| ours: async, n_sync 1, --rule {t['rule']}, server on {first} | {t['ours_samples_per_s']:.0f} | "
            f"{ratio_cell(vs)} | {loads_cell(t['load_avg'])} |",
            f"| torch DDP (gloo), its ranks on {' and '.join(others)} | {t['ddp_samples_per_s']:.0f} | | |"]


if __name__ == "__main__":
    ddp_process(*sys.argv[1:])
