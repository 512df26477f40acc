"""The parts of a run's record that every mode shares: open, evaluate, summarise, fail.

The summary itself is rundir/summary.py's; here is what feeds it: the
config and provenance written first, the snapshots evaluated as they land (the live
curve) and the final weights on the whole test split at the end.
"""
from __future__ import annotations

import copy
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from clients.data import Dataset
from clients.evaluate import (RECALIBRATE_SAMPLES, EvalItems, LiveCurve, curve_samples, final_measurement,
                              has_running_stats, keep_best)
from clients.user.metric import metric_function, metric_traits
from clients.stragglers import client_speeds
from clients.user.code import loss_function
from experiments.run.inputs import fingerprint
from experiments.run.sizing import load_note, server_load
from experiments.progress import Progress
from runconfig.settings import RunConfig
from paramserver.rules import rule_class
from rundir.goodput import goodput
from rundir.layout import RunDir
from rundir.measure import curve_measure, stop_rules
from rundir.status import COMPLETE, reached_target
from rundir.summary import (VIRTUAL, WALL, ending, seconds, training_status, write_failure,
                                        write_result)
from rundir.modes import Mode


@dataclass(frozen=True)
class RecordSettings:
    """What the rank that records a run reads of its config, and nothing else: built once
    from the config where either backend starts the run (`from_config`, called by
    experiments/run/assemble.py's `start`), so the recorder's functions take these fields
    instead of the eighty of `RunConfig`.

    `config`: the resolved config as config.json holds it; `used`: what the run took where
    the config left it to the run (the clients' momentum, the outer step, the rule's
    settings, uneven speeds), written beside it; `traits`: the metric's name and direction.
    `live_share`: the share of its time the curve's thread measures (`live_share`);
    `clock`: VIRTUAL or WALL; `windows`: the clients push windows (goodput counts them);
    `gathers`: the rule gathers a step; `stops`: a stop rule is set."""

    out: str
    clients: int
    config: dict[str, Any]
    used: dict[str, Any]
    traits: dict[str, Any]
    resumes: bool
    steps: int
    batch_size: int
    eval_every: int         # 0: about CURVE_POINTS a run (`eval_every`)
    eval_samples: int
    seed: int
    loss: str
    metric: str
    live_share: float
    stops: bool
    tensorboard: bool
    threads: int
    quiet: bool
    keep_best: bool
    keep_snapshots: bool
    clock: str
    windows: bool
    gathers: bool
    servers: int

    @classmethod
    def from_config(cls, cfg: RunConfig, out: str, clients: int, provenance: dict[str, Any]) -> RecordSettings:
        used = {"momentum_used": round(cfg.client_momentum(clients), 6), **_outer(cfg), **cfg.rule_settings_used,
                **_speeds(cfg, clients)}
        return cls(out=out, clients=clients, config=cfg.to_dict(), used=used, traits=metric_traits(cfg.metric),
                   resumes=bool(cfg.resume), steps=cfg.steps, batch_size=cfg.batch_size, eval_every=cfg.eval_every,
                   eval_samples=cfg.eval_samples, seed=cfg.seed, loss=cfg.loss, metric=cfg.metric,
                   live_share=live_share(cfg, provenance), stops=stops_early(cfg), tensorboard=cfg.tensorboard,
                   threads=cfg.threads, quiet=cfg.quiet, keep_best=cfg.keep_best, keep_snapshots=cfg.keep_snapshots,
                   clock=VIRTUAL if cfg.backend == "sim" else WALL, windows=cfg.mode == Mode.ASYNC,
                   gathers=rule_class(cfg.rule).gathers, servers=cfg.servers)

    @property
    def measured(self) -> dict[str, Any]:
        """The run's config with its metric's name and direction, as config.json records
        them: what rundir/measure.py decides the curve's measure and stop rules from."""
        return {**self.config, **self.traits}


