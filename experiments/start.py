"""Where training starts: fresh weights from the seed, a checkpoint (`--init`), and/or a
single-client warm start (`--warm-start STEPS`, the paper's warm start).

The warm start trains a model of its own on the whole training set, in an order drawn
from the seed on a stream no client uses, with the run's optimizer settings. Its rows
go to warm_start.jsonl; the run's clock starts after it.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn

from clients.client import Client, Replica
from clients.data import Dataset, ShardSampler, shard_indices
from clients.models import build_model, flat_weights, host_copy
from experiments.resume import ResumePoint
from paramserver.config import RunConfig
from paramserver.runlog import load_arrays

WARM_STREAM = 1_000_003  # the ShardSampler "client" number of the warm-start order


class StartError(ValueError):
    """The --init checkpoint cannot be used (one line)."""


def make_replica(cfg: RunConfig, model: nn.Module, device: str) -> Replica:
    """The model with the run's client optimizer."""
    return Replica(model, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, device=device)


def make_client(cfg: RunConfig, replica: Replica, dataset: Dataset, clients: int, index: int) -> Client:
    """Client `index` of `clients`, on its shard of the training set, stepping on `replica`."""
    shard = shard_indices(len(dataset.train), clients, index, cfg.seed)
    return Client(replica, dataset.train, ShardSampler(shard, cfg.batch_size, cfg.seed, index),
                  push_gradients=cfg.rule != "add")


def checkpoint_weights(path: str, size: int) -> np.ndarray:
    """The weights saved in a checkpoint, checked against the model's size."""
    try:
        weights = load_arrays(path)["weights"]
    except (OSError, ValueError, KeyError) as error:
        raise StartError(f"init: cannot read weights from {path} ({error})") from None
    if weights.dtype != np.float32 or weights.ndim != 1 or weights.size != size:
        raise StartError(f"init: {path} holds {weights.size} {weights.dtype} weights, the model has {size} float32")
    return weights


def starting_weights(cfg: RunConfig, dataset: Dataset, device: str,
                     clock: Callable[[], float] | None = None) -> tuple[np.ndarray, list[dict]]:
    """(initial weights, warm-start rows); `clock` times the rows (default: wall seconds)."""
    model = build_model(cfg.model, dataset.shape, dataset.num_classes, cfg.seed)
    weights = flat_weights(model)
    if cfg.resume:
        return checkpoint_weights(str(Path(cfg.resume) / "checkpoint" / "latest.npz"), weights.size), []
    if cfg.init:
        weights = checkpoint_weights(cfg.init, weights.size)
    if not cfg.warm_start:
        return weights, []
    replica = make_replica(cfg, model, device)
    sampler = ShardSampler(np.arange(len(dataset.train)), cfg.batch_size, cfg.seed, WARM_STREAM)
    client = Client(replica, dataset.train, sampler)
    client.sync(weights)
    start = time.perf_counter()
    clock = clock or (lambda: time.perf_counter() - start)
    rows = []
    for step in range(1, cfg.warm_start + 1):
        result = client.step()
        rows.append({"client": 0, "step": step, "time": clock(), "loss": result.loss,
                     "error": result.error, "samples": result.samples})
    return host_copy(client.weights), rows


def start_client(client: Client, cfg: RunConfig, index: int, point: ResumePoint | None) -> int:
    """Position a client's data order and RNG at its first step (after a resume, its
    last pushed step); returns that step. Dropout draws differ across clients and steps."""
    step = point.client_steps[index] if point else 0
    client.sampler.seek(step)
    torch.manual_seed(int(np.random.SeedSequence([cfg.seed, index, step]).generate_state(1)[0]))
    return step
