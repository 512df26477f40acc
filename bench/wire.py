"""The server against the physical limits: the wire, the apply, and many clients at once.

    mpiexec -n 2 python -m bench.wire wire --sizes 1e5,1e6,4e6,1.6e7 --trials 7 --json OUT
    mpiexec -n S+K python -m bench.wire load --size 1e6 --seconds 3 --servers S --json OUT

`wire` (2 ranks): for each model size P, trials that interleave (trials.py) a batch of
push + pull round trips of P floats through the real server loop (a fresh `ServerLoop`,
with its store, logs and checks, each trial) from rank 1, and a batch of raw blocking
MPI Send/Recv round trips of the same bytes between the same ranks plus the server's
apply of P floats: per trial, ratio = median round trip / (2 x raw one-way + apply), a
lower bound, so a median ratio below 1 is a measurement error. Then the apply against a
plain memory copy of P floats, interleaved the same way.
`load` (S+K ranks): K clients push P floats and pull the weights back as fast as they
can (no compute) for SECONDS, to S servers each holding a slice (`--servers`): pushes/s and bytes/s through the server and the
fraction of its time the server was busy handling messages, and its resident memory
after the first tenth of the time and at the end.
Results go to --json (rank 0). `asgd bench` runs both and prints the table.

A client rank imports no torch (the server's modules are imported where a server is
made): `load`'s 16 client processes would otherwise spend about 1.5 CPU-seconds each
importing it, 12 s of wall time on 2 cores before the first push.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from typing import TYPE_CHECKING, Callable

import numpy as np
from mpi4py import MPI

from paramserver.wire import frame
from paramserver.wire.fanout import ServerLink
from paramserver.wire.protocol import Outgoing, Pull, Push, Stop, Tag, shard_bounds
from paramserver.wire.transport import Transport

from bench.trials import interleave

if TYPE_CHECKING:
    from paramserver.drivers.server import ServerLoop
    from paramserver.store import Store

WARMUP = 3


def median_ms(samples: list[float]) -> float:
    return 1e3 * statistics.median(samples)


def raw_round_trips(comm: MPI.Comm, data: np.ndarray, repeats: int) -> list[float]:
    """Raw MPI there and back: what MPI alone costs (timed on rank 1). Nonblocking and
    polled, as our transport moves bytes but with nothing else: MPICH's blocking
    Send/Recv took up to 2x longer for 4 MB on this machine (4 ms one way, where our own
    push + pull took 2 ms), so it was no lower bound."""
    times = []
    for _ in range(WARMUP + repeats):
        comm.Barrier()
        start = time.perf_counter()
        if comm.rank == 1:
            finish(comm.Isend([data, MPI.FLOAT], dest=0))
            finish(comm.Irecv([data, MPI.FLOAT], source=0))
        else:
            finish(comm.Irecv([data, MPI.FLOAT], source=1))
            finish(comm.Isend([data, MPI.FLOAT], dest=1))
        times.append(time.perf_counter() - start)
    return times[WARMUP:]


def finish(request: MPI.Request) -> None:
    """Wait for `request`, polling and yielding the core (raw MPI, none of our transport)."""
    while not request.Test():
        os.sched_yield()


def bench_transport(comm: MPI.Comm, servers: int) -> Transport:
    """A rank's transport, ranks `servers` and up waiting as `asgd train`'s clients wait
    on this host (`Transport.wait_as_client`), so the bench measures what a run does."""
    transport = Transport(comm)
    local_clients = sum(transport.this_node(is_client=comm.rank >= servers)[1])
    if comm.rank >= servers:
        transport.wait_as_client(local_clients)
    return transport


def serve_clients(transport: Transport, size: int, clients: int, servers: int = 1,
                  progress: Callable[[int], None] = lambda minibatches: None) -> ServerLoop:
    """A server rank: the real server loop, recording into a scratch run directory, on its
    slice of a `size`-float model, until every client stops."""
    from paramserver.state import ServerState
    from paramserver.recorder import Recorder
    from paramserver.drivers.server import ServerLoop
    from rundir.layout import RunDir

    lo, hi = shard_bounds(size, servers)[transport.rank]
    state = ServerState(add_store(hi - lo), list(range(servers, servers + clients)))
    with tempfile.TemporaryDirectory() as folder:
        run = RunDir(folder)
        run.create()
        recorder = Recorder(run, state, time.perf_counter, progress=progress)
        loop = ServerLoop(transport, state, recorder, time.perf_counter, stall_timeout=600.0)
        try:
            loop.serve()
        finally:
            recorder.close()
    return loop


def add_store(size: int) -> Store:
    """A server's store of `size` zeros with the `add` rule."""
    from runconfig.settings import RunConfig
    from paramserver.rules import make_rule
    from paramserver.store import Store

    return Store(np.zeros(size, np.float32), make_rule("add", RunConfig()))


