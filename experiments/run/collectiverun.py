"""A synchronous baseline run (`--mode sync` or `local-sgd`), over MPI or simulated.

There is no server: over MPI every rank is a client and rank 0 also records the run;
the simulator steps all K clients itself. Rows of all clients reach the recorder each
step (`gather`), so the run directory is the same as an async run's, with an empty
server.jsonl. Snapshots for the test error are client 0's weights, which in sync mode
every client shares and in local-sgd mode are averaged at each sync point (and, with
an outer step, stepped from the mean: clients/outer.py).

In local-sgd under failures a failed client loses its round so far (clients/collective.py),
which is known only when it fails: the recorder holds each round's rows (`RoundRows`)
and writes them at the round's average, its lost ones marked. Checkpoints are taken at
averages alone, so the rows a checkpoint accounts for are all written and final.

The recorder writes snapshots and checkpoints on a thread of its own, one at a time:
the files (checksummed, fsynced) take milliseconds, which every other rank would
otherwise spend waiting in the next allreduce. The weights are copied at the step, so
a file holds exactly what it would have held written in line.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from clients.buffers import host_copy
from clients.client import Client
from clients.collective import (Average, Away, FateSettings, Lockstep, RoundStart, Straggle, collective_step,
                                tries_before)
from clients.outer import OuterStep
from experiments.run.resume import ResumePoint
from experiments.run.life import RunLife
from experiments.run.record import RunSetup
from paramserver.faults import Fault
from paramserver.recorder import Background
from rundir.checkpoint import Checkpoint, save_point
from rundir.durable import read_jsonl
from rundir.layout import RunDir
from runconfig.settings import RunConfig
from rundir.modes import Mode


@dataclass(frozen=True)
class CollectiveSettings:
    """What a collective run reads of the config: the lockstep's own settings, and the
    rest, built once by `from_config` where either backend starts the run
    (experiments/rank/entry.py for its rank's client, experiments/sim/simulator.py for
    all). `outer_lr`: the outer step's (None: sync mode, no weights averaged);
    `faults`: those `inject_fault` puts on the clients `indices` of this process;
    `fates`: what the driver's `LockstepFates` are made of."""

    lockstep: Lockstep
    batch_size: int
    checkpoint_every: float
    outer_lr: float | None
    outer_momentum: float
    faults: tuple[Fault, ...]
    fates: FateSettings

    @classmethod
    def from_config(cls, cfg: RunConfig, clients: int, indices: list[int]) -> CollectiveSettings:
        faults = tuple(f for i in indices if (f := cfg.fault_for(i, f"client {i}")) is not None)
        return cls(Lockstep.for_run(cfg, clients), cfg.batch_size, cfg.checkpoint_every,
                   cfg.outer_step_lr if cfg.mode == Mode.LOCAL_SGD else None, cfg.outer_momentum, faults,
                   FateSettings.from_config(cfg, clients))


