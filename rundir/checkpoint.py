"""The checkpoint: what a run goes on from after a crash, and the one owner of its format.

`checkpoint/latest.npz` in the run directory holds flat arrays only, so it loads without
pickle, with the SHA-256 of every array checked on load (rundir/durable.py): the
weights and their version, the run's clock, the rows of the two logs it accounts for,
the tallies, in an async run the Store's own arrays (each client's pulled version,
the counters, the rule's state) and DyLU's measured speeds, and the clients' optimizer state: one for all in a
sync run (they step alike), each client's own in async and local-sgd runs, and
local-sgd's outer momentum. Every mode
writes this one type; resume reads it.
"""
from __future__ import annotations

import zipfile
from dataclasses import dataclass, field

import numpy as np

from rundir.durable import CorruptFile, load_arrays, save_arrays
from rundir.layout import RunDir

OWN = ("weights", "version", "time", "lines", "tally.counts", "tally.client_steps", "tally.client_pushes")
OPTIMIZER = "optimizer."  # the prefix of the clients' optimizer state's arrays
CLIENT_OPTIMIZER = "client_optimizer."  # of one client's: client_optimizer.I.NAME
OUTER = "outer."  # of local-sgd's outer step (clients/outer.py): its momentum


@dataclass
class Checkpoint:
    weights: np.ndarray
    version: int
    time: float                      # the run's clock at this point
    lines: tuple[int, int]           # rows of server.jsonl and clients.jsonl it accounts for
    counts: tuple[int, int, int]     # minibatches, samples, rejected pushes
    client_steps: np.ndarray         # each client's step at its last handled push
    client_pushes: np.ndarray        # each client's pushes handled
    store: dict[str, np.ndarray] = field(default_factory=dict)  # the server's arrays (async runs: the Store's, DyLU's)
    # the clients' optimizer state where every client's is the same (sync mode: each
    # steps with the same averaged gradient), as `ClientOptimizer.state_arrays` names it
    optimizer: dict[str, np.ndarray] = field(default_factory=dict)
    # client -> its own optimizer state, at the step `client_steps` records for it
    client_optimizers: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    outer: dict[str, np.ndarray] = field(default_factory=dict)  # local-sgd's outer step's state

    def save(self, run: RunDir) -> None:
        """Atomically: a crash mid-write leaves the previous checkpoint whole."""
        own = {f"{CLIENT_OPTIMIZER}{c}.{k}": v
               for c, arrays in self.client_optimizers.items() for k, v in arrays.items()}
        save_arrays(run.checkpoint_path, {
            **self.store, **{OPTIMIZER + k: v for k, v in self.optimizer.items()}, **own,
            **{OUTER + k: v for k, v in self.outer.items()},
            "weights": self.weights, "version": np.array(self.version), "time": np.array(self.time),
            "lines": np.array(self.lines, np.int64), "tally.counts": np.array(self.counts, np.int64),
            "tally.client_steps": np.asarray(self.client_steps, np.int64),
            "tally.client_pushes": np.asarray(self.client_pushes, np.int64)})

    @staticmethod
    def verify(run: RunDir) -> None:
        """Every array whole (their SHA-256): CorruptFile, one line naming the file, if not."""
        load_arrays(run.checkpoint_path, checksummed=True)

    @classmethod
    def load(cls, run: RunDir) -> "Checkpoint":
        """The run's checkpoint, verified: CorruptFile when damaged or missing a part."""
        arrays = load_arrays(run.checkpoint_path, checksummed=True)
        missing = [key for key in OWN if key not in arrays]
        if missing:
            raise CorruptFile(f"{run.checkpoint_path}: not a checkpoint of this tool (no {missing[0]!r})")
        own: dict[int, dict[str, np.ndarray]] = {}
        for key, value in arrays.items():
            if key.startswith(CLIENT_OPTIMIZER):
                client, _, name = key[len(CLIENT_OPTIMIZER):].partition(".")
                own.setdefault(int(client), {})[name] = value
        return cls(arrays["weights"], int(arrays["version"]), float(arrays["time"]),
                   (int(arrays["lines"][0]), int(arrays["lines"][1])),
                   tuple(int(n) for n in arrays["tally.counts"]),
                   arrays["tally.client_steps"], arrays["tally.client_pushes"],
                   {k: v for k, v in arrays.items()
                    if k not in OWN and not k.startswith((OPTIMIZER, CLIENT_OPTIMIZER, OUTER))},
                   {k[len(OPTIMIZER):]: v for k, v in arrays.items() if k.startswith(OPTIMIZER)}, own,
                   {k[len(OUTER):]: v for k, v in arrays.items() if k.startswith(OUTER)})

    @staticmethod
    def reached(run: RunDir) -> tuple[int, int] | None:
        """(minibatches, clients.jsonl rows) the checkpoint accounts for, read without its
        weights or checksum (a console line's, after a run stopped short); None if unreadable."""
        try:
            with np.load(run.checkpoint_path, allow_pickle=False) as arrays:
                return int(arrays["tally.counts"][0]), int(arrays["lines"][1])
        except (OSError, KeyError, ValueError, IndexError, EOFError, zipfile.BadZipFile):
            return None

    @property
    def store_state(self) -> dict[str, np.ndarray]:
        """What `Store.load_state` takes."""
        return {**self.store, "weights": self.weights, "version": np.array(self.version)}


def save_point(run: RunDir, point: Checkpoint, resumable: bool = True, evaluated: bool = True) -> None:
    """The point's weights as a snapshot (for the test error, at its version and time:
    `evaluated`) and, where the run could go on from it, as the checkpoint: every mode
    records so."""
    if evaluated:
        run.save_snapshot(point.weights, point.version, point.time, point.counts[0])
    if resumable:
        point.save(run)
