"""The parts of a run's record that every mode shares: open, evaluate, summarise, fail.

The summary is written last, and on failure too (`status: failed: reason`), so a run
directory always says whether its results are complete.
"""
from __future__ import annotations

import math
import os
import time
import traceback
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from clients.data import Dataset
from clients.evaluate import curve_samples, evaluate_snapshots
from clients.usercode import loss_function
from experiments.inputs import fingerprint
from experiments.progress import Progress
from paramserver.config import RunConfig
from paramserver.rundir.layout import RunDir


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


def eval_every(cfg: RunConfig, events: int) -> int:
    """About 20 evaluations over `events` versions (or steps) unless the config sets it."""
    return cfg.eval_every or max(1, events // 20)


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
                      "momentum_used": round(setup.cfg.client_momentum(setup.clients), 6),
                      "num_params": setup.weights.size, "train_size": len(setup.dataset.train),
                      "data_fingerprint": fingerprint(setup.dataset), "provenance": setup.provenance})
    if setup.warm_rows:
        with run.writer("warm_start") as log:
            log.write_many(setup.warm_rows)
    return run


def finish_run(run: RunDir, setup: RunSetup, train_s: float, train_wall_s: float, counts: dict[str, Any]) -> dict:
    """Evaluate the snapshots and write the summary; returns it."""
    start = time.perf_counter()
    # The clients are done: every core, unless --threads says how many this run may take
    # (a sweep running points side by side gives each its share: more threads than cores
    # made evaluation slower than training).
    torch.set_num_threads(setup.cfg.threads or len(os.sched_getaffinity(0)))
    model = setup.model.to(setup.device)
    cfg, test = setup.cfg, setup.dataset.test
    samples = curve_samples(len(test), cfg.eval_samples, cfg.seed)
    progress = Progress(len(run.snapshots()), quiet=cfg.quiet, label="eval", unit="snapshots")
    _, final = evaluate_snapshots(run, model, test, samples, keep=cfg.keep_snapshots, loss=loss_function(cfg.loss),
                                  train=setup.dataset.train, seed=cfg.seed, progress=progress.update)
    progress.close()
    status = run_status(counts, final, setup.dataset.num_classes)
    summary = {"status": status, "final_test_error": final.get("test_error"),
               "final_test_loss": final.get("test_loss"), "final_test_samples": final.get("samples"),
               "curve_test_samples": len(samples), **_timing(train_s, counts),
               "train_wall_s": train_wall_s, "eval_s": time.perf_counter() - start, **counts}
    run.write_summary(summary)
    run.close_tap()
    if not setup.cfg.quiet or status != "complete":
        print(f"run {setup.out}: test error {summary['final_test_error']:.4f} after {summary['minibatches']} "
              f"minibatches in {train_s:.1f} s" + ("" if status == "complete" else f"; {status}"), flush=True)
    return summary


def run_status(counts: dict[str, Any], final: dict[str, Any], classes: int | None) -> str:
    """`complete`, unless the run did not train: `diverged` when most pushes were refused
    (not finite, or malformed) or the final weights give no finite loss, `untrained` when
    a classifier's final test error cannot be told from chance (within two standard
    errors of guessing, on the samples evaluated)."""
    rejected, applied = counts.get("pushes_rejected", 0), counts.get("pushes_applied")
    if applied is not None and rejected > applied:
        return f"diverged: {rejected} of {rejected + applied} pushes rejected (not finite or malformed)"
    if not final:
        return "complete"
    if not math.isfinite(final["test_loss"]):
        return f"diverged: the final weights give a test loss of {final['test_loss']}"
    if not classes or not math.isfinite(final["test_error"]):  # not a classifier (a user's loss)
        return "complete"
    chance = 1 - 1 / classes
    margin = 2 * math.sqrt(chance * (1 - chance) / final["samples"])
    if final["test_error"] >= chance - margin:
        return (f"untrained: final test error {final['test_error']:.3f} is chance level ({chance:.3f} for "
                f"{classes} classes, within {margin:.3f} on {final['samples']} test samples)")
    return "complete"


def record_failure(run: RunDir, train_s: float, counts: dict[str, Any], error: BaseException) -> None:
    run.write_summary({"status": failure_status(error), "final_test_error": None, **_timing(train_s, counts),
                       **counts})
    run.close_tap()


def failure_status(error: BaseException) -> str:
    if isinstance(error, KeyboardInterrupt):  # Ctrl-C, or SIGTERM (cli.Interrupted)
        return f"failed: interrupted{f' ({error})' if str(error) else ''}"
    return f"failed: {type(error).__name__}: {error}"


def log_traceback(out: str, error: BaseException, who: str) -> str:
    """Append `error`'s traceback to the run directory's error.log (where that directory
    is reachable); where it went, for the one line that names the failure."""
    path = Path(out) / "error.log"
    text = "".join(traceback.format_exception(error))
    try:
        with open(path, "a", encoding="utf-8") as log:
            log.write(f"--- {who}, {time.strftime('%F %T')}\n{text}")
    except OSError:
        return "the traceback could not be saved: rerun with --debug"
    return f"traceback in {path}"


def _timing(train_s: float, counts: dict[str, Any]) -> dict[str, Any]:
    samples = counts.get("samples", 0)
    return {"time_s": train_s, "throughput_samples_per_s": samples / train_s if train_s > 0 else None}
