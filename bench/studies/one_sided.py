"""Our server's push + pull against MPI one-sided communication, for a rule that is an MPI
operation (`add`): what a push would cost if the clients wrote into the server's memory.

    mpiexec -n 1+K python -m bench.studies.one_sided [--sizes 1e4,206922,1e6] [--trials 5] [--seconds 0.5]
        [--window shared|private] [--server sleeps|spins] [--torn-checks 200] [--json OUT]

Rank 0 is the server, ranks 1..K no-compute clients. Per size, trials interleave
(trials.py) two windows of `seconds`, every client pushing throughout:
- `ours`: the real server loop with the `add` rule (wire.py's `serve_clients`), each
  client pushing P floats and taking the weights back (`push_pull`), as the load
  section does;
- `one-sided`: the weights live in an MPI window on rank 0 (one passive-target epoch a
  client a window: `Lock_all`). A push is what keeps the guarantees one-sided
  communication can keep: the client checks its own push for NaN and Inf (a dot
  product; the server never sees a push to check it), counts it on the server's version
  counter (`Fetch_and_op`, whose answer is what staleness needs), adds it into the
  weights while fetching what they were (`Get_accumulate` with `MPI_SUM`, atomic element
  by element only), `Flush`es both, and adds its own push to what came back, so it
  holds the weights just after its push as our reply gives them. Rank 0 only waits for
  the clients' end (a non-blocking barrier).
`--window shared` (the default): memory MPI allocates (`MPI_Win_allocate`), which both
MPI libraries share between the ranks of one host, so a client's own CPU does the add;
`private`: the server's own array (`MPI_Win_create`), as a window is between hosts, so
the server's MPI does the add, only while rank 0 is inside MPI: `--server sleeps` (the
default) calls into MPI every millisecond, as an idle server waits; `spins` stays in it.
Per trial: pushes/s of all clients together over the window, and the server's process
CPU over the window a push (ours: also the median CPU of handling one push). Ratio per
trial = ours / one-sided, so below 1 means one-sided is faster.

Then, per size, what one-sided gives up, measured: with 2 or more clients, each client
makes `--torn-checks` more pushes and counts how many of the weights it fetched were torn
(not one value: every push here adds 1.0 to every element, so weights read whole are
uniform); and at the end rank 0 checks that its counter equals the pushes the clients
made and every weight equals it (no push lost or applied twice). A measurement, not a
test (tests/mpi/test_bench_one_sided.py runs it small and checks that last count).
"""
from __future__ import annotations

import argparse
import json
import math
import time
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from bench.trials import interleave
from bench.wire import bench_transport, client_pushes, serve_clients
from paramserver.wire.transport import Transport

PROXY_FLOATS = 206922  # the proxy CNN's size (versus.py counts it from the model; no torch on clients here)
SERVER_POLL_S = 1e-3  # how often a sleeping rank 0 calls into MPI
ONE = np.ones(1, np.int64)  # what a push adds to the version counter


class Windows:
    """The one-sided server: P float32 weights and an int64 push counter, on rank 0."""

    def __init__(self, comm: MPI.Comm, size: int, shared: bool = True) -> None:
        mine = comm.rank == 0
        self.comm, self.size = comm, size
        if shared:  # memory MPI allocates: on one host, shared between the ranks
            self.weights = MPI.Win.Allocate(4 * size if mine else 0, 4, comm=comm)
            self.counter = MPI.Win.Allocate(8 if mine else 0, 8, comm=comm)
        else:  # the server's own memory, as a window's is across hosts
            self._memory = (np.zeros(size, np.float32), np.zeros(1, np.int64)) if mine else (None, None)
            self.weights = MPI.Win.Create(self._memory[0], 4, comm=comm)
            self.counter = MPI.Win.Create(self._memory[1], 8, comm=comm)
        if mine:
            self.server_view(lambda w, c: (w.fill(0), c.fill(0)))
        comm.Barrier()

    def server_view(self, look: Callable[[np.ndarray, np.ndarray], Any]) -> Any:
        """`look(weights, counter)` on rank 0's own memory, under exclusive locks."""
        for win in (self.weights, self.counter):
            win.Lock(0, MPI.LOCK_EXCLUSIVE)
        try:
            return look(np.frombuffer(self.weights.tomemory(), np.float32),
                        np.frombuffer(self.counter.tomemory(), np.int64))
        finally:
            for win in (self.weights, self.counter):
                win.Unlock(0)

    def free(self) -> None:
        self.weights.Free()
        self.counter.Free()


