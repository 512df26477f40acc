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
from paramserver.settings import Mode


@dataclass(frozen=True)
class RunSetup:
    """What either backend hands to the rank that records the run."""

    cfg: RunConfig
    out: str
    clients: int
    model: nn.Module        # evaluates the snapshots after training
    weights: np.ndarray     # the initial weights
    dataset: Dataset
    device: str
    provenance: dict[str, Any]
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
    cfg = setup.cfg
    if cfg.eval_every:
        return cfg.eval_every
    point = len(curve_samples(len(setup.dataset.test), cfg.eval_samples, cfg.seed)) + \
        (RECALIBRATE_SAMPLES if has_running_stats(setup.model) else 0)
    trained = setup.clients * cfg.steps * cfg.batch_size * FORWARDS_A_SAMPLE
    points = max(2, min(CURVE_POINTS, int(CURVE_SHARE * trained / point)))
    return max(1, events // points)


def record_dir(setup: RunSetup) -> RunDir:
    """The run directory the recording process writes, feeding TensorBoard with `--tensorboard`."""
    if not setup.cfg.tensorboard:
        return RunDir(setup.out)
    from experiments.tensorboard import Scalars
    return RunDir(setup.out, tap=Scalars.for_run(setup.out, setup.cfg.to_dict() | {"clients": setup.clients}))


def open_run(setup: RunSetup, every: int) -> RunDir:
    run = record_dir(setup)
    run.create()
    run.write_config({**setup.cfg.to_dict(), "out": setup.out, "clients": setup.clients, "eval_every": every,
                      "momentum_used": round(setup.cfg.client_momentum(setup.clients), 6), **_outer(setup.cfg),
                      **setup.cfg.rule_settings_used,
                      **_speeds(setup),
                      **metric_traits(setup.cfg.metric), "num_params": setup.weights.size,
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


def measured_config(cfg: RunConfig) -> dict[str, Any]:
    """The run's config with its metric's name and direction, as config.json records them:
    what rundir/measure.py decides the curve's measure and stop rules from."""
    return {**cfg.to_dict(), **metric_traits(cfg.metric)}


def stops_early(cfg: RunConfig) -> bool:
    """The run has a stop rule (stop_at_error, stop_at_loss or stop_at_metric)."""
    return bool(stop_rules(cfg.to_dict()))


def _speeds(setup: RunSetup) -> dict[str, Any]:
    """Each client's speed (clients/stragglers.py), where they are uneven: `speeds_used`."""
    cfg = setup.cfg
    speeds = client_speeds(cfg.seed, setup.clients, cfg.speed_spread, cfg.client_speeds)
    return {"speeds_used": speeds} if any(s != 1.0 for s in speeds) else {}


def live_curve(run: RunDir, setup: RunSetup) -> LiveCurve:
    """The test curve measured while the run trains, on a model of its own (the clients of
    this process step theirs)."""
    cfg, dataset = setup.cfg, setup.dataset
    model = copy.deepcopy(setup.model).to(setup.device)
    samples = curve_samples(len(dataset.test), cfg.eval_samples, cfg.seed)
    return LiveCurve(run, model, lambda: EvalItems.read(model, dataset.test, samples, dataset.train, cfg.seed),
                     loss_function(cfg.loss), live_share(cfg, setup.provenance), stop_rules(measured_config(cfg)),
                     metric_function(cfg.metric))


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
    # The clients are done: every core, unless --threads says how many this run may take
    # (a sweep running points side by side gives each its share: more threads than cores
    # made evaluation slower than training).
    torch.set_num_threads(setup.cfg.threads or len(os.sched_getaffinity(0)))
    cfg = setup.cfg
    live = curve.live
    progress = Progress(curve.pending(), quiet=cfg.quiet, label="eval", unit="snapshots")
    items = curve.finish(progress.update)
    progress.close()
    config = measured_config(cfg)
    best = keep_best(run, config) if cfg.keep_best else {}
    # a target reached counts where it stopped the run short of its steps
    early = curve.reached if curve.reached and counts.get("minibatches", 0) < setup.clients * cfg.steps else None
    reached = {"target_reached": early} if early else {}
    final = final_measurement(run, items, curve.model, setup.dataset.test, curve.loss, cfg.keep_snapshots,
                              curve.metric)
    metric = {"final_test_metric": final["test_metric"]} if "test_metric" in final else {}
    status = training_status(counts, final, setup.dataset.num_classes)
    if early and status == COMPLETE:
        status = reached_target(early, curve.stopped_by)
    measure = curve_measure(config, final["test_error"])
    good = goodput(run.rows("clients"), windows=cfg.mode == Mode.ASYNC)
    gathers = rule_class(cfg.rule).gathers
    load = server_load(counts.get("server_busy_s"), train_s, cfg.servers, gathers)
    summary = write_result(run, status, final, train_s, run_clock(cfg), counts, curve_test_samples=items.samples,
                           curve_points_live=live, **metric, **best, **reached, **good, **load,
                           train_wall_s=train_wall_s, eval_s=time.perf_counter() - start, curve_measure=vars(measure))
    run.close_tap()
    if not setup.cfg.quiet or ending(status, counts):
        wasted = good["goodput"] is not None and good["goodput"] < 1
        print(f"run {setup.out}: {measure.name} {final[measure.key]:.4f} after {summary['minibatches']} "
              f"minibatches in {seconds(train_s, summary['clock'])}"
              + (f", goodput {good['goodput']:.3f}" if wasted else "") + load_note(load, cfg.servers, gathers)
              + ending(status, counts), flush=True)
    return summary


def record_failure(run: RunDir, cfg: RunConfig, train_s: float, counts: dict[str, Any], error: BaseException,
                   last: bool = True) -> None:
    """The failure as the run's summary; `last`: nothing more will be written (the tap closes)."""
    write_failure(run, train_s, run_clock(cfg), counts, error)
    if last:
        run.close_tap()


def run_clock(cfg: RunConfig) -> str:
    """What the run's seconds are: the simulator counts virtual ones, so its times and
    throughput compare with no MPI run's."""
    return VIRTUAL if cfg.backend == "sim" else WALL