def collective_run(setup: RunSetup, settings: CollectiveSettings, clients: list[Client], indices: list[int],
                   average: Average, clock: Callable[[], float], gather: Callable[[list[dict]], list[dict] | None],
                   straggle: Straggle, point: ResumePoint | None = None,
                   agree: Callable[[bool], bool] = lambda flag: flag, away: Away | None = None) -> int:
    """Train every local client in lockstep; `gather` returns all rows on the recorder, else
    None; `straggle` (clients/collective.py) slows the step as the straggler model says,
    and `away` says who is down after a failure; `agree`: the recorder's word, on every
    rank (whether the curve reached a stop rule, asked at each evaluation step)."""
    lockstep = settings.lockstep
    k, samples_per_step = setup.clients, setup.clients * settings.batch_size
    recorder = 0 in indices
    with RunLife(setup, lockstep.steps, clock, records=recorder) as life:
        counts, lines = _opened(life, setup)
        life.counts = lambda: counts
        first = point.client_steps[0] + 1 if point else 1
        if point and settings.fates.failures and not lockstep.backups:
            _past_failed_tries(clients, indices, point, settings.fates.failures, first - 1)
        outer = OuterStep.for_run(settings.outer_lr, settings.outer_momentum, clients[0].weights,
                                  point.outer if point else {})
        round_start = RoundStart.for_run(lockstep, settings.fates.failures is not None, clients[0].weights)
        held = RoundRows(round_start is not None)
        files = _background(life) if recorder else None
        life.started()
        saved_at, averages = clock(), 0  # when the last checkpoint was taken (the run's clock); averages taken
        with life.run.writer("clients", lines) if recorder else contextlib.nullcontext() as log:
            for step in range(first, lockstep.steps + 1):
                for client in clients:  # the lr schedule's progress: the samples of the steps before
                    client.lr = client.schedule.at((step - 1) * samples_per_step)
                outcomes = collective_step(clients, lockstep, step, average, straggle, away, outer, round_start)
                averages += lockstep.averages(step)  # the steps that average are those every client leaves alike
                now = clock()
                rows = [_row(r, i, step, now, fate) for i, done in zip(indices, outcomes) for r, fate in done]
                for fault in settings.faults:
                    fault.strike(step)
                everyone = gather(rows)
                due = step % life.every == 0 or step == lockstep.steps
                timed = not due and _checkpoint_due(settings.checkpoint_every, lockstep, step, now - saved_at, recorder,
                                                    agree)
                checkpoint = (due or timed) and lockstep.averages(step)
                states = _checkpoint_states(lockstep.mode, clients, gather, recorder, outer) if checkpoint else {}
                saved_at = now if checkpoint else saved_at
                if recorder:
                    held.add(everyone)
                    _logged(log, everyone, held.take(lockstep.averages(step)), counts, life)
                    if due or timed:
                        files.submit(_save, life.run, setup, host_copy(clients[0].weights), step, now,
                                     dict(counts), log.lines, checkpoint, states, due)
                        if due and life.curve.inline:
                            files.wait()
                            life.curve.catch_up()
                if setup.record.stops and step % life.every == 0 and agree(recorder and life.curve.reached is not None):
                    break
            if recorder:  # a round a stop rule cut short
                log.write_many(held.take(True))
        life.progress.close()
        if recorder:
            life.curve.stop()
            files.close()
            life.finish({**_dropped(life.run, lockstep.backups), **_wire_bytes(averages, k, setup.weights.nbytes)})
    return 0


def _past_failed_tries(clients: list[Client], indices: list[int], point: ResumePoint, failures, steps: int) -> None:
    """A resume's data order under failures without backup workers: each failed try took
    a minibatch of its client's shard too, so each sampler goes on past them."""
    for client, i in zip(clients, indices):
        client.sampler.seek(point.position(i) + steps + tries_before(failures, i, steps))


def _background(life: RunLife) -> Background:
    """The recorder's file writer, closed with the run's files."""
    files = Background()
    life.land_files = files.close
    return files


def _logged(log, rows: list[dict], final: list[dict], counts: dict, life: RunLife) -> None:
    """The step's `rows` counted, the progress bar moved, and the rows now `final` written."""
    log.write_many(final)
    counts["minibatches"] += len(rows)
    counts["samples"] += sum(r["samples"] for r in rows)
    life.progress.update(counts["minibatches"])


class RoundRows:
    """The recorder's rows of a local-sgd round under failures (`holds`), written at its
    average: a client that fails loses its round so far, so its rows of the round before
    that are lost work (not failures: the failed try's own row says `failed`). Without
    failures every step's rows are final at once."""

    def __init__(self, holds: bool):
        self.holds, self.rows = holds, []

    def add(self, rows: list[dict]) -> None:
        failed = {row["client"] for row in rows if row.get("failed")}
        if failed:
            self.rows = [{**row, "lost": True} if row["client"] in failed and not row.get("lost") else row
                         for row in self.rows]
        self.rows += rows

    def take(self, averaged: bool) -> list[dict]:
        """The rows now final: all, at an average or when not holding; else none."""
        if self.holds and not averaged:
            return []
        rows, self.rows = self.rows, []
        return rows


def _wire_bytes(averages: int, clients: int, nbytes: int) -> dict[str, int]:
    """What the averages moved, as the async modes' frame bytes are counted: each client
    hands its vector (gradient or weights, float32) to each average and takes the mean
    back. Not the allreduce's own traffic, which MPI's algorithm decides (a ring sends
    2(K-1)/K of a vector each way)."""
    moved = averages * clients * nbytes
    return {"bytes_pushed": moved, "bytes_pulled": moved}