def one_sided_push(windows: Windows, payload: np.ndarray, into: np.ndarray, version: np.ndarray) -> bool:
    """One push and pull, one-sided (the windows locked by the caller). False: the push was
    not finite and was not sent."""
    if not math.isfinite(float(np.dot(payload, payload))):
        return False
    windows.counter.Fetch_and_op([ONE, MPI.INT64_T], [version, MPI.INT64_T], 0, 0, MPI.SUM)
    windows.weights.Get_accumulate([payload, MPI.FLOAT], [into, MPI.FLOAT], 0, op=MPI.SUM)
    windows.counter.Flush(0)
    windows.weights.Flush(0)
    np.add(into, payload, out=into)
    return True


def wait_as_server(comm: MPI.Comm, spins: bool) -> None:
    """Rank 0 while clients work one-sidedly, until they are done (a non-blocking barrier):
    `spins`, inside MPI throughout; else in MPI only every SERVER_POLL_S, as an idle server
    waits, so its MPI progresses only when it polls."""
    request = comm.Ibarrier()
    if spins:
        request.Wait()
        return
    while not request.Test():
        time.sleep(SERVER_POLL_S)


def client_window(windows: Windows, payload: np.ndarray, into: np.ndarray, seconds: float,
                  torn_checks: int = 0) -> tuple[int, int]:
    """A client's pushes for `seconds` (or, with `torn_checks`, that many pushes, counting the
    fetched weights that were not one value): (pushes, torn)."""
    version, pushes, torn = np.zeros(1, np.int64), 0, 0
    windows.weights.Lock_all()
    windows.counter.Lock_all()
    try:
        end = time.perf_counter() + seconds
        while (pushes < torn_checks) if torn_checks else (time.perf_counter() < end):
            pushes += one_sided_push(windows, payload, into, version)
            if torn_checks:
                torn += bool(into.min() != into.max())
    finally:
        windows.counter.Unlock_all()
        windows.weights.Unlock_all()
    windows.comm.Ibarrier().Wait()  # rank 0's (a non-blocking barrier matches only non-blocking ones)
    return pushes, torn


def ours_window(comm: MPI.Comm, transport: Transport, size: int, seconds: float) -> tuple[float, float, float]:
    """Our server loop for one window: (pushes/s, server CPU s a push, median handling CPU s a push)."""
    comm.Barrier()
    if comm.rank == 0:
        cpu = time.process_time()
        loop = serve_clients(transport, size, clients=comm.size - 1)
        cpu = time.process_time() - cpu
        pushes = loop.state.store.version
        figures = (pushes / seconds, cpu / max(pushes, 1), loop.cost.medians_us().get("cpu", 0.0) / 1e6)
    else:
        client_pushes(transport, size, 1, seconds)
        figures = None
    return comm.bcast(figures)


def one_sided_window(windows: Windows, seconds: float, spins: bool) -> tuple[float, float, int]:
    """One window of one-sided pushes: (pushes/s of all clients, server CPU s a push, pushes)."""
    comm = windows.comm
    comm.Barrier()
    if comm.rank == 0:
        cpu = time.process_time()
        wait_as_server(comm, spins)
        cpu = time.process_time() - cpu
        mine = 0
    else:
        payload, into = np.ones(windows.size, np.float32), np.empty(windows.size, np.float32)
        mine, _ = client_window(windows, payload, into, seconds)
    pushes = comm.allreduce(mine)
    cpu = comm.bcast(cpu if comm.rank == 0 else None)
    return pushes / seconds, cpu / max(pushes, 1), pushes


