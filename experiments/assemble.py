"""One recipe for a run's setup, for both backends: data, model, clients, start weights,
resume point, each client positioned at its first step.

It runs in two parts, because between them the simulator measures its costs on the
clients it built (the warm start's rows are timed on that clock): `build` (data, model,
this process's clients) and `start` (the start weights and resume point, decided by the
process that records the run, then shared; every client synced and positioned). The MPI
backend runs both on every rank, each for its own client (none on a server), sharing
rank 0's decisions by broadcast; the simulator runs them once, for all K clients.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from torch import nn

from clients.client import Client
from clients.data import Dataset, load_dataset
from clients.models import flat_weights, run_model
from experiments.runrecord import RunSetup
from experiments.start import make_client, make_replica, start_client, starting_weights
from paramserver.config import RunConfig
from paramserver.rundir.resume import ResumePoint, resume_point

# How rank 0's start weights and resume point reach every process (identity in one process).
Share = Callable[[np.ndarray, ResumePoint | None], tuple[np.ndarray, ResumePoint | None]]


@dataclass
class Parts:
    """What `build` makes: the data, the model (the recorder evaluates with it) and this
    process's clients, numbered `indices` among the run's `clients`."""

    cfg: RunConfig
    device: str
    clients: int
    indices: list[int]
    dataset: Dataset
    model: nn.Module
    local: list[Client]


@dataclass(frozen=True)
class Started:
    setup: RunSetup
    steps: list[int]           # each local client's first step (after a resume, its last pushed one)
    point: ResumePoint | None


def build(cfg: RunConfig, device: str, clients: int, indices: list[int]) -> Parts:
    """The data, the model and the clients `indices` (sharing one replica, on `device`)."""
    dataset = load_dataset(cfg.data, cfg.data_dir or None)
    cfg = cfg.for_data(len(dataset.train), clients)  # every later reader of steps takes Parts.cfg
    model = run_model(cfg, dataset)
    replica = make_replica(cfg, model, device, clients) if indices else None
    local = [make_client(cfg, replica, dataset, clients, i) for i in indices]
    return Parts(cfg, device, clients, indices, dataset, model, local)


def start(parts: Parts, out: str, records: bool, provenance: dict[str, Any], share: Share = lambda w, p: (w, p),
          warm_clock: Callable[[], float] | None = None) -> Started:
    """Start weights (seed, --init, --warm-start) and the resume point, decided where the run
    is recorded (`records`) and `share`d; then every local client synced and positioned."""
    cfg = parts.cfg
    weights, warm_rows = starting_weights(cfg, parts.dataset, parts.device, warm_clock) if records \
        else (flat_weights(parts.model), [])
    point = resume_point(out) if cfg.resume and records else None
    weights, point = share(weights, point)
    steps = []
    for index, client in zip(parts.indices, parts.local):
        client.sync(weights)
        steps.append(start_client(client, cfg, index, point))
    setup = RunSetup(cfg, out, parts.clients, parts.model, weights, parts.dataset, parts.device, provenance,
                     warm_rows)
    return Started(setup, steps, point)
