"""Synchronous baselines: every client steps in lockstep and nothing is stale.

- `sync`: each step, every client computes its gradient, the gradients are averaged
  over all clients (G = (G1 + ... + GK) / K), and every client takes the same step, as
  in data-parallel training. With K clients of batch B this is single-process SGD with
  batch K*B.
- `local-sgd`: clients step on their own gradients and average their weights every
  n_sync steps (and at the last step); their optimizer's state stays local. With an
  outer step (`outer_lr`, `nesterov_momentum`: synchronous DiLoCo, clients/outer.py)
  the mean is the outer optimizer's input, and its step the weights every client takes.
- `sync` with backup workers b (Chen et al. 2016): each step averages the gradients of
  the K - b clients that finish first and drops the other b (`keep_fastest`). A
  dropped client's work is abandoned, so it starts the next step with everyone else,
  which is the baseline's best case: a slow client that finished its stale gradient
  first would start later still.

`straggle(step, compute_s)` runs between the gradients and the average: it makes the
local clients as slow as the straggler model says (a sleep over MPI, virtual time in
the simulator) and says what the step makes of each one's minibatch (`Fate`). Those fates
are decided once for both backends (`LockstepFates`); a driver only spends the time
(and over MPI shares the durations, so every rank drops the same b).

Failures (`mtbf`): a client that fails loses its minibatch and is down for
`failure_length`. Without backup workers the step waits, as an allreduce must: the
client comes back, takes the weights (every client's are the same) and computes its
gradient again. With b backup workers the step goes on without it (it is one of the b
dropped), and so does every step that starts while it is down (`away`: it computes
nothing then, unless more clients are down than b, when the step waits for it).
In local-sgd (no backup workers) the step waits likewise, but the failed client lost
its round's local work with its process: it goes back to the last average's weights
(`RoundStart`: every client held them then) with its optimizer afresh, computes the
step's minibatch again and goes on; the round's earlier steps are not redone, so its
rows of them are lost work (the recorder marks them: experiments/run/collectiverun.py).

`average` replaces each tensor of its list by the mean over all clients: over MPI
ranks in a real run (one local client each), over the list in the simulator.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from clients.client import Client, StepResult
from clients.outer import OuterStep
from clients.stragglers import Failures, Stragglers
from rundir.modes import Mode
from runconfig.settings import RunConfig

Average = Callable[[list[torch.Tensor]], None]


@dataclass(frozen=True)
class Fate:
    """What a step makes of one client's work: kept in the average or not; `lost`:
    minibatches it computed and lost to failures first (a kept client computes again
    after each); `away`: it was down when the step began, and computed nothing before."""

    kept: bool
    lost: int = 0
    away: bool = False


Straggle = Callable[[int, list[float | None]], list[Fate]]  # (step, local compute seconds; None: away) -> fates
Away = Callable[[], list[bool]]                             # which local clients are down as a step begins
Outcome = list[tuple[StepResult, str]]  # a client's minibatches of a step: "kept", "dropped" or "lost"


@dataclass(frozen=True)
class Lockstep:
    """What the lockstep steps read of the run: its mode, its steps, n_sync, and its K
    clients with b backup workers. Built once by either backend."""

    mode: Mode
    steps: int
    n_sync: int = 1
    clients: int = 1
    backups: int = 0

    def averages(self, step: int) -> bool:
        """Whether `step` ends with an average, after which every client holds the same
        weights (the steps a run can go on from): every step in sync mode; in local-sgd
        every n_sync-th and the last."""
        return self.mode == Mode.SYNC or step % self.n_sync == 0 or step == self.steps

    @classmethod
    def for_run(cls, cfg: RunConfig, clients: int) -> Lockstep:
        return cls(Mode(cfg.mode), cfg.steps, cfg.n_sync, clients, cfg.backup_workers)


class RoundStart:
    """The weights every client of a local-sgd run held after the last average (or at the
    start or resume), kept where failures may strike: a failed client goes back to them."""

    def __init__(self, weights: torch.Tensor):
        self.weights = weights.detach().clone()

    @classmethod
    def for_run(cls, lockstep: Lockstep, failures: bool, weights: torch.Tensor) -> RoundStart | None:
        """None where no client can lose a round (sync mode, or no failures): no copy kept."""
        return cls(weights) if failures and lockstep.mode == Mode.LOCAL_SGD else None


def collective_step(clients: list[Client], lockstep: Lockstep, step: int, average: Average, straggle: Straggle,
                    away: Away | None = None, outer: OuterStep | None = None,
                    round_start: RoundStart | None = None) -> list[Outcome]:
    """One lockstep step of the local `clients`; `outer`: local-sgd's outer step (None:
    plain averaging); `round_start`: local-sgd's under failures. Returns each local
    client's minibatches and what became of them."""
    gone = away() if away is not None else [False] * len(clients)
    results, compute_s = [], []
    for client, out in zip(clients, gone):
        start = time.perf_counter()
        results.append([] if out else [client.compute()])
        compute_s.append(None if out else time.perf_counter() - start)
    fates = straggle(step, compute_s)
    for client, done, fate in zip(clients, results, fates):
        if round_start is not None and fate.kept and fate.lost:  # local-sgd: its round's work went with it
            client.rewind(round_start.weights)
        while fate.kept and len(done) < fate.lost + 1:  # back from a failure: the gradient again
            done.append(client.compute())
    if lockstep.mode == Mode.SYNC:
        k, b = lockstep.clients, lockstep.backups
        for client, fate in zip(clients, fates):  # so that the mean over all K is the kept ones' mean
            if b or not fate.kept:
                client.grad.mul_(k / (k - b) if fate.kept else 0.0)
        average([client.grad for client in clients])
    for client in clients:
        client.optimizer_step()
    if lockstep.mode == Mode.LOCAL_SGD and lockstep.averages(step):
        average([client.weights for client in clients])
        if outer is not None:
            outer.step([client.weights for client in clients])
        if round_start is not None:
            round_start.weights.copy_(clients[0].weights)
    return [[(r, "lost" if j < fate.lost else "kept" if fate.kept else "dropped") for j, r in enumerate(done)]
            for done, fate in zip(results, fates)]


