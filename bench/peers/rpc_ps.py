"""Baseline, not part of the tool: an asynchronous parameter server on torch.distributed.rpc.

Built the way PyTorch's own examples build one ("Implementing a Parameter Server Using
Distributed RPC Framework", and pytorch/examples distributed/rpc/batch/parameter_server.py),
so our benchmark can compare the tool against the stock PyTorch recipe:

- rank 0 ("ps") holds the model and a `torch.optim.SGD` in a `ParameterServer` object,
  shared with the trainers as an `RRef`; it starts every trainer with `rpc_async` and
  waits for them (the examples' `run_ps`);
- each trainer ("trainer<r>") fetches the parameters over RPC, computes gradients on
  its own minibatch locally, and sends them with `rpc_sync` to the server's static
  `update_and_fetch` (called on the RRef's owner, as in the examples), which applies
  one SGD step under the server's lock and replies with the new parameters;
- asynchronous: trainers never wait for one another. The batch example waits for a
  batch of trainers before stepping; here every gradient is applied as it arrives,
  as in the tool's async mode.

The tutorial's other variant (the forward pass runs on the server through the RRef,
with distributed autograd and a DistributedOptimizer) would do all K trainers' compute
in the server process, so it would measure a different design from ours; it is not
built here. Model, data shards, batch size and hyper-parameters are the tool's
(`peer_setup`); run it through `peers.rpc_ps_throughput`.

Load mode (`peers.rpc_ps_load`), the counterpart of `wire.py load`: the same server and
trainers with no model and no compute. The server holds one flat float32 tensor of P
elements, which plain SGD (lr only) updates in place (w -= lr * g) under the lock; every
trainer sends the same P-float gradient through the same `update_and_fetch` as fast as
it can and copies the reply into its own P floats. The server creates the trainers with
`rpc.remote` and has each make one call before it opens the window, so set-up and
connection stay outside it; it reports how many calls all trainers completed in one
common window of `seconds`, which opens after a short warm-up of such calls.
"""
from __future__ import annotations

import threading
import time
import traceback
import warnings
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch
import torch.distributed.rpc as rpc
from torch import nn

from bench.peers.setup import (DEFAULTS, Load, Workload, backward, batch_source, build, sgd, timed,
                                          train_split)

SERVER = "ps"
# Load mode: untimed seconds of steps before the window opens, once every trainer exists and has made one step.
LOAD_WARMUP_S = 0.5
LOAD_GRADIENT = 1e-6  # every element of a load-mode gradient, as wire.py's pushes


def trainer_name(rank: int) -> str:
    return f"trainer{rank}"


