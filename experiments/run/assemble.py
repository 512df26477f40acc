"""One recipe for a run's setup, for both backends: data, model, clients, start weights,
resume point, each client positioned at its first step.

It runs in two parts, because between them the simulator measures its costs on the
clients it built (the warm start's rows are timed on that clock): `build` (data, model,
this process's clients) and `start` (the start weights and resume point, decided by the
process that records the run, then shared; every client synced and positioned). The MPI
backend runs both on every rank, each for its own client (none on a server), sharing
rank 0's decisions by broadcast; the simulator runs them once, for all K clients.

Where training starts: fresh weights from the seed, a checkpoint (`--init`), and/or a
single-client warm start (`--warm-start STEPS`, the paper's warm start). The warm start
trains a model of its own on the whole training set, in an order drawn from the seed on
a stream no client uses, with the run's optimizer settings. Its rows go to
warm_start.jsonl; the run's clock starts after it.
"""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from clients.buffers import host_copy
from clients.client import Client, Replica
from clients.loop import ClientPlan, PlanSettings
from clients.data import Dataset, load_dataset
from clients.models import flat_weights, run_model
from clients.optimizers import OptimizerSettings, user_optimizer
from clients.sampling import ShardSampler, slot_indices
from clients.user.code import loss_function, optimizer_factory
from experiments.run.resume import ResumePoint, resume_point
from experiments.run.record import RecordSettings, RunSetup
from runconfig.settings import RunConfig
from paramserver.rules import rule_class
from paramserver.schedule import Schedule
from paramserver.wire.protocol import Welcome
from rundir.durable import load_arrays
from rundir.layout import RunDir
from rundir.modes import Mode

# How rank 0's start weights and resume point reach every process (identity in one process).
Share = Callable[[np.ndarray, ResumePoint | None], tuple[np.ndarray, ResumePoint | None]]
WARM_STREAM = 1_000_003  # the ShardSampler "client" number of the warm-start order


class StartError(ValueError):
    """The --init checkpoint cannot be used (one line)."""


@dataclass(frozen=True)
class ClientSettings:
    """What a client is made of, of the config, for a run of a given number of clients:
    its optimizer (the momentum `auto` gives them), loss, seed and batch size, what its
    rule has it push and its elastic step (EASGD's), whether its shard is dealt afresh each
    epoch (`redeal`: under the run's budget fast clients run more epochs, so in every mode
    a collective run reads what an async run of equal speeds reads), its lr schedule and
    data workers. Built once by `build` (`Parts.client`), which the joiners read too."""

    optimizer: OptimizerSettings
    loss: str
    seed: int
    batch_size: int
    pushes: str
    elastic: float
    redeal: bool
    schedule: Schedule
    workers: int

    @classmethod
    def from_config(cls, cfg: RunConfig, clients: int) -> ClientSettings:
        rule = rule_class(cfg.rule if cfg.mode == Mode.ASYNC else "add")  # the collective modes push no rule's way
        optimizer = OptimizerSettings(name=cfg.optimizer, lr=cfg.lr, momentum=cfg.client_momentum(clients),
                                      weight_decay=cfg.weight_decay, nesterov=cfg.nesterov,
                                      clip_grad_norm=cfg.clip_grad_norm, precision=cfg.precision,
                                      factory=optimizer_factory(cfg.optimizer))
        return cls(optimizer, cfg.loss, cfg.seed, cfg.batch_size, rule.pushes, rule.client_elastic(cfg, clients),
                   cfg.budget == "run", Schedule.for_run(cfg, clients), cfg.data_workers)


@dataclass
class Parts:
    """What `build` makes: the data, the model (the recorder evaluates with it) and this
    process's clients, numbered `indices` among the run's `clients`, and what they are made of."""

    cfg: RunConfig
    device: str
    clients: int
    indices: list[int]
    dataset: Dataset
    model: nn.Module
    local: list[Client]
    client: ClientSettings


@dataclass(frozen=True)
class Started:
    setup: RunSetup
    steps: list[int]           # each local client's first step (after a resume, its last pushed one)
    point: ResumePoint | None
    numbers: list[int]         # each local client's number: its slot's, or after a resume the slot's last holder's


def build(cfg: RunConfig, device: str, clients: int, indices: list[int]) -> Parts:
    """The data, the model and the clients `indices` (sharing one replica, on `device`)."""
    dataset = load_dataset(cfg.data, cfg.data_dir or None)
    cfg = cfg.for_data(len(dataset.train), clients)  # every later reader of steps takes Parts.cfg
    model = run_model(cfg, dataset)
    settings = ClientSettings.from_config(cfg, clients)
    replica = make_replica(settings, model, device) if indices else None
    local = [make_client(settings, replica, dataset, clients, i) for i in indices]
    return Parts(cfg, device, clients, indices, dataset, model, local, settings)


def start(parts: Parts, out: str, records: bool, provenance: dict[str, Any], share: Share = lambda w, p: (w, p),
          warm_clock: Callable[[], float] | None = None) -> Started:
    """Start weights (seed, --init, --warm-start) and the resume point, decided where the run
    is recorded (`records`) and `share`d; then every local client synced and positioned."""
    cfg = parts.cfg
    weights, warm_rows = (starting_weights(cfg, parts.dataset, parts.device, warm_clock) if records
                          else (flat_weights(parts.model), []))
    point = resume_point(out) if cfg.resume and records else None
    weights, point = share(weights, point)
    numbers = [point.holder(slot) if point else slot for slot in parts.indices]
    steps = []
    for number, client in zip(numbers, parts.local):
        client.sync(weights)
        steps.append(start_client(client, parts.client.seed, number, point))
    setup = RunSetup(cfg, parts.clients, parts.model, weights, parts.dataset, parts.device, provenance,
                     RecordSettings.from_config(cfg, out, parts.clients, provenance), warm_rows)
    return Started(setup, steps, point, numbers)


