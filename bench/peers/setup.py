"""Shared plumbing of the benchmark baselines ("peers") in `bench/peers/run.py`.

Baselines only, not part of the tool. This module fixes what every baseline process
trains, so a baseline differs from an `asgd train` client only in how it communicates:
the same model and initial weights, the same data shard and minibatch order, the same
batch size and SGD hyper-parameters (the tool's own defaults, read from `RunConfig`).
It also starts the processes and collects their timings under one hard deadline, for
training (`Workload`) and for no-compute load (`Load`) alike.
"""
from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import queue
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from clients.data import FASHION_MNIST_DIRS, FASHION_MNIST_FILES, ArraySplit, Split, load_dataset
from clients.devices import keep_freed_memory
from clients.models import build_model
from clients.sampling import ShardSampler, shard_indices
from runconfig.settings import RunConfig

DEFAULTS = RunConfig()  # lr, momentum, weight_decay and seed exactly as an `asgd train` client has them
# Input shape and classes per model. convnet wants ImageNet-sized images; none are installed
# here, so it always trains on synthetic ones.
SHAPES = {"cnn": ((1, 28, 28), 10), "convnet": ((3, 224, 224), 1000)}
# Throughput does not depend on pixel values, so a synthetic shard needs only a few batches.
SYNTHETIC_BATCHES = 4
UNIFORM_MEAN, UNIFORM_STD = 0.5, 12 ** -0.5  # moments of U(0, 1), to standardise the synthetic pixels
POLL_S = 0.5  # how often the parent looks for dead or late children while it waits


class PeerError(RuntimeError):
    """A baseline process failed, or the baseline's result is wrong."""


@dataclass(frozen=True)
class Workload:
    """One baseline measurement: what each process trains, for how long, and where they meet."""

    clients: int
    steps: int
    batch_size: int
    model: str
    warmup: int
    threads: int
    timeout: float
    port: int
    host: str = "127.0.0.1"  # where rank 0 listens for the others (across hosts: the first one's name)


@dataclass(frozen=True)
class Load:
    """A no-compute measurement: `clients` trainers exchanging `size` floats with the server for `seconds`."""

    clients: int
    size: int
    seconds: float
    timeout: float
    port: int
    threads: int = 1


def make_workload(clients: int, steps: int, batch_size: int, model: str, warmup: int, threads: int,
                  timeout: float) -> Workload:
    """Check the arguments in the caller, where a mistake is one clear line, not K tracebacks."""
    _check(timeout, ("clients", clients, 1), ("steps", steps, 1), ("batch_size", batch_size, 1),
           ("warmup", warmup, 0), ("threads", threads, 1))
    if model not in SHAPES:
        raise ValueError(f"model: unknown model {model!r} (choose from {', '.join(SHAPES)})")
    return Workload(clients, steps, batch_size, model, warmup, threads, timeout, free_port())


def make_load(clients: int, size: int, seconds: float, timeout: float) -> Load:
    """As `make_workload`, for a no-compute load."""
    _check(timeout, ("clients", clients, 1), ("size", size, 1))
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, got {seconds}")
    return Load(clients, size, seconds, timeout, free_port())


def _check(timeout: float, *least: tuple[str, int, int]) -> None:
    for name, value, bound in least:
        if value < bound:
            raise ValueError(f"{name} must be >= {bound}, got {value}")
    if timeout <= 0:
        raise ValueError(f"timeout must be positive, got {timeout}")


def free_port() -> int:
    """A TCP port free now on localhost (another program could take it before rank 0 binds it; rare)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fashion_mnist_installed() -> bool:
    """Looked up here, because `load_dataset` would download a missing Fashion-MNIST, and a benchmark never may."""
    return any(all(os.path.isfile(os.path.join(folder, name)) for name in FASHION_MNIST_FILES)
               for folder in FASHION_MNIST_DIRS)


def data_name(model: str) -> str:
    return "fashion-mnist" if model == "cnn" and fashion_mnist_installed() else "synthetic"


def train_split(w: Workload) -> Split:
    """Fashion-MNIST's training split when installed, else seeded random images of the model's input shape."""
    if data_name(w.model) == "fashion-mnist":
        return load_dataset("fashion-mnist").train
    shape, classes = SHAPES[w.model]
    n = w.clients * w.batch_size * SYNTHETIC_BATCHES
    rng = np.random.default_rng(DEFAULTS.seed)
    x = rng.integers(0, 256, (n, *shape), dtype=np.uint8)
    return ArraySplit(x, rng.integers(0, classes, n), 1 / 255, UNIFORM_MEAN, UNIFORM_STD)


def batch_source(w: Workload, split: Split, shard: int) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    """Client `shard`'s minibatches, in the order an `asgd train` client with that index visits them."""
    sampler = ShardSampler(shard_indices(len(split), w.clients, shard, DEFAULTS.seed), w.batch_size,
                           DEFAULTS.seed, shard)
    return lambda: split.batch(sampler.next())


