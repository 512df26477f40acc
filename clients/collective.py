"""Synchronous baselines: every client steps in lockstep and nothing is stale.

- `sync`: each step, every client computes its gradient, the gradients are averaged
  over all clients (G = (G1 + ... + GK) / K), and every client takes the same step, as
  in data-parallel training. With K clients of batch B this is single-process SGD with
  batch K*B.
- `local-sgd`: clients step on their own gradients and average their weights every
  n_sync steps (and at the last step); momentum stays local.

`average` replaces each tensor of its list by the mean over all clients: over MPI
ranks in a real run (one local client each), over the list in the simulator.
"""
from __future__ import annotations

from typing import Callable

import torch

from clients.client import Client, StepResult

Average = Callable[[list[torch.Tensor]], None]


def collective_step(clients: list[Client], mode: str, step: int, last: int, n_sync: int,
                    average: Average) -> list[StepResult]:
    results = [client.compute() for client in clients]
    if mode == "sync":
        average([client.grad for client in clients])
    for client in clients:
        client.optimizer_step()
    if mode == "local-sgd" and (step % n_sync == 0 or step == last):
        average([client.weights for client in clients])
    return results


def mean_in_place(tensors: list[torch.Tensor]) -> None:
    """The simulator's average: every tensor becomes the mean of all of them."""
    mean = torch.stack(tensors).mean(0)
    for tensor in tensors:
        tensor.copy_(mean)