def make_replica(settings: ClientSettings, model: nn.Module, device: str) -> Replica:
    """The model with the run's client optimizer."""
    optimizer = settings.optimizer
    return Replica(model, lr=optimizer.lr, momentum=optimizer.momentum, weight_decay=optimizer.weight_decay,
                   device=device, loss=loss_function(settings.loss), name=optimizer.name, nesterov=optimizer.nesterov,
                   clip_grad_norm=optimizer.clip_grad_norm, precision=optimizer.precision, factory=optimizer.factory)


def server_optimizer_factory(cfg: RunConfig) -> Callable[[list[nn.Parameter]], torch.optim.Optimizer] | None:
    """The user's optimizer for the server's step (a gradient rule's), with the server's lr,
    momentum and weight decay bound; None for one of ours."""
    factory = optimizer_factory(cfg.optimizer)
    if factory is None:
        return None
    return functools.partial(user_optimizer, factory, spec=cfg.optimizer, lr=cfg.effective_server_lr,
                             momentum=cfg.effective_server_momentum, weight_decay=cfg.weight_decay)


def make_client(settings: ClientSettings, replica: Replica, dataset: Dataset, clients: int, index: int) -> Client:
    """Client `index` of `clients`, on its shard of the training set (`index`: the shard's
    slot, for a joiner; `slot_indices`), stepping on `replica`, pushing what the server's
    rule takes."""
    shard = slot_indices(len(dataset.train), clients, index, settings.seed)
    redeal = (len(dataset.train), clients) if settings.redeal and 1 < clients and index < clients else None
    sampler = ShardSampler(shard, settings.batch_size, settings.seed, index, redeal)
    return Client(replica, dataset.train, sampler, pushes=settings.pushes, elastic=settings.elastic,
                  schedule=settings.schedule, workers=settings.workers)


def join_client(settings: ClientSettings, replica: Replica, dataset: Dataset, clients: int, welcome: Welcome) -> Client:
    """The client of a process the server let join (paramserver/membership.py): on the
    shard its `welcome` deals, standing where that shard's order was left; it syncs to
    the weights that came with the welcome."""
    client = make_client(settings, replica, dataset, clients, welcome.slot)
    client.sampler.seek(welcome.position)
    torch.manual_seed(int(np.random.SeedSequence([settings.seed, welcome.client, 0]).generate_state(1)[0]))
    return client


def start_checkpoint(cfg: RunConfig) -> tuple[str, str] | None:
    """(flag, path) of the checkpoint a run starts from: its own after --resume, else --init's."""
    if cfg.resume:
        return "resume", str(RunDir(cfg.resume).checkpoint_path)
    return ("init", cfg.init) if cfg.init else None


def checkpoint_weights(flag: str, path: str, size: int) -> np.ndarray:
    """The weights saved in a checkpoint, checked against the model's; `flag` names the
    option that chose the file (a checkpoint of another model names both shapes)."""
    try:
        weights = load_arrays(path, checksummed=flag == "resume")["weights"]
    except (OSError, ValueError, KeyError) as error:
        raise StartError(f"{flag}: cannot read weights from {path} ({error})") from None
    if weights.dtype != np.float32 or weights.shape != (size,):
        raise StartError(f"{flag}: {path} holds {weights.dtype} weights of shape {weights.shape}; "
                         f"the model needs float32 of shape ({size},)")
    return weights


def starting_weights(cfg: RunConfig, dataset: Dataset, device: str,
                     clock: Callable[[], float] | None = None) -> tuple[np.ndarray, list[dict]]:
    """(initial weights, warm-start rows); `clock` times the rows (default: wall seconds)."""
    model = run_model(cfg, dataset)
    weights = flat_weights(model)
    checkpoint = start_checkpoint(cfg)
    if checkpoint:
        weights = checkpoint_weights(*checkpoint, weights.size)
    if cfg.resume or not cfg.warm_start:  # a resumed run's warm start is in its checkpoint
        return weights, []
    replica = make_replica(ClientSettings.from_config(cfg, clients=1), model, device)
    sampler = ShardSampler(np.arange(len(dataset.train)), cfg.batch_size, cfg.seed, WARM_STREAM)
    client = Client(replica, dataset.train, sampler)
    client.sync(weights)
    began = time.perf_counter()
    clock = clock or (lambda: time.perf_counter() - began)
    rows = []
    for step in range(1, cfg.warm_start + 1):
        result = client.step()
        rows.append(result.row(0, step, clock()))
    return host_copy(client.weights), rows


def client_plan(plans: PlanSettings, number: int, servers: int, point: ResumePoint | None, run_budget: bool,
                real_time: bool = True) -> ClientPlan:
    """Client `number`'s plan, for both backends; after a resume, a joiner's counts to what
    its shard's order had left from where it was seated (`ResumePoint.steps_of`)."""
    plan = ClientPlan.for_run(plans, number, servers, real_time)
    return replace(plan, steps=point.steps_of(number, plan.steps, run_budget)) if point else plan


def start_client(client: Client, seed: int, index: int, point: ResumePoint | None) -> int:
    """Position client `index`'s data order and RNG at its first step (after a resume, its
    last pushed step, counted from where it was seated, and its optimizer's state where
    the checkpoint has it); returns that step. Dropout draws differ across clients and steps."""
    step = point.client_steps[index] if point else 0
    if point and point.optimizer_of(index):
        client.optimizer.load_state_arrays(point.optimizer_of(index))
    client.sampler.seek((point.position(index) if point else 0) + step)
    torch.manual_seed(int(np.random.SeedSequence([seed, index, step]).generate_state(1)[0]))
    return step