def measure(comm: MPI.Comm, size: int, trials: int, seconds: float, torn_checks: int, shared: bool,
            spins: bool) -> dict | None:
    """One size: the interleaved trials, then the torn reads and the final count."""
    transport, windows = bench_transport(comm, servers=1), Windows(comm, size, shared)
    ours_cpu, ours_handling, other_cpu, sent = [], [], [], [0]

    def ours() -> float:
        rate, cpu, handling = ours_window(comm, transport, size, seconds)
        ours_cpu.append(cpu)
        ours_handling.append(handling)
        return rate

    def other() -> float:
        rate, cpu, pushes = one_sided_window(windows, seconds, spins)
        other_cpu.append(cpu)
        sent[0] += pushes
        return rate

    summary = interleave(ours, other, trials)
    checked, torn = 0, 0
    if comm.size > 2 and torn_checks:
        comm.Barrier()
        if comm.rank == 0:
            wait_as_server(comm, spins)
        else:
            payload, into = np.ones(size, np.float32), np.empty(size, np.float32)
            checked, torn = client_window(windows, payload, into, 0.0, torn_checks)
    checked, torn = comm.allreduce(checked), comm.reduce(torn)
    sent[0] += checked
    if comm.rank == 0:
        counted, exact = windows.server_view(lambda w, c: (int(c[0]), bool((w == c[0]).all())))
    windows.free()
    if comm.rank:
        return None
    keep = slice(len(ours_cpu) - trials, None)  # the warm-up pair's values dropped, as interleave drops them
    return {"floats": size, "clients": comm.size - 1, "seconds": seconds, "trials": trials,
            "window": "shared" if shared else "private", "server": "spins" if spins else "sleeps",
            "ours_vs_one_sided": summary,
            "ours_server_cpu_us_a_push": 1e6 * float(np.median(ours_cpu[keep])),
            "ours_handling_cpu_us_a_push": 1e6 * float(np.median(ours_handling[keep])),
            "one_sided_server_cpu_us_a_push": 1e6 * float(np.median(other_cpu[keep])),
            "torn_checks": checked, "torn": torn,
            "pushes_sent": sent[0], "pushes_counted": counted, "every_weight_equals_the_count": exact}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=f"1e4,{PROXY_FLOATS},1e6", help="model sizes, in floats")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=0.5, help="each window's length")
    parser.add_argument("--torn-checks", type=int, default=200, help="pushes a client makes to count torn reads")
    parser.add_argument("--window", choices=("shared", "private"), default="shared",
                        help="shared: memory MPI allocates (MPI_Win_allocate), shared between ranks on one host; "
                             "private: the server's own array (MPI_Win_create), as a window is across hosts")
    parser.add_argument("--server", choices=("sleeps", "spins"), default="sleeps",
                        help="how rank 0 waits: in MPI every millisecond, or in MPI throughout")
    parser.add_argument("--json", help="where rank 0 writes the results")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    rows = [measure(comm, int(float(size)), args.trials, args.seconds, args.torn_checks, args.window == "shared",
                    args.server == "spins") for size in args.sizes.split(",")]
    if comm.rank:
        return
    for row in rows:
        s = row["ours_vs_one_sided"]
        print(f"{row['floats']:>9,} floats {row['clients']} clients, {row['window']} window, server "
              f"{row['server']}: ours {s['ours_median']:8,.0f} /s, one-sided {s['other_median']:8,.0f} /s, "
              f"ours/one-sided {s['ratio']:.2f} ({s['ratio_q1']:.2f}-{s['ratio_q3']:.2f}); server CPU a push ours "
              f"{row['ours_server_cpu_us_a_push']:.0f} us (handling {row['ours_handling_cpu_us_a_push']:.0f}), "
              f"one-sided {row['one_sided_server_cpu_us_a_push']:.1f} us; torn {row['torn']}/{row['torn_checks']}; "
              f"counted {row['pushes_counted']} of {row['pushes_sent']} sent, weights equal it: "
              f"{row['every_weight_equals_the_count']}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)


if __name__ == "__main__":
    main()
