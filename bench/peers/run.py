"""Baselines ("peers") for our benchmark to compare against; not part of the tool.

    python -m bench.peers.run      # both baselines, 2 clients x 50 steps; RPC load, 2 clients

- `ddp_throughput`: torch DistributedDataParallel on the gloo backend, K processes on
  localhost, gradients all-reduced every step (synchronous data parallelism).
- `rpc_ps_throughput`: an asynchronous parameter server on torch.distributed.rpc in the
  style of PyTorch's tutorial (`rpc_ps.py` says how): 1 server + K trainers.

Each trains what an `asgd train` client trains (`peer_setup.py`): the same model,
initial weights, data shard and order, batch size, and SGD (lr 0.01, momentum 0.9,
weight decay 5e-4), on Fashion-MNIST when installed (never downloaded), else on
synthetic images of the same shape. Each returns samples per second over the timed
steps: clients * steps * batch_size / the slowest process's time for its `steps`
minibatches, measured after `warmup` untimed ones, with torch.set_num_threads(threads)
and the allocator setting of our ranks (`clients.devices.keep_freed_memory`) in every
process. Process start-up and data loading are outside the timed window
(`call_s` in the result includes them).

`rpc_ps_load` is the RPC server without compute, against which `wire.py load` measures ours:
K trainers send P-float gradients to the same server and take its P floats back as fast as
they can; it reports the calls completed by all trainers in a timed window of `seconds`,
after a short warm-up, as pushes/s and MB/s (both directions), as `wire.py load` does.
`RpcLoadGroup` keeps such a server and its trainers for many windows, stopped between
them, so that `versus.py` can take turns with ours trial by trial.

Processes are spawned, so a calling script needs the usual `if __name__ == "__main__":`
guard. Every process ends within `timeout` seconds: the call kills the ones still
running and raises TimeoutError (PeerError when one fails).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import time
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from bench.peers.setup import (POLL_S, PeerError, Workload, backward, batch_source, build, digest, make_load,
                                          make_workload, run_processes, sgd, summary, timed, train_split)
from bench.peers.rpc_ps import rpc_load_member, rpc_load_process, rpc_process


def ddp_throughput(clients: int, steps: int, batch_size: int = 64, model: str = "cnn", warmup: int = 5,
                   threads: int = 1, timeout: float = 300) -> dict:
    """DDP (gloo) with `clients` ranks; raises PeerError if the ranks do not end with identical weights."""
    w = make_workload(clients, steps, batch_size, model, warmup, threads, timeout)
    start = time.perf_counter()
    ranks = run_processes(ddp_rank, w.clients, w)
    return ddp_summary(w, ranks, time.perf_counter() - start)


def ddp_summary(w: Workload, ranks: list[tuple[float, str]], call_s: float) -> dict:
    """The samples/s of DDP ranks that each returned (timed seconds, weights digest),
    wherever they ran; raises PeerError if their weights differ."""
    # DDP's contract: the same start and the same averaged gradient every step keep all
    # replicas bit-identical. A mismatch would mean the baseline is not doing its job.
    if len({weights for _, weights in ranks}) != 1:
        raise PeerError(f"DDP ranks ended with different weights after {w.warmup + w.steps} steps")
    return summary(w, [seconds for seconds, _ in ranks], call_s)


def rpc_ps_throughput(clients: int, steps: int, batch_size: int = 64, model: str = "cnn", warmup: int = 5,
                      threads: int = 1, timeout: float = 300) -> dict:
    """RPC parameter server: 1 server process + `clients` trainer processes, asynchronous."""
    w = make_workload(clients, steps, batch_size, model, warmup, threads, timeout)
    start = time.perf_counter()
    trainer_seconds = run_processes(rpc_process, w.clients + 1, w)[0]
    return summary(w, trainer_seconds, time.perf_counter() - start)


def rpc_ps_load(clients: int, size: int, seconds: float, timeout: float = 120) -> dict:
    """The RPC parameter server without compute: `clients` trainers, `size` floats each way, `seconds` timed."""
    w = make_load(clients, size, seconds, timeout)
    pushes = sum(run_processes(rpc_load_process, w.clients + 1, w)[0])
    return {"clients": clients, "floats": size, "seconds": seconds, "pushes": pushes,
            "pushes_per_s": pushes / seconds, "mbytes_per_s": pushes * 2 * 4 * size / seconds / 1e6}


class RpcLoadGroup:
    """The RPC parameter server and `clients` no-compute trainers, started once and kept for
    many `window`s (start-up takes seconds; a window, a fraction of one).

    Between windows every process is stopped (SIGSTOP): TensorPipe's shared-memory
    transport busy-polls a core in every process even when idle, which would take the
    CPU from whatever is measured meanwhile (our server, in `versus.py`). Stopped all
    together with no call in flight, nothing times out. Use it as a context manager."""

    def __init__(self, clients: int, timeout: float = 300) -> None:
        self.w = make_load(clients, 1, 1.0, timeout)  # size and seconds come with each window
        ctx = mp.get_context("spawn")
        self.commands, self.results = ctx.Queue(), ctx.Queue()
        self.procs = [ctx.Process(target=rpc_load_member, args=(rank, self.w, self.commands, self.results),
                                  daemon=True) for rank in range(clients + 1)]

    def __enter__(self) -> RpcLoadGroup:
        for p in self.procs:
            p.start()
        self._take("ready")
        self._signal(signal.SIGSTOP)
        return self

    def window(self, size: int, seconds: float, warmup_s: float) -> float:
        """Pushes/s of all trainers in one window of `seconds` (`warmup_s` after they start)."""
        self._signal(signal.SIGCONT)
        self.commands.put((size, seconds, warmup_s))
        counts = self._take("counts")
        self._signal(signal.SIGSTOP)
        return sum(counts) / seconds

    def __exit__(self, *exc: object) -> None:
        self._signal(signal.SIGCONT)
        self.commands.put(None)
        deadline = time.monotonic() + self.w.timeout
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.exitcode is None:
                p.kill()
                p.join()

    def _signal(self, number: int) -> None:
        for p in self.procs:
            if p.exitcode is None:
                os.kill(p.pid, number)

    def _take(self, kind: str) -> Any:
        """The next result of `kind`; raises on a failure, a dead process, or the timeout."""
        deadline = time.monotonic() + self.w.timeout
        while time.monotonic() < deadline:
            try:
                got, value = self.results.get(timeout=POLL_S)
            except queue.Empty:
                dead = [rank for rank, p in enumerate(self.procs) if p.exitcode is not None]
                if dead:
                    raise PeerError(f"RPC process {dead[0]} died with exit status {self.procs[dead[0]].exitcode}")
                continue
            if got == "error":
                raise PeerError(value)
            return value
        raise TimeoutError(f"the RPC load group gave no {kind} within {self.w.timeout} s")


def ddp_rank(rank: int, w: Workload) -> tuple[float, str]:
    """One DDP rank: its timed seconds and a digest of its final weights."""
    split = train_split(w)  # loaded before the rendezvous, so no rank waits on another's loading
    dist.init_process_group("gloo", init_method=f"tcp://{w.host}:{w.port}", rank=rank, world_size=w.clients,
                            timeout=timedelta(seconds=w.timeout))
    try:
        model = build(w)
        replica, optimizer, next_batch = DistributedDataParallel(model), sgd(model), batch_source(w, split, rank)

        def step() -> None:
            optimizer.zero_grad()
            backward(replica, *next_batch())
            optimizer.step()

        seconds = timed(step, w)
        return seconds, digest(model)
    finally:
        dist.destroy_process_group()


def _print(name: str, result: dict) -> None:
    print(f"{name}: {result['samples_per_s']:.0f} samples/s ({result['clients']} clients x {result['steps']} "
          f"steps of {result['batch_size']}, {result['model']} on {result['data']}; timed {result['wall_s']:.2f} s, "
          f"whole call {result['call_s']:.1f} s)")


if __name__ == "__main__":
    _print("DDP (gloo)", ddp_throughput(clients=2, steps=50))
    _print("RPC parameter server", rpc_ps_throughput(clients=2, steps=50))
    load = rpc_ps_load(clients=2, size=10**6, seconds=3)
    print(f"RPC parameter server, no compute: {load['pushes_per_s']:.0f} pushes/s, {load['mbytes_per_s']:.0f} MB/s "
          f"({load['clients']} clients, {load['floats']:.0e} floats, {load['seconds']:g} s)")
