"""`asgd sweep SPEC.toml`: a grid of runs (clients x n_sync x start x mode x seed), resumable.

    asgd sweep experiments/configs/proxy/fig2.toml [--out DIR] [--jobs N] [--retry-failed] [--only KEY=VALUES]

Each point is one `asgd train` in a process of its own (the simulator, or `mpiexec` per
point), forked from one that imported torch once (experiments/parent/forked.py), with a
timeout, writing its own run directory under DIR/runs/, its config and whole stderr
under DIR/configs/ (ID.toml, ID.stderr; the reason of a failure, its last line, goes
into the index). DIR/index.json lists
the points, their settings and status (`running` while one runs), rewritten atomically
as each starts and ends. The folder is bound to the spec it was started with
(experiments/sweep/folder.py: a later spec may only add points). Run the sweep again
after a kill and it finishes only what is missing: a finished point (complete, diverged,
untrained) is skipped, one with a checkpoint is resumed (`--resume`), one without is
started over; a failed point keeps its reason and is retried only with --retry-failed.
`--only clients=8 --only n_sync=16,64` runs the matching points alone (experiments/sweep/
folder.py, `selected`) and leaves the rest pending: a study's slice first, in its folder.
The sweep holds its folder's lock, each point its run's; the points end with the sweep,
and Ctrl-C or SIGTERM ends the running ones as it ends a run
(`interrupted`, resumed by the next run of the sweep).

The spec and the points it plans are experiments/sweep/spec.py's.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from experiments.parent.forked import Forked
from experiments.parent.supervise import STOP_GRACE_S
from experiments.parent.tree import kill_tree
from experiments.progress import Progress
from experiments.sweep.spec import PlannedPoint, Spec, config_with, run_settings
from runconfig.settings import ConfigError
from rundir.durable import write_json_atomic
from rundir.layout import RunDir
from rundir.status import (FAILED, INTERRUPTED, LOCKED, PENDING, RUNNING, exit_status, failed, finished,
                                       was_interrupted, word)


class SweepRunner:
    """Runs the missing points of a spec into one folder, keeping index.json current."""

    def __init__(self, spec: Spec, out: Path, jobs: int, retry_failed: bool, quiet: bool,
                 only: set[str] | None = None):
        self.spec, self.out, self.retry_failed = spec, out, retry_failed
        self.only = only  # the ids of the points to run (`--only`), None: all
        cores = len(os.sched_getaffinity(0))
        self.jobs = jobs or (cores if spec.backend == "sim" else 1)
        self.threads = max(1, cores // self.jobs)
        self.lock = threading.Lock()
        self.running: dict[str, Forked] = {}  # point id -> its `asgd train`
        self.stopping = False  # Ctrl-C or SIGTERM: start nothing more
        self.index = self._load_index()
        self.progress = Progress(len(only) if only is not None else len(spec.points), quiet=quiet, label="sweep",
                                 unit="points")

    def _load_index(self) -> dict[str, Any]:
        path = self.out / "index.json"
        try:
            old = json.loads(path.read_text()) if path.exists() else {}
            status = {p["id"]: str(p["status"]) for p in old.get("points", [])}
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as error:
            raise ConfigError(f"sweep: cannot read {path} ({type(error).__name__}: {error}); "
                              "remove it to rebuild the index from the runs") from None
        points = [{"id": p.id, **p.settings, "config": run_settings(p.config), "run": f"runs/{p.id}",
                   "status": status.get(p.id, PENDING)} for p in self.spec.points]
        meta = {k: v for k, v in old.items() if k != "points"}
        return {**meta, "name": self.spec.name, "scale": self.spec.scale, "backend": self.spec.backend,
                "window": self.spec.window, **self.spec.meta, "points": points}

    def run(self) -> int:
        for sub in ("runs", "configs"):
            (self.out / sub).mkdir(parents=True, exist_ok=True)
        if self.spec.backend == "sim":
            self._fix_sim_timings()
        entries = {e["id"]: e for e in self.index["points"]}
        wanted = [p for p in self.spec.points if self._wanted(entries[p.id])]  # every point's status from its run
        mine = [p for p in self.spec.points if self.only is None or p.id in self.only]
        todo = [p for p in wanted if self.only is None or p.id in self.only]
        self.progress.update(len(mine) - len(todo))
        self._save()
        with ThreadPoolExecutor(self.jobs) as pool:
            futures = [pool.submit(self._run_point, point) for point in todo]
            try:
                for future in futures:
                    future.result()
            except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (cli.Interrupted)
                self._stop()
                self.progress.close()
                print(f"asgd: sweep {self.out} interrupted; run the same command again to go on",
                      file=sys.stderr)
                return 130
        self.progress.close()
        failed = [e["id"] for e in self.index["points"]
                  if (self.only is None or e["id"] in self.only) and not finished(e["status"])]
        return 1 if failed else 0

    def _wanted(self, entry: dict[str, Any]) -> bool:
        run = RunDir(self.out / entry["run"])
        if run.finished():
            entry["status"] = run.status()
            return False
        return word(entry["status"]) != FAILED or self.retry_failed

    def _fix_sim_timings(self) -> None:
        """One step and push time for every point of the measured cost profile, measured
        once and kept in index.json (a point's own sim_* keys and other profiles' values
        stand). The push is one server's whole vector: a point with sharded servers times
        its slice's itself, unless its spec gives it; with servers auto, the one server's
        push is what the count is picked from."""
        measured = [p for p in self.spec.points if p.config.sim_profile == "measured"]
        if not measured:
            return
        if "sim_step_time" not in self.index:
            from experiments.sim.costs import measure_timing
            step, push = measure_timing(config_with(measured[-1].config, {"servers": 1}), self.threads)
            self.index.update(sim_step_time=step, sim_apply_time=push)
        base = {"sim_step_time": self.index["sim_step_time"], "sim_apply_time": self.index["sim_apply_time"]}
        points = [PlannedPoint(p.id, p.settings, config_with(p.config, {
                      k: getattr(p.config, k) or v for k, v in base.items()
                      if k == "sim_step_time" or p.config.servers in (1, "auto")}))
                  if p.config.sim_profile == "measured" else p for p in self.spec.points]
        self.spec = Spec(self.spec.name, self.spec.scale, self.spec.backend, self.spec.timeout, self.spec.window,
                         points, self.spec.meta)

    def _stop(self) -> None:
        """End the running points as Ctrl-C ends a run (each records `interrupted` and can
        resume), and wait for them; start no other."""
        with self.lock:
            self.stopping = True
            running = list(self.running.values())
        for proc in running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
        for proc in running:
            try:
                proc.wait(timeout=2 * STOP_GRACE_S)
            except (subprocess.TimeoutExpired, KeyboardInterrupt):
                kill_tree(proc.pid)

    def _run_point(self, point: PlannedPoint) -> str:
        if self.stopping:
            return PENDING
        run = self.out / "runs" / point.id
        if RunDir(run).checkpoint_path.exists():
            # this sweep's thread share, not the one it was started with: more torch
            # threads than cores slow every point by far more than their share
            command = ["train", "--resume", str(run), "--quiet", "--threads", str(self.threads)]
        else:
            shutil.rmtree(run, ignore_errors=True)
            config = self.out / "configs" / f"{point.id}.toml"
            config.write_text(_toml(config_with(point.config, {"threads": self.threads}).to_dict()))
            command = ["train", str(config), "--out", str(run), "--quiet"]
        # mpi points launch themselves (under the supervisor, which names a dead rank)
        status = self._execute(point.id, command, run)
        with self.lock:
            self._entry(point.id)["status"] = status
            if finished(status):  # epochs in the figures need the training-set size
                self.index["train_size"] = RunDir(run).record("config")["train_size"]
            self._save()
            self.progress.update(self.progress.done + 1)
        return status

    def _execute(self, point: str, argv: list[str], run: Path) -> str:
        """Run one point, ending with this process (experiments/parent/forked.py); its
        status: the run's own when it ran to its end, `interrupted` or `locked: ...` (both
        tried again on the next run of the sweep), or failed with the reason."""
        with self.lock:
            if self.stopping:
                return PENDING
            proc = Forked("experiments.cli", argv, self.out / "configs" / f"{point}.stderr")
            self.running[point] = proc
            self._entry(point)["status"] = RUNNING  # the index is true while the sweep runs
            self._save()
        try:
            code = proc.wait(timeout=self.spec.timeout)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)  # mpiexec's ranks end with it
            proc.wait()
            return failed(f"timeout after {self.spec.timeout:g} s")
        finally:
            with self.lock:
                self.running.pop(point, None)
        record = RunDir(run)
        if record.finished() and code == exit_status(record.status()):  # diverged exits non-zero
            return record.status()
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        last = lines[-1].strip() if lines else "no message"
        if code == 130 or self.stopping or was_interrupted(record.status()):
            return INTERRUPTED
        if (holder := record.lock().holder()) is not None:
            return f"{LOCKED}: {holder}"
        return failed(f"exit {code}: {last}")

    def _entry(self, point: str) -> dict[str, Any]:
        return next(e for e in self.index["points"] if e["id"] == point)

    def _save(self) -> None:
        write_json_atomic(self.out / "index.json", self.index)


def _toml(values: dict[str, Any]) -> str:
    """A flat TOML table of plain values (None means: leave the key out)."""
    skip = {"out", "resume", "quiet"}
    return "".join(f"{key} = {json.dumps(value)}\n" for key, value in values.items()
                   if value is not None and key not in skip)
