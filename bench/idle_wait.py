"""What a waiting server costs the clients: blocking MPI receive against our polled wait.

    OMP_NUM_THREADS=1 mpiexec -n 3 python -m bench.idle_wait [SECONDS] [--json OUT]

Rank 0 waits for one message while ranks 1 and 2 compute (numpy matrix products) for
SECONDS; then rank 1 sends. Printed per mode: rank 0's CPU time while waiting, and the
products per second the computing ranks managed. On a machine with fewer cores than
ranks, a spinning waiter shows up as fewer products.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import time

import numpy as np
from mpi4py import MPI

from paramserver.wire.protocol import Tag
from paramserver.wire.transport import Transport


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def compute(seconds: float) -> float:
    a = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)
    count, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        a = np.tanh(a @ a)
        count += 1
    return count / seconds


def trial(comm: MPI.Comm, mode: str, seconds: float) -> tuple[float, float]:
    transport = Transport(comm)
    comm.Barrier()
    if comm.rank == 0:
        start = cpu_seconds()
        if mode == "blocking Recv":
            comm.recv(source=1, tag=int(Tag.STOP))
        else:
            transport.recv(timeout=seconds * 10, source=1, tag=int(Tag.STOP))
        rate = 0.0
        waiter_cpu = cpu_seconds() - start
    else:
        rate = compute(seconds)
        if comm.rank == 1:
            comm.send(None, dest=0, tag=int(Tag.STOP))
        waiter_cpu = 0.0
    rates = comm.gather(rate, root=0)
    return waiter_cpu, sum(rates) if comm.rank == 0 else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("seconds", type=float, nargs="?", default=3.0)
    parser.add_argument("--json", help="also write the figures here (for asgd bench)")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    results = {mode: trial(comm, mode, args.seconds) for mode in ("blocking Recv", "polled wait")}
    if comm.rank == 0:
        base = results["blocking Recv"][1]
        print(f"{comm.size - 1} computing ranks, {args.seconds:g} s, {os.cpu_count()} cores")
        print(f"{'waiter':<14} {'waiter CPU s':>12} {'products/s':>11} {'vs blocking':>11}")
        for mode, (cpu, rate) in results.items():
            print(f"{mode:<14} {cpu:12.2f} {rate:11.1f} {rate / base:10.2f}x")
        if args.json:
            with open(args.json, "w") as out:
                json.dump({"blocking_cpu_s": results["blocking Recv"][0], "polled_cpu_s": results["polled wait"][0],
                           "speedup": results["polled wait"][1] / base}, out)


if __name__ == "__main__":
    main()
