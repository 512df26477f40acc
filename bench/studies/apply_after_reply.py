"""The server's apply just after its weights went to a client, against the same apply without.

    mpiexec -n 2 python -m bench.studies.apply_after_reply [--size 206922] [--trials 5] [--repeats 400]

Why the apply inside a job costs more than in one process: rank 1 sends a push of
`size` floats (raw MPI, none of our wire), rank 0 receives it and applies it with the
`add` rule's compiled kernel, timing only the apply; then, by mode,
- `none`: nothing more (the push just landed, the weights were last written here);
- `reply`: it sends the weights back to rank 1, as the server's reply does (most
  likely leaving their cache lines shared with rank 1's core, which the next apply's
  writes must take back first);
- `copy`: it copies the weights into a buffer of their own and sends that (the
  weights stay this core's alone; the copy pays instead).
Each trial runs every mode once, in turn (`repeats` round trips each); rank 0 prints
the medians of the per-trial medians, in microseconds, for the apply and, in `copy`,
the copy. A measurement, not a test.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI

from bench.wire import add_store, finish

MODES = ("none", "reply", "copy")


def serve(comm: MPI.Comm, size: int, mode: str, repeats: int) -> tuple[float, float]:
    """Rank 0: median apply and copy seconds over `repeats` pushes in `mode`."""
    store, push, spare = add_store(size), np.empty(size, np.float32), np.empty(size, np.float32)
    applies, copies = [], []
    for _ in range(repeats):
        finish(comm.Irecv([push, MPI.FLOAT], source=1))
        start = time.perf_counter()
        store.apply(0, push)
        applies.append(time.perf_counter() - start)
        if mode == "reply":
            finish(comm.Isend([store.weights, MPI.FLOAT], dest=1))
        elif mode == "copy":
            start = time.perf_counter()
            np.copyto(spare, store.weights)
            copies.append(time.perf_counter() - start)
            finish(comm.Isend([spare, MPI.FLOAT], dest=1))
    return statistics.median(applies), statistics.median(copies) if copies else 0.0


def push(comm: MPI.Comm, size: int, mode: str, repeats: int) -> None:
    """Rank 1: `repeats` pushes of `size` floats, taking the weights back where `mode` sends them."""
    data, weights = np.full(size, 1e-6, np.float32), np.empty(size, np.float32)
    for _ in range(repeats):
        finish(comm.Isend([data, MPI.FLOAT], dest=0))
        if mode != "none":
            finish(comm.Irecv([weights, MPI.FLOAT], source=0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=206922, help="floats a push (default: the proxy CNN's)")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=400)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    results: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
    for _ in range(args.trials):
        for mode in MODES:
            comm.Barrier()
            if comm.rank == 0:
                results[mode].append(serve(comm, args.size, mode, args.repeats))
            else:
                push(comm, args.size, mode, args.repeats)
    if comm.rank == 0:
        for mode, trials in results.items():
            apply_us = 1e6 * statistics.median(a for a, _ in trials)
            copy_us = 1e6 * statistics.median(c for _, c in trials)
            print(f"{mode:6s} apply {apply_us:7.1f} us" + (f"  copy {copy_us:6.1f} us" if mode == "copy" else ""))


if __name__ == "__main__":
    main()