def rss_mb() -> float:
    """This process's resident memory (Linux)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def client_link(transport: Transport, size: int, servers: int) -> ServerLink:
    return ServerLink(transport, tuple(range(servers)), shard_bounds(size, servers), 600.0)


def push_pull(link: ServerLink, payload: np.ndarray, into: np.ndarray, step: int) -> None:
    """One client sync point, as clients do it: push, then take the weights back."""
    row = {"client": link.transport.rank - len(link.servers), "step": step, "loss": 0.0}
    link.exchange(Outgoing(Tag.PUSH, Push(step, payload.size, True, rows=(row,)), payload), into)


def client_vectors(size: int) -> tuple[np.ndarray, np.ndarray]:
    """A push and a landing buffer, allocated as a CPU client allocates them (`host_empty`)."""
    payload, into = frame.empty(size, np.float32), frame.empty(size, np.float32)
    payload[:] = 1e-6
    return payload, into


def client_round_trips(transport: Transport, size: int, repeats: int) -> list[float]:
    payload, into = client_vectors(size)
    link = client_link(transport, size, 1)
    link.exchange(Outgoing(Tag.PULL, Pull()), into)
    times = []
    for step in range(1, WARMUP + repeats + 1):
        start = time.perf_counter()
        push_pull(link, payload, into, step)
        times.append(time.perf_counter() - start)
    link.exchange(Outgoing(Tag.STOP, Stop(WARMUP + repeats, WARMUP + repeats)), None)
    return times[WARMUP:]


def timed_median(action: Callable[[], object], repeats: int) -> float:
    """Median seconds of `action()` over `repeats` calls after WARMUP untimed ones."""
    times = []
    for _ in range(WARMUP + repeats):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times[WARMUP:])


def wire(comm: MPI.Comm, sizes: list[int], repeats: int, trials: int) -> list[dict] | None:
    """Per size, `trials` interleaved trials after one warm-up: `repeats` push + pull round
    trips through a fresh server loop, then `repeats` raw MPI round trips and applies, the
    ratio per trial; then the apply against a memcpy, interleaved the same way (rank 0)."""
    transport = bench_transport(comm, servers=1)
    rows = []
    for size in sizes:
        store = add_store(size)
        push, target = np.full(size, 1e-6, np.float32), np.empty(size, np.float32)
        raw, applies = [], []  # seconds per trial (rank 1's raw round trip; rank 0's apply)

        def ours() -> float:  # rank 1's median round trip, on both ranks
            comm.Barrier()
            if comm.rank == 0:
                serve_clients(transport, size, clients=1)  # its set-up is outside rank 1's timed round trips
            return comm.bcast(statistics.median(client_round_trips(transport, size, repeats))
                              if comm.rank == 1 else None, root=1)

        def bound() -> float:  # 2 x raw one-way + apply
            raw.append(comm.bcast(statistics.median(raw_round_trips(comm, push, repeats)), root=1))
            applies.append(comm.bcast(timed_median(lambda: store.apply(0, push), repeats) if comm.rank == 0
                                      else None))
            return raw[-1] + applies[-1]

        vs_bound = interleave(ours, bound, trials, lower_bound=True)
        if comm.rank == 0:
            # The apply reads the push and reads and writes the weights: more than a copy moves.
            vs_copy = interleave(lambda: timed_median(lambda: store.apply(0, push), repeats),
                                 lambda: timed_median(lambda: np.copyto(target, push), repeats), trials,
                                 lower_bound=True)
            rows.append({"floats": size, "mbytes": 4 * size / 1e6, "trials": trials, "repeats": repeats,
                         "raw_one_way_ms": median_ms(raw[-trials:]) / 2, "apply_ms": median_ms(applies[-trials:]),
                         "round_trip_ms": 1e3 * vs_bound["ours_median"], "copy_ms": 1e3 * vs_copy["other_median"],
                         "vs_bound": vs_bound, "apply_vs_copy": vs_copy})
    return rows if comm.rank == 0 else None


def load(comm: MPI.Comm, size: int, seconds: float, servers: int) -> dict | None:
    """K clients pushing and pulling without compute for `seconds`, to `servers` servers."""
    transport = bench_transport(comm, servers)
    clients = comm.size - servers
    comm.Barrier()
    if comm.rank < servers:
        start, rss = time.perf_counter(), []  # (seconds, MB) every 100 pushes
        loop = serve_clients(transport, size, clients, servers, progress=lambda n: n % 100 or rss.append(
            (time.perf_counter() - start, rss_mb())))
        wall = time.perf_counter() - start
        return None if comm.rank else _load_figures(loop, size, wall, seconds, servers, rss)
    client_pushes(transport, size, servers, seconds)
    return None


def client_pushes(transport: Transport, size: int, servers: int, seconds: float) -> None:
    """A client rank: its pushes of `size` floats (and pulls) for `seconds`, then its STOP."""
    payload, into = client_vectors(size)
    link = client_link(transport, size, servers)
    link.exchange(Outgoing(Tag.PULL, Pull()), into)
    step, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        step += 1
        push_pull(link, payload, into, step)
    link.exchange(Outgoing(Tag.STOP, Stop(step, step)), None)


def _load_figures(loop: ServerLoop, size: int, wall: float, window: float, servers: int,
                  rss: list[tuple[float, float]]) -> dict:
    """Rates over the clients' window (`window` seconds, each client pushing throughout it),
    as the RPC server's are counted: the server's set-up and its wait for the first PULL
    are not the server's throughput."""
    state = loop.state
    pushes = state.store.version
    warm = [mb for t, mb in rss if t > wall / 10] or [rss_mb()]
    return {"clients": len(state.client_ranks), "servers": servers, "floats": size, "seconds": window, "wall_s": wall,
            "pushes": pushes, "pushes_per_s": pushes / window, "mbytes_per_s": pushes * 2 * 4 * size / window / 1e6,
            "server_busy": loop.busy_s / wall, "server_push_us": loop.cost.medians_us(),
            "rejected": state.tally.rejected,
            "pushes_sent": sum(stop.pushes for stop in state.tally.stops.values()),
            "clients_stopped": len(state.tally.stops),
            "rss_mb_after_warmup": warm[0], "rss_mb_end": warm[-1], "rss_mb_max": max(warm)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("wire", "load"))
    parser.add_argument("--sizes", default="1e5,1e6,4e6,1.6e7", help="wire: model sizes, in floats")
    parser.add_argument("--size", type=float, default=1e6, help="load: model size, in floats")
    parser.add_argument("--repeats", type=int, default=10, help="wire: round trips in one trial's batch")
    parser.add_argument("--trials", type=int, default=7, help="wire: interleaved trials per size")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--servers", type=int, default=1, help="load: server ranks (sharded)")
    parser.add_argument("--json", required=True, help="where rank 0 writes the results")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    if args.what == "wire":
        result = wire(comm, [int(float(s)) for s in args.sizes.split(",")], args.repeats, args.trials)
    else:
        result = load(comm, int(args.size), args.seconds, args.servers)
    if comm.rank == 0:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=1)


if __name__ == "__main__":
    main()