def build(w: Workload) -> nn.Module:
    """The model with the tool's initial weights (every process draws the same ones from the seed)."""
    shape, classes = SHAPES[w.model]
    return build_model(w.model, shape, classes, DEFAULTS.seed)


def sgd(model: nn.Module) -> torch.optim.SGD:
    return torch.optim.SGD(model.parameters(), lr=DEFAULTS.lr, momentum=DEFAULTS.momentum,
                           weight_decay=DEFAULTS.weight_decay)


def backward(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    """The client's loss (cross-entropy on the logits); gradients accumulate into the parameters' .grad."""
    nn.functional.cross_entropy(model(x), y).backward()


def timed(step: Callable[[], None], w: Workload) -> float:
    """Seconds for `w.steps` calls of `step`, after `w.warmup` untimed ones (first-call allocations, DDP buckets)."""
    for _ in range(w.warmup):
        step()
    start = time.perf_counter()
    for _ in range(w.steps):
        step()
    return time.perf_counter() - start


def digest(model: nn.Module) -> str:
    """A fingerprint of the weights: the parent compares ranks without shipping whole models back."""
    flat = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


def summary(w: Workload, seconds: list[float], call_s: float) -> dict:
    """Samples per second over the timed steps of all clients, clocked by the slowest process."""
    wall = max(seconds)
    return {"samples_per_s": w.clients * w.steps * w.batch_size / wall, "steps": w.steps, "clients": w.clients,
            "wall_s": wall, "call_s": call_s, "batch_size": w.batch_size, "model": w.model,
            "data": data_name(w.model), "threads": w.threads}


def run_processes(target: Callable[[int, Any], Any], nprocs: int, w: Workload | Load) -> list[Any]:
    """`target(rank, w)` in `nprocs` fresh processes; their return values by rank.

    Every process has ended when this returns or raises: any still running at the
    deadline (`w.timeout` from now), or when another failed, is killed, so a hang
    never blocks the caller. Spawned, not forked, so no parent thread or lock leaks in.
    """
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(target, rank, w, results), daemon=True) for rank in range(nprocs)]
    deadline = time.monotonic() + w.timeout
    try:
        for p in procs:
            p.start()
        values = _collect(results, procs, deadline, w.timeout)
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        stuck = [r for r, p in enumerate(procs) if p.exitcode is None]
        if stuck:
            raise _timeout(stuck, w.timeout)
        return values
    finally:
        for p in procs:
            if p.pid is not None and p.exitcode is None:
                p.kill()
                p.join()
        results.close()


def prepare(w: Workload | Load) -> None:
    """What every baseline process sets first, wherever it was started."""
    torch.set_num_threads(w.threads)
    keep_freed_memory()  # the allocator every rank of ours has: the systems compared, not two mallocs


def _child(target: Callable[[int, Any], Any], rank: int, w: Workload | Load, results: Any) -> None:
    prepare(w)
    try:
        results.put((rank, True, target(rank, w)))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))
        sys.exit(1)


def _collect(results: Any, procs: list, deadline: float, timeout: float) -> list[Any]:
    """Every rank's value; raises as soon as one reports an error, dies, or the deadline passes."""
    values: list[Any] = [None] * len(procs)
    pending = set(range(len(procs)))
    while pending:
        try:
            rank, ok, value = results.get(timeout=max(0.01, min(POLL_S, deadline - time.monotonic())))
        except queue.Empty:
            # Exit status 0 only ever follows a result, which may still be in the pipe: not a death.
            dead = [r for r in sorted(pending) if procs[r].exitcode not in (None, 0)]
            if dead:
                raise _failure(results, dead[0], procs[dead[0]].exitcode)
            if time.monotonic() >= deadline:
                raise _timeout(sorted(pending), timeout)
            continue
        if not ok:
            raise PeerError(f"baseline process {rank} failed:\n{value}")
        values[rank] = value
        pending.discard(rank)
    return values


def _failure(results: Any, rank: int, code: int) -> PeerError:
    """Prefer a child's own traceback, which may arrive just after its exit status, to the bare status."""
    try:
        while True:
            other, ok, value = results.get(timeout=POLL_S)
            if not ok:
                return PeerError(f"baseline process {other} failed:\n{value}")
    except queue.Empty:
        return PeerError(f"baseline process {rank} died with exit status {code} before reporting")


def _timeout(stuck: list[int], timeout: float) -> TimeoutError:
    return TimeoutError(f"baseline processes {stuck} did not finish within {timeout} s; all were killed")
