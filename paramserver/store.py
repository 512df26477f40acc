"""The parameter server's state: weights, version, staleness; no MPI inside.

The weights are one flat float32 vector. Each applied push bumps `version` by one.
The staleness of a push is the number of other pushes applied since the pushing client
last pulled: `version (before this apply) - version that client last pulled`. A push
that is malformed (wrong length or dtype, NaN or Inf) is rejected before it can touch
the weights, and counted.

The weights are a torch tensor where `server_device` says (paramserver/compute/arrays.py: on
the CPU it shares a numpy vector's memory), updated by the rule's torch arithmetic.
Outside the Store they are always a host float32 vector (`weights`), so the server loop
does not care where they live. The staleness of a push is known before its apply,
because a rule may depend on it. By default each apply is the rule's fused formula as
one kernel that does the NaN/Inf check too: on the host compiled by g++, where it is
found, updating in place once the push is checked (paramserver/compute/hostkernel.py); on a GPU
with cupy installed a cupy kernel that writes new weights beside the old, so `array`
is then a different tensor after each accepted push (paramserver/compute/fused.py). With
`server_kernel = "torch"` (or neither) the rule's torch arithmetic runs, in place.

A rule may gather pushes before it steps (`fresh`): the version then moves only with a
step, and a push too stale for it is dropped, which is counted (`dropped`) and changes
nothing else. Where pushes are gradients, each accepted one also feeds the rule's
gradient noise scale (paramserver/noise.py).
"""
from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import dataclass

import numpy as np

from paramserver.compute import fused, hostkernel
from paramserver.compute.arrays import ServerArrays
from paramserver.rules.base import PushFacts, Rule


@dataclass(slots=True)
class ApplyResult:
    accepted: bool
    version: int          # the version after this push (unchanged if rejected)
    staleness: int
    reason: str = ""      # why it was rejected
    dropped: bool = False   # too stale for the rule: left out, not an error
    gathered: bool = False  # taken in, but the step it is part of is not taken yet
    measured: bool = False  # it closed a window of the gradient noise scale


