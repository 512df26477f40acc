"""Persistent MPI requests against a fresh request a message, on raw round trips.

    mpiexec -n 2 python -m bench.studies.requests [--size 10000] [--trials 7] [--repeats 2000]

Issue 22 asked whether persistent requests (`Recv_init`/`Send_init`, started again for
every message) would take time off the push path, where our transport makes a fresh
`Irecv` or `Isend` for each message. Rank 1 sends `size` floats to rank 0 and takes them
back, `repeats` round trips a trial, the receive posted before the send as our clients
do, every wait polled as wire.py's raw bound polls; `fresh` makes each request anew,
`persistent` starts the same two requests a rank again. The two take turns trial by trial
(trials.py), rank 1 checking after each trial that the floats came back, and prints
each one's median over trials of its mean round trip and the median of the per-trial
ratios persistent / fresh with their interquartile range. A measurement, not a test: what it found is in
docs/performance.md.
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Callable

import numpy as np
from mpi4py import MPI

from bench.trials import interleave, ratio_cell
from bench.wire import finish


def fresh(comm: MPI.Comm, data: np.ndarray, back: np.ndarray) -> Callable[[], None]:
    """One round trip with new requests, as the transport posts them."""
    peer = 1 - comm.rank

    def trip() -> None:
        if comm.rank == 1:
            receive = comm.Irecv([back, MPI.FLOAT], peer)
            finish(comm.Isend([data, MPI.FLOAT], peer))
            finish(receive)
        else:
            finish(comm.Irecv([back, MPI.FLOAT], peer))
            finish(comm.Isend([back, MPI.FLOAT], peer))
    return trip


def persistent(comm: MPI.Comm, data: np.ndarray, back: np.ndarray) -> tuple[Callable[[], None], list]:
    """One round trip through requests made once and started again; the requests, to free."""
    peer = 1 - comm.rank
    receive = comm.Recv_init([back, MPI.FLOAT], peer)
    send = comm.Send_init([data if comm.rank == 1 else back, MPI.FLOAT], peer)

    def trip() -> None:
        if comm.rank == 1:
            receive.Start()
            send.Start()
            finish(send)
            finish(receive)
        else:
            receive.Start()
            finish(receive)
            send.Start()
            finish(send)
    return trip, [receive, send]


def timed(comm: MPI.Comm, trip: Callable[[], None], repeats: int, data: np.ndarray, back: np.ndarray) -> float:
    """Mean seconds a round trip over `repeats`, both ranks starting together; rank 1
    then checks the floats came back, so both kinds are timed doing the same work."""
    if comm.rank == 1:
        back.fill(0)
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(repeats):
        trip()
    seconds = (time.perf_counter() - start) / repeats
    if comm.rank == 1 and not np.array_equal(back, data):
        sys.stderr.write("requests.py: a round trip did not bring the floats back\n")
        comm.Abort(1)  # rank 0 would wait at the next barrier for ever
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=10000, help="floats a message (default 1e4, "
                        "where the per-message cost shows most)")
    parser.add_argument("--trials", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=2000)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    if comm.size != 2:
        raise SystemExit("requests.py runs on exactly 2 ranks (mpiexec -n 2)")
    data, back = np.full(args.size, 1e-6, np.float32), np.empty(args.size, np.float32)
    started, requests = persistent(comm, data, back)
    summary = interleave(lambda: timed(comm, started, args.repeats, data, back),
                         lambda: timed(comm, fresh(comm, data, back), args.repeats, data, back), args.trials)
    for request in requests:
        request.Free()
    if comm.rank == 1:
        print(f"{args.size} floats, {args.trials} trials x {args.repeats} round trips: "
              f"fresh {1e6 * summary['other_median']:.1f} us, persistent {1e6 * summary['ours_median']:.1f} us "
              f"a round trip; persistent / fresh {ratio_cell(summary)}")


if __name__ == "__main__":
    main()