def _row(result, client: int, step: int, now: float, fate: str) -> dict:
    """A minibatch's row; a backup worker's dropped gradient says so, and a minibatch
    lost to a failure."""
    row = result.row(client, step, now)
    if fate == "lost":  # each lost minibatch of a lockstep step is one failure
        return {**row, "lost": True, "failed": True}
    return row if fate == "kept" else {**row, fate: True}


def _dropped(run: RunDir, backups: int) -> dict[str, int]:
    """With backup workers, the gradients their rule dropped in the whole run (a resumed one too)."""
    if not backups:
        return {}
    return {"gradients_dropped": sum(1 for row in read_jsonl(run.path / "clients.jsonl") if row.get("dropped"))}


def _opened(life: RunLife, setup: RunSetup) -> tuple[dict[str, Any], int]:
    """The counts so far and the clients log's rows: a fresh run's starting state is
    written (resumable from step 1), a resumed one's read from its checkpoint."""
    if life.run is None:
        return {}, 0
    if life.checkpoint is None:
        life.run.writer("server").close()  # no server in these modes: its log stays empty
        counts = {"minibatches": 0, "samples": 0}
        _save(life.run, setup, setup.weights, 0, 0.0, counts, 0, resumable=True)
        return counts, 0
    minibatches, samples, _ = life.checkpoint.counts
    return {"minibatches": minibatches, "samples": samples}, life.checkpoint.lines[1]


def optimizer_states(mode: Mode, clients: list[Client], gather: Callable[[list], list | None],
                     recorder: bool) -> dict[str, Any]:
    """The clients' optimizer state for a checkpoint (Checkpoint's fields), copied: in sync
    mode one for all (each steps with the same averaged gradient, so one client's is all
    of theirs); in local-sgd each client's own, gathered from every rank (so every rank
    calls this at the same steps)."""
    if not clients[0].replica.optimizer.keeps_state:
        return {}
    if mode == Mode.SYNC:
        return {"optimizer": clients[0].optimizer.state_arrays()} if recorder else {}
    states = gather([client.optimizer.state_arrays() for client in clients])
    return {} if states is None else {"client_optimizers": dict(enumerate(states))}


def _checkpoint_states(mode: Mode, clients: list[Client], gather: Callable[[list], list | None], recorder: bool,
                       outer: OuterStep | None) -> dict[str, Any]:
    """What a checkpoint holds beside the weights: the clients' optimizer state and
    local-sgd's outer momentum (every rank's copy is the same: the recorder's is saved)."""
    return {**optimizer_states(mode, clients, gather, recorder), **({"outer": outer.state()} if outer else {})}


def _checkpoint_due(every: float, lockstep: Lockstep, step: int, since: float, recorder: bool,
                    agree: Callable[[bool], bool]) -> bool:
    """Whether `every` seconds (checkpoint_every) passed since the last checkpoint (`since`, by the
    recorder's clock) at a step the run can go on from. In sync mode the recorder alone
    writes it; in local-sgd every rank gives its optimizer state, so the recorder's word
    is `agree`d by all, at the averaging steps alone (a broadcast where an allreduce is)."""
    if not every or not lockstep.averages(step):
        return False
    late = recorder and since >= every
    return late if lockstep.mode == Mode.SYNC else agree(late)


def _save(run: RunDir, setup: RunSetup, weights: np.ndarray, step: int, now: float, counts: dict[str, Any],
          lines: int, resumable: bool, optimizers: dict[str, Any] | None = None, evaluated: bool = True) -> None:
    """A snapshot of client 0's `weights` for the test error (`evaluated`: a point of the
    curve) and, where the run can go on from it (`resumable`), a checkpoint, with the
    clients' `optimizers` state."""
    k = setup.clients
    save_point(run, Checkpoint(weights, step, now, (0, lines), (counts["minibatches"], counts["samples"], 0),
                               np.full(k, step), np.zeros(k, np.int64), **(optimizers or {})),
               resumable=resumable, evaluated=evaluated)