@dataclass(frozen=True)
class FateSettings:
    """What the lockstep's fates read of the config, for a run of `clients` clients: its
    straggler model, its failures and its b backup workers. Built once where either backend
    starts a collective run (experiments/run/collectiverun.py's `CollectiveSettings`)."""

    stragglers: Stragglers
    failures: Failures | None
    backups: int

    @classmethod
    def from_config(cls, cfg: RunConfig, clients: int) -> FateSettings:
        stragglers = Stragglers.for_run(cfg, clients)
        return cls(stragglers, Failures.for_run(cfg, stragglers), cfg.backup_workers)


MAX_TRIES = 1000  # a minibatch that fails this often in a row never completes: the run is refused


def failed_tries(failures: Failures | None, client: int, step: int) -> int:
    """How many tries of `client`'s minibatch of `step` fail before one survives (0
    without failures): a sync step that waits for it pays for each."""
    tries = 0
    while failures is not None and failures.fails(client, step, tries):
        tries += 1
        if tries == MAX_TRIES:
            raise ValueError(f"mtbf: client {client}'s minibatch failed {tries} times in a row at step {step}: "
                             f"its minibatch is too long against a mean time between failures of {failures.mtbf}")
    return tries


def tries_before(failures: Failures | None, client: int, step: int) -> int:
    """The failed tries of `client`'s minibatches in steps 1..`step`: without backup
    workers each took a minibatch of its shard, so a resume after `step` seeks past them."""
    return sum(failed_tries(failures, client, s) for s in range(1, step + 1)) if failures else 0


class LockstepFates:
    """The straggler model and the failures made into each lockstep step's fates, for
    the local clients `indices` (all K in the simulator, one a rank over MPI): what the
    step costs each (`durations`), who the b backup workers drop (`kept`), and what
    becomes of each one's work (`settle`), on the driver's clock (virtual or real
    seconds). A client's minibatch costs its base time (`bases`: the simulator's step
    time, a real rank's last compute) stretched by the model; in `real_time` no factor
    makes it faster than its compute. A client that fails and is dropped is down
    `failure_length` base times from its failure (`back`); a step that keeps a failed
    client waits until it is back and has computed again."""

    def __init__(self, stragglers: Stragglers, failures: Failures | None, backups: int, indices: list[int],
                 bases: list[float], real_time: bool = False):
        self.stragglers, self.failures, self.backups = stragglers, failures, backups
        self.indices, self.bases, self.real_time = indices, list(bases), real_time
        self.back = [0.0] * len(indices)   # when each client is back from its last failure
        self.tries = [0] * len(indices)    # the step's failed tries of each client's minibatch

    @classmethod
    def for_run(cls, settings: FateSettings, indices: list[int], bases: list[float],
                real_time: bool = False) -> LockstepFates:
        """The fates of the local clients `indices`, for both backends."""
        return cls(settings.stragglers, settings.failures, settings.backups, indices, bases, real_time)

    def away(self, now: float) -> list[bool]:
        """Who is down as a step begins at `now` (a billionth of a base time: rounding)."""
        return [back - now > 1e-9 * base for back, base in zip(self.back, self.bases)]

    def durations(self, step: int, start: float) -> list[float]:
        """Each local client's time in the step begun at `start`: until it is back, then
        each failed try, its outage, and the minibatch that survives."""
        length = self.failures.length if self.failures else 0.0
        self.tries = [failed_tries(self.failures, i, step) for i in self.indices]
        return [max(0.0, back - start) + (tries + 1) * self.minibatch(i, step, base) + tries * length * base
                for i, back, base, tries in zip(self.indices, self.back, self.bases, self.tries)]

    def minibatch(self, client: int, step: int, base: float) -> float:
        """A minibatch's time, its compute `base` stretched by the straggler model."""
        stretched = self.stragglers.duration(client, step, base)
        return max(base, stretched) if self.real_time else stretched

    def kept(self, durations: list[float]) -> list[bool]:
        """Which of all K clients, taking `durations`, the step keeps."""
        return keep_fastest(durations, self.backups)

    def settle(self, step: int, start: float, kept: list[bool], away: list[bool]) -> list[Fate]:
        """The local clients' fates; one that failed and was dropped is down from its failure."""
        length = self.failures.length if self.failures else 0.0
        fates = []
        for j, (client, keep, out) in enumerate(zip(self.indices, kept, away)):
            tries, base = self.tries[j], self.bases[j]
            if not keep and tries and not out:  # it failed, and the step goes on without it
                self.back[j] = start + self.minibatch(client, step, base) + length * base
            fates.append(Fate(keep, tries if keep else int(bool(tries) and not out), out))
        return fates


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
