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
"""
from __future__ import annotations

import threading
import warnings

import torch
import torch.distributed.rpc as rpc

from experiments.bench.peer_setup import Workload, backward, batch_source, build, sgd, timed, train_split

SERVER = "ps"


def trainer_name(rank: int) -> str:
    return f"trainer{rank}"


class ParameterServer:
    """The model and its optimizer; trainers' gradients are applied one at a time, in arrival order."""

    def __init__(self, w: Workload) -> None:
        self.model = build(w)
        self.optimizer = sgd(self.model)
        self.lock = threading.Lock()  # RPC calls run on a thread pool: one SGD step at a time

    def snapshot(self) -> list[torch.Tensor]:
        # Copies taken under the lock: the reply is pickled after the call returns, when
        # another trainer's step may already be changing the live parameters.
        return [p.detach().clone() for p in self.model.parameters()]

    @staticmethod
    def get_params(ps_rref: rpc.RRef) -> list[torch.Tensor]:
        self = ps_rref.local_value()
        with self.lock:
            return self.snapshot()

    @staticmethod
    def update_and_fetch(ps_rref: rpc.RRef, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        self = ps_rref.local_value()
        with self.lock:
            for p, g in zip(self.model.parameters(), grads):
                p.grad = g
            self.optimizer.step()
            return self.snapshot()


class Trainer:
    """One client: local forward and backward on its shard, the SGD step on the server."""

    def __init__(self, ps_rref: rpc.RRef, w: Workload, shard: int) -> None:
        self.ps_rref = ps_rref
        self.model = build(w)
        self.next_batch = batch_source(w, train_split(w), shard)
        self.load(rpc.rpc_sync(ps_rref.owner(), ParameterServer.get_params, args=(ps_rref,)))

    def load(self, params: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for p, value in zip(self.model.parameters(), params):
                p.copy_(value)

    def step(self) -> None:
        x, y = self.next_batch()
        self.model.zero_grad()
        backward(self.model, x, y)
        grads = [p.grad for p in self.model.parameters()]
        self.load(rpc.rpc_sync(self.ps_rref.owner(), ParameterServer.update_and_fetch, args=(self.ps_rref, grads)))


def run_trainer(ps_rref: rpc.RRef, w: Workload, rank: int) -> float:
    """Runs on trainer `rank` when the server calls it; returns the seconds of its timed steps."""
    trainer = Trainer(ps_rref, w, shard=rank - 1)
    return timed(trainer.step, w)


def run_server(w: Workload) -> list[float]:
    ps_rref = rpc.RRef(ParameterServer(w))
    futures = [rpc.rpc_async(trainer_name(rank), run_trainer, args=(ps_rref, w, rank))
               for rank in range(1, w.clients + 1)]
    return [f.wait() for f in futures]


def rpc_process(rank: int, w: Workload) -> list[float] | None:
    """Process `rank` of 1 + K: the server returns every trainer's timing; a trainer only serves calls."""
    # Raised by RPC's own shutdown, not by anything here; the PyTorch example silences it too.
    warnings.filterwarnings("ignore", message="You are using a Backend.*ProcessGroup")
    # rpc_timeout bounds every call, a trainer's whole run included, so a lost peer fails by the deadline.
    options = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{w.port}", rpc_timeout=w.timeout)
    rpc.init_rpc(SERVER if rank == 0 else trainer_name(rank), rank=rank, world_size=w.clients + 1,
                 rpc_backend_options=options)
    try:
        return run_server(w) if rank == 0 else None
    finally:
        rpc.shutdown()  # waits until every process is done, as in the examples
