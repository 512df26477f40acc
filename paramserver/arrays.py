"""Where the server's weights live and how an update runs there: a small strategy.

The Store and the rules are written once; a backend owns the storage and the
elementwise kernels:
- `HostArrays` (the default, `server_device = "cpu"`): numpy, in place, no copies.
  The wire buffer and the weights are the same memory.
- `TorchArrays` (`server_device = "cuda[:N]"`, paramserver/gpu.py): a torch tensor on
  the device, each update one fused kernel, and the weights handed to MPI through a
  pinned host buffer.

`adopt`, `upload` and `load` take host numpy vectors and `stage` and `export` give them
back (what MPI, the push checks and the checkpoints see); `add` and `sgd` work on the
backend's own arrays (what the rules update).
"""
from __future__ import annotations

from typing import Any

import numpy as np


class HostArrays:
    """float32 numpy vectors on the host."""

    def adopt(self, host: np.ndarray) -> np.ndarray:
        """A private float32 copy of `host`, to update in place."""
        return np.array(host, dtype=np.float32, order="C")

    def upload(self, push: np.ndarray) -> np.ndarray:
        """The push where the weights are: already there."""
        return push

    def stage(self, weights: np.ndarray) -> np.ndarray:
        """The weights as a host vector for the wire: the live array itself."""
        return weights

    def export(self, array: np.ndarray) -> np.ndarray:
        """A host vector of `array`'s values for a checkpoint (here the live array)."""
        return array

    def load(self, array: np.ndarray, host: np.ndarray) -> None:
        array[:] = host

    def add(self, weights: np.ndarray, push: np.ndarray) -> None:
        np.add(weights, push, out=weights)

    def sgd(self, weights: np.ndarray, push: np.ndarray, buffer: np.ndarray | None, lr: float,
            momentum: float, weight_decay: float) -> np.ndarray | None:
        """torch.optim.SGD's step on `weights` for the gradient `push`; returns the momentum
        buffer (None without momentum; torch starts it at the first gradient)."""
        grad = push + weight_decay * weights if weight_decay else push.copy()
        if momentum:
            if buffer is None:
                buffer = grad
            else:
                buffer *= momentum
                buffer += grad
            grad = buffer
        weights -= np.float32(lr) * grad
        return buffer


def make_backend(device: str) -> Any:
    """The backend for `server_device`: numpy for "cpu", else torch tensors on that device
    (imported only then, so a CPU server never loads torch for its weights)."""
    if device == "cpu":
        return HostArrays()
    from paramserver.gpu import TorchArrays

    return TorchArrays(device)
