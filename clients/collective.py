"""Synchronous baselines: every client steps in lockstep and nothing is stale.

- `sync`: each step, every client computes its gradient, the gradients are averaged
  over all clients (G = (G1 + ... + GK) / K), and every client takes the same step, as
  in data-parallel training. With K clients of batch B this is single-process SGD with
  batch K*B.
- `local-sgd`: clients step on their own gradients and average their weights every
  n_sync steps (and at the last step); momentum stays local.
- `sync` with backup workers b (Chen et al. 2016): each step averages the gradients of
  the K - b clients that finish first and drops the other b (`keep_fastest`). A
  dropped client's work is abandoned, so it starts the next step with everyone else,
  which is the baseline's best case: a slow client that finished its stale gradient
  first would start later still.

`straggle(step, compute_s)` runs between the gradients and the average: it makes the
local clients as slow as the straggler model says (a sleep over MPI, virtual time in
the simulator) and says which of them the step keeps.

`average` replaces each tensor of its list by the mean over all clients: over MPI
ranks in a real run (one local client each), over the list in the simulator.
"""
from __future__ import annotations

import time
from typing import Callable

import torch

from clients.client import Client, StepResult

Average = Callable[[list[torch.Tensor]], None]
Straggle = Callable[[int, list[float]], list[bool]]  # (step, local compute seconds) -> kept


def collective_step(clients: list[Client], mode: str, step: int, last: int, n_sync: int, average: Average,
                    straggle: Straggle, backups: tuple[int, int] = (1, 0)) -> tuple[list[StepResult], list[bool]]:
    """One lockstep step of the local `clients`; `backups`: (K, b) of the whole run.
    Returns the results and which of the local clients the step kept."""
    results, compute_s = [], []
    for client in clients:
        start = time.perf_counter()
        results.append(client.compute())
        compute_s.append(time.perf_counter() - start)
    kept = straggle(step, compute_s)
    if mode == "sync":
        k, b = backups
        for client, keep in zip(clients, kept):  # so that the mean over all K is the kept ones' mean
            if b or not keep:
                client.grad.mul_(k / (k - b) if keep else 0.0)
        average([client.grad for client in clients])
    for client in clients:
        client.optimizer_step()
    if mode == "local-sgd" and (step % n_sync == 0 or step == last):
        average([client.weights for client in clients])
    return results, kept


def keep_fastest(durations: list[float], backups: int) -> list[bool]:
    """Which clients a step keeps: all but the `backups` slowest (ties: the higher index drops)."""
    order = sorted(range(len(durations)), key=lambda i: (durations[i], i))
    dropped = set(order[len(durations) - backups:]) if backups else set()
    return [i not in dropped for i in range(len(durations))]


def mean_in_place(tensors: list[torch.Tensor]) -> None:
    """The simulator's average: every tensor becomes the mean of all of them."""
    mean = torch.stack(tensors).mean(0)
    for tensor in tensors:
        tensor.copy_(mean)
