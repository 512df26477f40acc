"""The parameter server's state: weights, version, staleness; no MPI inside.

The weights are one flat float32 vector. Each applied push bumps `version` by one.
The staleness of a push is the number of other pushes applied since the pushing client
last pulled: `version (before this apply) - version that client last pulled`. A push
that is malformed (wrong length or dtype, NaN or Inf) is rejected before it can touch
the weights, and counted.

The weights are a torch tensor where `server_device` says (paramserver/arrays.py: on
the CPU it shares a numpy vector's memory), updated by the rule's torch arithmetic.
Outside the Store they are always a host float32 vector (`weights`), so the server loop
does not care where they live. The staleness of a push is known before its apply,
because a rule may depend on it. On a GPU with cupy installed each apply is one fused
kernel (paramserver/fused.py) whose flag does the NaN/Inf check, and it writes new
weights beside the old: `array` is then a different tensor after each accepted push.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
import numpy as np

from paramserver import fused
from paramserver.arrays import ServerArrays
from paramserver.rules import Rule


@dataclass(frozen=True)
class ApplyResult:
    accepted: bool
    version: int          # the version after this push (unchanged if rejected)
    staleness: int
    reason: str = ""      # why it was rejected


class Store:
    """Weights plus the bookkeeping the server needs to serve clients in any order."""

    def __init__(self, weights: np.ndarray, rule: Rule, version: int = 0,
                 backend: ServerArrays | None = None):
        self.backend = backend or ServerArrays()
        self.array = self.backend.adopt(weights)  # the weights, where the backend keeps them
        self.rule = rule
        self.fused = fused.for_store(self.backend, rule)  # None: the rule's torch arithmetic
        self.version = version
        self.pulled: dict[int, int] = {}
        self.applied: Counter[int] = Counter()
        self.rejected: Counter[int] = Counter()
        self.staleness: Counter[int] = Counter()

    @property
    def size(self) -> int:
        return self.array.shape[0]

    @property
    def weights(self) -> np.ndarray:
        """The weights as a host float32 vector: on the host the live array, from a GPU a
        reused pinned buffer. Not a copy of its own: use it before the next apply or read."""
        return self.backend.stage(self.array)

    def pull(self, client: int) -> tuple[np.ndarray, int]:
        """The weights to send (`weights`: send them before the next apply) and their
        version; remembers what `client` now holds."""
        self.pulled[client] = self.version
        self.rule.pulled(client, self.array)
        return self.weights, self.version

    def check(self, push: np.ndarray, finite: bool = True) -> str:
        """Why `push` must be rejected, or "" if it is fine (NaN and Inf only if `finite`)."""
        if push.dtype != np.float32:
            return f"dtype {push.dtype}, expected float32"
        if push.size != self.size:
            return f"length {push.size}, expected {self.size}"
        # A NaN or Inf anywhere makes the dot product non-finite; one BLAS pass is the
        # cheapest read of the vector (a float64 sum costs 5x). Huge finite values can
        # overflow it too, so only then look element by element.
        with np.errstate(over="ignore"):
            if finite and not np.isfinite(np.dot(push, push)) and not np.isfinite(push).all():
                return "contains NaN or Inf"
        return ""

    def apply(self, client: int, push: np.ndarray) -> ApplyResult:
        staleness = self.version - self.pulled.get(client, 0)
        reason = self.check(push, finite=self.fused is None)
        if not reason and self.fused:
            weights = self.fused.apply(self.array, self.backend.upload(push), client, staleness)
            if weights is None:
                reason = "contains NaN or Inf"
            else:
                self.array = weights
        elif not reason:
            self.rule.apply(self.array, self.backend.upload(push), client, staleness)
        if reason:
            self.rejected[client] += 1
            return ApplyResult(False, self.version, staleness, reason)
        self.version += 1
        self.applied[client] += 1
        self.staleness[staleness] += 1
        return ApplyResult(True, self.version, staleness)

    def staleness_stats(self) -> dict:
        total = sum(self.staleness.values())
        values = np.repeat(list(self.staleness), list(self.staleness.values())) if total else np.zeros(1)
        return {
            "mean": float(values.mean()),
            "max": int(values.max()),
            "p50": float(np.percentile(values, 50)),
            "p90": float(np.percentile(values, 90)),
            "histogram": {str(k): v for k, v in sorted(self.staleness.items())},
        }

    def state(self) -> dict[str, np.ndarray]:
        """Arrays for a checkpoint (no objects, so it loads without pickle)."""
        arrays = {"weights": self.weights, "version": np.array(self.version)}
        arrays.update({f"rule.{k}": self.backend.export(v) for k, v in self.rule.state().items()})
        for name in ("pulled", "applied", "rejected", "staleness"):
            arrays[f"store.{name}"] = np.array(sorted(dict(getattr(self, name)).items()), np.int64).reshape(-1, 2)
        return arrays

    def load_state(self, arrays: dict[str, np.ndarray]) -> None:
        weights = arrays["weights"]
        if weights.shape != (self.size,):
            raise ValueError(f"checkpoint holds {weights.size} weights, the model has {self.size}")
        self.backend.load(self.array, weights)
        self.version = int(arrays["version"])
        self.rule.load_state({k[5:]: self.backend.adopt(v) for k, v in arrays.items() if k.startswith("rule.")})
        self.pulled = {int(k): int(v) for k, v in arrays["store.pulled"]}
        for name in ("applied", "rejected", "staleness"):
            setattr(self, name, Counter({int(k): int(v) for k, v in arrays[f"store.{name}"]}))
