"""The run directory, the only link between training and analysis.

    runs/<name>/
      config.json      resolved config + provenance          (written once, atomically)
      clients.jsonl    one row per client minibatch           (appended, flushed)
      server.jsonl     one row per push the server handled     (appended, flushed)
      eval.jsonl       test error/loss at regular versions     (appended after training)
      snapshots/       weights at those versions, for eval     (removed after eval, folder and all)
      checkpoint/latest.npz  weights, rule state, version      (atomic, no pickle)
      summary.json     results and status                      (written last, atomically)
      door.json        where and how to join the running job  (--joinable over MPI; owner only;
                                                                removed when the server stops serving)
      lock             who writes the run now (host, pid)     (flock; removed when released)

Only the server's rank writes here; clients ship their rows inside their pushes. One
job at a time: whoever writes a run (or a sweep folder) holds its `FolderLock`, which
the OS releases when the holder dies, so a second writer is refused in one line.
`RunDir` is also the one reader of a run directory (`record`, `summary`, `status`,
`rows`): plots, sweeps, the supervisor, resume and the bench all read through it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import numpy as np

from rundir.durable import JsonlWriter, read_jsonl, save_arrays, write_json_atomic
from rundir.lock import LOCK, FolderLock, RunDirError
from rundir.status import finished

DOOR = "door.json"


class RunDir:
    """`tap`: also called with (log, rows) for every row written through `writer` (the
    TensorBoard scalars of `--tensorboard`); `close_tap` ends it."""

    def __init__(self, path: str | Path, tap: Callable[[str, list[dict[str, Any]]], None] | None = None):
        self.path = Path(path)
        self.tap = tap

    def create(self) -> None:
        """Make a fresh run directory; never write over an earlier run's results."""
        if not self.empty():
            raise RunDirError(f"out: {self.path} already holds a run; choose another --out")
        try:
            for sub in ("", "checkpoint"):
                (self.path / sub).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RunDirError(f"out: cannot create {self.path} ({e.strerror})") from None

    def empty(self) -> bool:
        """Nothing here yet but, perhaps, the lock of the job about to write it."""
        return not self.path.exists() or (self.path.is_dir() and all(p.name == LOCK for p in self.path.iterdir()))

    def lock(self) -> FolderLock:
        return FolderLock(self.path)

    def writer(self, log: str, lines: int = 0, flush_every: float = 0.0) -> JsonlWriter:
        tap = self.tap
        return JsonlWriter(self.path / f"{log}.jsonl", lines, None if tap is None else lambda rows: tap(log, rows),
                           flush_every)

    def close_tap(self) -> None:
        if self.tap is not None and hasattr(self.tap, "close"):
            self.tap.close()

    def write_config(self, config: dict[str, Any]) -> None:
        write_json_atomic(self.path / "config.json", config)

    def open_door(self, door: dict[str, Any]) -> None:
        """Tell joiners where server 0 listens and the secret to show (`asgd join`):
        readable by the run's owner alone."""
        write_json_atomic(self.path / DOOR, door, private=True)

    def close_door(self) -> None:
        (self.path / DOOR).unlink(missing_ok=True)

    @property
    def door_path(self) -> Path:
        return self.path / DOOR

    @property
    def checkpoint_path(self) -> Path:
        """Where the run's checkpoint lives (rundir/checkpoint.py owns its format)."""
        return self.path / "checkpoint" / "latest.npz"

    @property
    def best_path(self) -> Path:
        """The weights of the curve's best point (`keep_best`): a snapshot's format."""
        return self.path / "checkpoint" / "best.npz"

    def record(self, name: str) -> dict[str, Any]:
        """A JSON object the run wrote (`config`, `summary`): {} when it has not been
        written, RunDirError (one line) when it is damaged or not an object."""
        path = self.path / f"{name}.json"
        try:
            record = json.loads(path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as error:
            raise RunDirError(f"cannot read {path} ({error})") from None
        if not isinstance(record, dict):
            raise RunDirError(f"{path} is not a JSON object")
        return record

    def summary(self) -> dict[str, Any]:
        return self.record("summary")

    def status(self) -> str | None:
        """The summary's status (`complete`, `failed: ...`); None without a readable one."""
        try:
            status = self.summary().get("status")
        except RunDirError:
            return None
        return status if isinstance(status, str) else None

    def finished(self) -> bool:
        """The run ran to its end (`complete`, `diverged: why`, `untrained: why`): nothing to resume."""
        return finished(self.status())

    def rows(self, log: str) -> list[dict[str, Any]]:
        """The rows of `log`.jsonl (clients, server, eval, warm_start); [] before it exists."""
        path = self.path / f"{log}.jsonl"
        return list(read_jsonl(path)) if path.exists() else []

    def save_snapshot(self, weights: np.ndarray, version: int, time: float, minibatches: int) -> None:
        """No folder is made ahead: the write makes it, so a run whose snapshots were all
        evaluated (and dropped) has none, and a resume that extends it gets it back."""
        meta = np.array([time, minibatches], dtype=np.float64)
        save_arrays(self.snapshot_dir / f"v{version:09d}.npz", {"weights": weights, "meta": meta})

    def drop_snapshot(self, path: Path) -> None:
        """With the last snapshot goes its folder: a finished run keeps no empty `snapshots/`."""
        path.unlink()
        if not any(self.snapshot_dir.iterdir()):
            self.snapshot_dir.rmdir()

    @property
    def snapshot_dir(self) -> Path:
        return self.path / "snapshots"

    def snapshots(self) -> list[tuple[int, Path]]:
        """(version, path) of every snapshot, oldest first."""
        return sorted((int(p.stem[1:]), p) for p in self.snapshot_dir.glob("v*.npz"))