@dataclass(frozen=True)
class RunSetup:
    """What either backend hands to the rank that records the run."""

    cfg: RunConfig
    clients: int
    model: nn.Module        # evaluates the snapshots after training
    weights: np.ndarray     # the initial weights
    dataset: Dataset
    device: str
    provenance: dict[str, Any]
    record: RecordSettings
    warm_rows: list[dict] = field(default_factory=list)   # the warm start's minibatches


CURVE_POINTS = 20      # the curve's points in a run by default, but
CURVE_SHARE = 0.25     # at most this share of training's compute in forward passes,
FORWARDS_A_SAMPLE = 3  # counting a training sample (forward and backward) as this many


def eval_every(setup: RunSetup, events: int) -> int:
    """The versions (or steps) between points of the curve, over a run of `events`: as
    the config sets it, else about CURVE_POINTS a run, fewer where that many would cost
    more than CURVE_SHARE of training's compute, so a short run is not mostly its curve
    (each point: the curve's test items, and for BatchNorm the recalibration's forward
    passes; training: FORWARDS_A_SAMPLE a sample, fewer than it really takes)."""
    record = setup.record
    if record.eval_every:
        return record.eval_every
    point = len(curve_samples(len(setup.dataset.test), record.eval_samples, record.seed)) + \
        (RECALIBRATE_SAMPLES if has_running_stats(setup.model) else 0)
    trained = record.clients * record.steps * record.batch_size * FORWARDS_A_SAMPLE
    points = max(2, min(CURVE_POINTS, int(CURVE_SHARE * trained / point)))
    return max(1, events // points)


def record_dir(record: RecordSettings) -> RunDir:
    """The run directory the recording process writes, feeding TensorBoard with `--tensorboard`."""
    if not record.tensorboard:
        return RunDir(record.out)
    from experiments.tensorboard import Scalars
    return RunDir(record.out, tap=Scalars.for_run(record.out, record.config | {"clients": record.clients}))


def open_run(setup: RunSetup, every: int) -> RunDir:
    record = setup.record
    run = record_dir(record)
    run.create()
    run.write_config({**record.config, "out": record.out, "clients": record.clients, "eval_every": every,
                      **record.used, **record.traits, "num_params": setup.weights.size,
                      "train_size": len(setup.dataset.train),
                      "data_fingerprint": fingerprint(setup.dataset), "provenance": setup.provenance})
    if setup.warm_rows:
        with run.writer("warm_start") as log:
            log.write_many(setup.warm_rows)
    return run


def _outer(cfg: RunConfig) -> dict[str, float]:
    """The outer step's lr and momentum a run takes (the lr's default follows the
    momentum), where it takes one."""
    if not cfg.takes_outer_step:
        return {}
    return {"outer_lr_used": cfg.outer_step_lr, "outer_momentum_used": cfg.outer_momentum}


def stops_early(cfg: RunConfig) -> bool:
    """The run has a stop rule (stop_at_error, stop_at_loss or stop_at_metric)."""
    return bool(stop_rules(cfg.to_dict()))


def _speeds(cfg: RunConfig, clients: int) -> dict[str, Any]:
    """Each client's speed (clients/stragglers.py), where they are uneven: `speeds_used`."""
    speeds = client_speeds(cfg.seed, clients, cfg.speed_spread, cfg.client_speeds)
    return {"speeds_used": speeds} if any(s != 1.0 for s in speeds) else {}


def live_curve(run: RunDir, setup: RunSetup) -> LiveCurve:
    """The test curve measured while the run trains, on a model of its own (the clients of
    this process step theirs)."""
    record, dataset = setup.record, setup.dataset
    model = copy.deepcopy(setup.model).to(setup.device)
    samples = curve_samples(len(dataset.test), record.eval_samples, record.seed)
    return LiveCurve(run, model, lambda: EvalItems.read(model, dataset.test, samples, dataset.train, record.seed),
                     loss_function(record.loss), record.live_share, stop_rules(record.measured),
                     metric_function(record.metric))


def live_share(cfg: RunConfig, provenance: dict[str, Any]) -> float:
    """The share of its time the curve's thread may measure while the run trains (0: no
    thread): as eval_live says; auto is on everywhere, at a trickle where the run's ranks
    fill the host's cores (wall-clock curves are what a time-to-target study measures),
    in full where a core is spare or a target must be seen promptly. Never in the
    simulator with a stop rule, where each point is measured as its snapshot is taken
    (`catch_up`)."""
    if stops_early(cfg) and cfg.backend == "sim" or cfg.eval_live == "off":
        return 0.0
    full = cfg.eval_live == "on" or stops_early(cfg) or spare_core(provenance)
    return LiveCurve.LIVE_SHARE if full else LiveCurve.SHARED_CORE_SHARE


def spare_core(provenance: dict[str, Any]) -> bool:
    """This host has a core more than the run's ranks on it (the simulator is one)."""
    host = socket.gethostname()
    here = sum(1 for rank in provenance.get("ranks", []) if rank.get("host") == host)
    return (os.cpu_count() or 1) > max(here, 1)


def finish_run(run: RunDir, setup: RunSetup, curve: LiveCurve, train_s: float, train_wall_s: float,
               counts: dict[str, Any]) -> dict:
    """The curve's last points and the final weights on the whole test split, then the
    summary; returns it."""
    start = time.perf_counter()
    record = setup.record
    # The clients are done: every core, unless --threads says how many this run may take
    # (a sweep running points side by side gives each its share: more threads than cores
    # made evaluation slower than training).
    torch.set_num_threads(record.threads or len(os.sched_getaffinity(0)))
    live = curve.live
    progress = Progress(curve.pending(), quiet=record.quiet, label="eval", unit="snapshots")
    items = curve.finish(progress.update)
    progress.close()
    config = record.measured
    best = keep_best(run, config) if record.keep_best else {}
    # a target reached counts where it stopped the run short of its steps
    early = curve.reached if curve.reached and counts.get("minibatches", 0) < record.clients * record.steps else None
    reached = {"target_reached": early} if early else {}
    final = final_measurement(run, items, curve.model, setup.dataset.test, curve.loss, record.keep_snapshots,
                              curve.metric)
    metric = {"final_test_metric": final["test_metric"]} if "test_metric" in final else {}
    status = training_status(counts, final, setup.dataset.num_classes)
    if early and status == COMPLETE:
        status = reached_target(early, curve.stopped_by)
    measure = curve_measure(config, final["test_error"])
    good = goodput(run.rows("clients"), windows=record.windows)
    load = server_load(counts.get("server_busy_s"), train_s, record.servers, record.gathers)
    summary = write_result(run, status, final, train_s, record.clock, counts, curve_test_samples=items.samples,
                           curve_points_live=live, **metric, **best, **reached, **good, **load,
                           train_wall_s=train_wall_s, eval_s=time.perf_counter() - start, curve_measure=vars(measure))
    run.close_tap()
    if not record.quiet or ending(status, counts):
        wasted = good["goodput"] is not None and good["goodput"] < 1
        print(f"run {record.out}: {measure.name} {final[measure.key]:.4f} after {summary['minibatches']} "
              f"minibatches in {seconds(train_s, summary['clock'])}"
              + (f", goodput {good['goodput']:.3f}" if wasted else "") + load_note(load, record.servers, record.gathers)
              + ending(status, counts), flush=True)
    return summary


def record_failure(run: RunDir, clock: str, train_s: float, counts: dict[str, Any], error: BaseException,
                   last: bool = True) -> None:
    """The failure as the run's summary (`clock`: VIRTUAL or WALL); `last`: nothing more will
    be written (the tap closes)."""
    write_failure(run, train_s, clock, counts, error)
    if last:
        run.close_tap()