class Store:
    """Weights plus the bookkeeping the server needs to serve clients in any order."""

    def __init__(self, weights: np.ndarray, rule: Rule, version: int = 0,
                 backend: ServerArrays | None = None, kernel: str = "auto"):
        self.backend = backend or ServerArrays()
        self.array = self.backend.adopt(weights)  # the weights, where the backend keeps them
        self.rule = rule
        self.fused = kernel_path(self.backend, rule, kernel)  # None: the rule's torch arithmetic
        self.version = version
        self.pulled: dict[int, int] = {}
        self.applied: Counter[int] = Counter()
        self.dropped: Counter[int] = Counter()
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

    def check(self, push: np.ndarray, piece: slice | None = None) -> str:
        """Why `push` (for the weights' `piece`, or all of them) must be rejected for its
        shape, or "" if it fits."""
        size = self.size if piece is None else piece.stop - piece.start
        if push.dtype != np.float32:
            return f"dtype {push.dtype}, expected float32"
        if push.size != size:
            return f"length {push.size}, expected {size}"
        return ""

    def apply(self, client: int, push: np.ndarray, minibatches: int = 1, lr_factor: float = 1.0,
              scale_ramp: float = 1.0, piece: slice | None = None, pieces: tuple[slice, ...] = ()) -> ApplyResult:
        """Apply `client`'s push of `minibatches` minibatches (or reject, or drop it), at the
        schedule's `lr_factor` and the batch scaling's `scale_ramp` (`PushFacts`). `piece`:
        the slice of the weights a fragment's push is for (its rule's `by_slice` or
        `per_slice`), moving the version by one as a whole push does; None: all of them.
        `pieces`: the run's fragments, where it streams them: a whole push is then applied
        as a push of each in turn where the rule keeps its state per slice."""
        staleness = self.version - self.pulled.get(client, 0)
        reason = self.check(push, piece)
        dropped = "" if reason else self.rule.drops(staleness)
        if dropped:  # before it is read for NaN/Inf, which the fused path does in its kernel
            self.dropped[client] += 1
            return ApplyResult(False, self.version, staleness, dropped, dropped=True)
        parts = pieces if piece is None and pieces and self.rule.per_slice else (piece,)
        # a fragment that misses this server's slice (sharded servers) moves the version alone
        parts = [part for part in parts if part is None or part.stop > part.start]
        # checked whole first where it is split: a kernel's own check would find a NaN only in its part
        if not reason and (self.fused is None or len(parts) > 1) and not finite(push):
            reason = "contains NaN or Inf"
        d = None if reason else self.backend.upload(push)
        for part in [] if d is None else parts:
            whole = part is piece  # the push is this part's, not a slice of it
            facts = PushFacts(d if whole else d[part], client, staleness, minibatches, lr_factor, scale_ramp,
                              part, self.size)
            reason = self._write(part, facts, push if whole else push[part])
            if reason:
                break
        if reason:  # counted by the handler's tally (pushes_rejected), with the other refusals
            return ApplyResult(False, self.version, staleness, reason)
        squared = self.fused.d_squared if self.fused else None  # summed by a host kernel on its way
        summed = self.fused is not None and self.fused.sums_noise  # d in the noise's window too, likewise
        measured = self.rule.noise is not None and self.rule.noise.add(d, minibatches, squared, summed)
        gathered = self.rule.pending
        self.version += not gathered
        self.applied[client] += 1
        self.staleness[staleness] += 1
        return ApplyResult(True, self.version, staleness, gathered=gathered, measured=measured)

    def _write(self, piece: slice | None, facts: PushFacts, push: np.ndarray) -> str:
        """The rule's update of the weights' `piece` (None: all of them) by `facts`, or why
        not: a NaN or Inf the fused kernel found, having written nothing."""
        target = self.array if piece is None else self.array[piece]  # a view: updated in place
        if not self.fused:
            self.rule.apply(target, facts)
            return ""
        try:
            weights = self.fused.apply(target, facts)
        except fused.KernelFailed as error:
            weights = self._unfused(error, push, facts, target)
        if weights is None:
            return "contains NaN or Inf"
        if piece is None:
            self.array = weights
        elif weights is not target:  # a GPU kernel writes new weights beside the old
            target.copy_(weights)
        return ""

    def _unfused(self, error: fused.KernelFailed, push: np.ndarray, facts: PushFacts, target):
        """The GPU kernel failed before writing anything of the weights' (it writes
        spare buffers): say so once, and from this push on apply with the rule's torch
        arithmetic, as `server_kernel = "torch"` does. The new weights, or None for a
        push with NaN or Inf (which the kernel would have found)."""
        warnings.warn(f"server_kernel: {error}; applying pushes with the rule's torch arithmetic "
                      "instead (server_kernel = \"torch\" chooses that from the start)", RuntimeWarning, stacklevel=3)
        self.fused = None
        if not finite(push):
            return None
        self.rule.apply(target, facts)
        return target

    def flush(self) -> bool:
        """Take the step the rule is gathering now, with what it has (no more pushes can
        come for it); whether there was one."""
        if not self.rule.pending:
            return False
        self.rule.step(self.array)
        self.version += 1
        return True

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
        arrays.update({f"rule_scalar.{k}": np.array(v, np.float64) for k, v in self.rule.scalars().items()})
        noise = self.rule.noise
        if noise is not None:
            arrays.update({f"noise.{k}": np.array(v, np.float64) for k, v in noise.scalars().items()})
            if noise.total is not None:
                arrays["noise_total"] = self.backend.export(noise.total)
        for name in ("pulled", "applied", "dropped", "staleness"):
            arrays[f"store.{name}"] = np.array(sorted(dict(getattr(self, name)).items()), np.int64).reshape(-1, 2)
        return arrays

    def load_state(self, arrays: dict[str, np.ndarray]) -> None:
        weights = arrays["weights"]
        if weights.shape != (self.size,):
            raise ValueError(f"checkpoint holds {weights.size} weights, the model has {self.size}")
        self.backend.load(self.array, weights)
        self.version = int(arrays["version"])
        self.rule.load_state({k[5:]: self.backend.adopt(v) for k, v in arrays.items() if k.startswith("rule.")})
        self.rule.load_scalars({k[12:]: float(v) for k, v in arrays.items() if k.startswith("rule_scalar.")})
        if self.rule.noise is not None:
            self.rule.noise.load_scalars({k[6:]: float(v) for k, v in arrays.items() if k.startswith("noise.")})
            self.rule.noise.total = self.backend.adopt(arrays["noise_total"]) if "noise_total" in arrays else None
        self.pulled = {int(k): int(v) for k, v in arrays["store.pulled"]}
        for name in ("applied", "dropped", "staleness"):  # an older checkpoint's store.rejected: unread
            counts = arrays.get(f"store.{name}", np.zeros((0, 2), np.int64))  # older checkpoints hold no drops
            setattr(self, name, Counter({int(k): int(v) for k, v in counts}))


def kernel_path(backend: ServerArrays, rule: Rule, kernel: str = "auto") -> fused.Fused | hostkernel.InPlace | None:
    """The fused path for a Store (`kernel` auto) where the rule has a formula: on the host
    where g++ is found (paramserver/compute/hostkernel.py), on a GPU where cupy imports; None
    elsewhere and with `kernel` torch (the rule's torch arithmetic runs)."""
    if kernel == "torch" or not rule.fusable() or not rule.formulas_fit:
        return None
    if backend.on_host:
        return hostkernel.InPlace(rule, hostkernel.HostKernel()) if hostkernel.available() else None
    try:
        return fused.Fused(rule, fused.CupyKernel())
    except ImportError:
        return None


def finite(push: np.ndarray) -> bool:
    """Whether `push` holds no NaN or Inf. A NaN or Inf anywhere makes the dot product
    non-finite; one BLAS pass is the cheapest read of the vector (a float64 sum costs 5x).
    Huge finite values can overflow it too, so only then look element by element."""
    with np.errstate(over="ignore"):
        return bool(np.isfinite(np.dot(push, push))) or bool(np.isfinite(push).all())
