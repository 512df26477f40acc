"""What the server decided, as `handle()` (paramserver/handler.py) returns it: the events
the Recorder (paramserver/recorder.py) turns into log rows, snapshots and checkpoints, in
the order they happened. Kept apart from the handler so the recorder and the drivers name
what happened without reading how it was decided.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class Applied:
    """A push was applied: a server.jsonl row."""

    client: int
    version: int
    staleness: int
    apply_s: float


@dataclass(frozen=True)
class Rejected:
    """A message was refused, and why: a server.jsonl row."""

    client: int | None
    rank: int
    reason: str


@dataclass(frozen=True)
class Dropped:
    """A push too stale for the rule was left out (not an error): a server.jsonl row."""

    client: int
    staleness: int
    reason: str


@dataclass(frozen=True)
class NoiseMeasured:
    """A window of the gradient noise scale closed: a server.jsonl row. `fresh_batch`:
    the step size the fresh rule gathers from now on (None: another rule); `gain`: the lr
    multiplier of such a step under adascale from now on (None: another scaling);
    `grad_norm`: the norm of the window's mean gradient (at equal speeds, `fresh`'s
    step's), the curve on which a loss spike shows first (docs/results/notes.md)."""

    samples: int
    noise_scale: float | None
    fresh_batch: int | None
    gain: float | None = None
    grad_norm: float | None = None


@dataclass(slots=True)
class ClientRows:
    """A push's minibatch rows (clients.jsonl); `minibatches`: the run's count after them."""

    rows: list[dict[str, Any]]
    minibatches: int


@dataclass(frozen=True)
class SnapshotDue:
    """The version reached a multiple of eval_every: snapshot, and checkpoint unless it
    waits for the clients' optimizer states (`CheckpointDue` then)."""

    version: int
    checkpoint: bool = True


@dataclass(frozen=True)
class CheckpointDue:
    """A checkpoint without a curve point: every client still in the run has brought its
    optimizer state since one was asked for, or `checkpoint_every` passed (none to wait for)."""

    version: int


@dataclass(frozen=True)
class Joined:
    """A process joined the running job as client `client` (a new number) at `version`:
    a server.jsonl row and an entry of the summary's `joined_clients`. `spare_for`: the
    lost client an admitted spare rank stands in for (None: not a spare)."""

    client: int
    rank: int
    host: str
    version: int
    spare_for: int | None = None


@dataclass(frozen=True)
class JoinRefused:
    """A JOIN the server refused (wrong secret, full, finished, not joinable, malformed),
    which changed nothing: a server.jsonl row, and a line on the console."""

    rank: int
    host: str
    reason: str


Event = Applied | Rejected | Dropped | NoiseMeasured | ClientRows | SnapshotDue | CheckpointDue | Joined | JoinRefused
