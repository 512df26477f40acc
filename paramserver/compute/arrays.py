"""Where the server's weights live: a torch tensor on `server_device`, and the host
vectors MPI, the push checks and the checkpoints see.

The rules (paramserver/rules/) are written once on torch tensors; this class owns the
storage around them:
- on the CPU (`server_device = "cpu"`, the default) the tensor shares the memory of a
  numpy vector: the wire buffer, the weights and each push are the same bytes, nothing
  is copied;
- on a GPU (`cuda[:N]`) the weights stay in device memory, pushes are uploaded with one
  blocking copy and the weights reach MPI through a reused pinned host buffer.

`adopt`, `upload` and `load` take host numpy vectors; `stage` and `export` give them back.
"""
from __future__ import annotations

import numpy as np
import torch

from paramserver.wire import frame


class ServerArrays:
    """float32 torch tensors on `device`."""

    def __init__(self, device: str = "cpu"):
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"server_device: {device}, but torch finds no CUDA device here")
        self.on_host = self.device.type == "cpu"
        self._staging: torch.Tensor | None = None  # the weights on their way to the wire (GPU)
        self._pushes: tuple[np.ndarray | None, torch.Tensor | None] = (None, None)  # the last push, as a tensor

    def adopt(self, host: np.ndarray) -> torch.Tensor:
        """A private float32 copy of `host`, to update in place (on the host with room for
        a message header around it: the weights go out as they are, paramserver/wire/frame.py)."""
        if self.on_host:
            vector = frame.empty(host.size)
            vector[:] = np.asarray(host, np.float32).reshape(-1)
            return torch.from_numpy(vector)
        return torch.from_numpy(np.array(host, dtype=np.float32, order="C")).to(self.device)

    def upload(self, push: np.ndarray) -> torch.Tensor:
        """The push where the weights are: the same memory on the host; on a GPU a blocking
        copy, so the server may receive the next push into the same buffer once it returns."""
        if self.on_host:
            if self._pushes[0] is not push:  # the server lands every push in one buffer: wrap it once
                self._pushes = (push, torch.from_numpy(push))
            return self._pushes[1]
        return torch.from_numpy(push).to(self.device)

    def stage(self, weights: torch.Tensor) -> np.ndarray:
        """The weights as a host vector for the wire: on the host the live array, from a GPU
        a reused page-locked buffer (one DMA), valid until the next call."""
        if self.on_host:
            return weights.numpy()
        if self._staging is None or self._staging.shape != weights.shape:
            self._staging = torch.empty(weights.shape, dtype=torch.float32, pin_memory=True)
        self._staging.copy_(weights, non_blocking=True)
        # The copy is only queued on the stream: wait for it, or MPI (which knows nothing
        # of CUDA streams) would send a half-written buffer.
        torch.cuda.current_stream(self.device).synchronize()
        return self._staging.numpy()

    def export(self, array: torch.Tensor) -> np.ndarray:
        """A host vector of `array`'s values, for a checkpoint (a copy from a GPU)."""
        return array.numpy() if self.on_host else array.cpu().numpy()

    def load(self, array: torch.Tensor, host: np.ndarray) -> None:
        array.copy_(torch.from_numpy(np.ascontiguousarray(host, np.float32)))