class ParameterServer:
    """Parameters and their optimizer; trainers' gradients are applied one at a time, in arrival order."""

    def __init__(self, params: list[nn.Parameter], optimizer: torch.optim.Optimizer) -> None:
        self.params = params
        self.optimizer = optimizer
        self.lock = threading.Lock()  # RPC calls run on a thread pool: one SGD step at a time

    @classmethod
    def of_model(cls, w: Workload) -> ParameterServer:
        """The model an `asgd train` server holds, with its SGD."""
        model = build(w)
        return cls(list(model.parameters()), sgd(model))

    @classmethod
    def flat(cls, size: int) -> ParameterServer:
        """`size` float32 zeros, updated by plain SGD: an in-place w -= lr * g."""
        flat = nn.Parameter(torch.zeros(size))
        return cls([flat], torch.optim.SGD([flat], lr=DEFAULTS.lr))

    def snapshot(self) -> list[torch.Tensor]:
        # Copies taken under the lock: the reply is pickled after the call returns, when
        # another trainer's step may already be changing the live parameters.
        return [p.detach().clone() for p in self.params]

    @staticmethod
    def get_params(ps_rref: rpc.RRef) -> list[torch.Tensor]:
        self = ps_rref.local_value()
        with self.lock:
            return self.snapshot()

    @staticmethod
    def update_and_fetch(ps_rref: rpc.RRef, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        self = ps_rref.local_value()
        with self.lock:
            for p, g in zip(self.params, grads):
                p.grad = g
            self.optimizer.step()
            return self.snapshot()


class Trainer:
    """One client: `gradients()` computed locally, the SGD step on the server, its reply copied into `params`."""

    def __init__(self, ps_rref: rpc.RRef, params: list[torch.Tensor],
                 gradients: Callable[[], list[torch.Tensor]]) -> None:
        self.ps_rref = ps_rref
        self.params = params
        self.gradients = gradients
        self.load(rpc.rpc_sync(ps_rref.owner(), ParameterServer.get_params, args=(ps_rref,)))

    def load(self, params: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for p, value in zip(self.params, params):
                p.copy_(value)

    def step(self) -> None:
        grads = self.gradients()
        self.load(rpc.rpc_sync(self.ps_rref.owner(), ParameterServer.update_and_fetch, args=(self.ps_rref, grads)))

    def steps_in(self, start: float, end: float) -> int:
        """Steps until wall-clock time `end` (the same clock in every process); how many completed in [start, end)."""
        steps = 0
        while time.time() < end:
            self.step()
            steps += start <= time.time() < end
        return steps


def model_trainer(ps_rref: rpc.RRef, w: Workload, shard: int) -> Trainer:
    """Forward and backward of the model on client `shard`'s next minibatch, each step."""
    model = build(w)
    next_batch = batch_source(w, train_split(w), shard)

    def gradients() -> list[torch.Tensor]:
        x, y = next_batch()
        model.zero_grad()
        backward(model, x, y)
        return [p.grad for p in model.parameters()]

    return Trainer(ps_rref, list(model.parameters()), gradients)


def run_trainer(ps_rref: rpc.RRef, w: Workload, rank: int) -> float:
    """Runs on trainer `rank` when the server calls it; returns the seconds of its timed steps."""
    return timed(model_trainer(ps_rref, w, shard=rank - 1).step, w)


def load_trainer(ps_rref: rpc.RRef, size: int) -> Trainer:
    """A trainer without compute: the same `size`-float gradient every step."""
    grads = [torch.full((size,), LOAD_GRADIENT)]
    return Trainer(ps_rref, [torch.empty(size)], lambda: grads)


def run_server(w: Workload) -> list[float]:
    ps_rref = rpc.RRef(ParameterServer.of_model(w))
    futures = [rpc.rpc_async(trainer_name(rank), run_trainer, args=(ps_rref, w, rank))
               for rank in range(1, w.clients + 1)]
    return [f.wait() for f in futures]


def run_load_server(w: Load) -> list[int]:
    """Every trainer's count of steps completed in one common window of `w.seconds`."""
    return load_window(w.clients, w.size, w.seconds)


def load_window(clients: int, size: int, seconds: float, warmup_s: float = LOAD_WARMUP_S) -> list[int]:
    """On the server, with every process in the RPC group: a fresh `size`-float server and
    `clients` fresh load trainers; each trainer's steps completed in one common window of
    `seconds` that opens `warmup_s` after each has made one step."""
    ps_rref = rpc.RRef(ParameterServer.flat(size))
    # Made first and stepped once, so that no trainer's set-up (the first call to a process can take
    # seconds to connect on a busy machine) falls into the window.
    trainers = [rpc.remote(trainer_name(rank), load_trainer, args=(ps_rref, size))
                for rank in range(1, clients + 1)]
    for future in [trainer.rpc_async().step() for trainer in trainers]:
        future.wait()
    start = time.time() + warmup_s
    futures = [trainer.rpc_async().steps_in(start, start + seconds) for trainer in trainers]
    return [f.wait() for f in futures]


def rpc_load_member(rank: int, w: Load, commands: Any, results: Any) -> None:
    """A process of a long-lived load group (`peers.RpcLoadGroup`): rank 0 runs one
    `load_window` per (size, seconds) taken from `commands` until None, and puts its counts
    (after ("ready", None) once every process has joined) on `results`."""
    try:
        with rpc_member(rank, w.clients, w.port, w.timeout):
            if rank == 0:
                results.put(("ready", None))
                for size, seconds, warmup_s in iter(commands.get, None):
                    results.put(("counts", load_window(w.clients, size, seconds, warmup_s)))
    except BaseException:
        results.put(("error", f"RPC process {rank} failed:\n{traceback.format_exc()}"))
        raise


def rpc_process(rank: int, w: Workload) -> list[float] | None:
    """Process `rank` of 1 + K: the server returns every trainer's timing; a trainer only serves calls."""
    return _rpc_rank(rank, w, run_server)


def rpc_load_process(rank: int, w: Load) -> list[int] | None:
    """As `rpc_process`, in load mode: the server returns every trainer's count of calls in the window."""
    return _rpc_rank(rank, w, run_load_server)


def _rpc_rank(rank: int, w: Workload | Load, serve: Callable[[Any], list[Any]]) -> list[Any] | None:
    with rpc_member(rank, w.clients, w.port, w.timeout):
        return serve(w) if rank == 0 else None


@contextmanager
def rpc_member(rank: int, clients: int, port: int, timeout: float) -> Iterator[None]:
    """This process in the RPC group of 1 + `clients`: rank 0 the server ("ps"), the others
    trainers, which only serve calls; on leaving, waits until every process is done."""
    # Raised by RPC's own shutdown, not by anything here; the PyTorch example silences it too.
    warnings.filterwarnings("ignore", message="You are using a Backend.*ProcessGroup")
    # rpc_timeout bounds every call, a trainer's whole run included, so a lost peer fails by the deadline.
    options = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}", rpc_timeout=timeout)
    rpc.init_rpc(SERVER if rank == 0 else trainer_name(rank), rank=rank, world_size=clients + 1,
                 rpc_backend_options=options)
    try:
        yield
    finally:
        rpc.shutdown()  # waits until every process is done, as in the examples
