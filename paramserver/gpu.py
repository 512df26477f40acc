"""The server's GPU path: weights in device memory, and whether MPI could take them there.

`TorchArrays` keeps the weights as a float32 torch tensor on `server_device` (see
paramserver/arrays.py for the strategy it fills in). An add is `add_`, one elementwise
kernel; an sgd step is torch's fused SGD kernel (the one `torch.optim.SGD(fused=True)`
runs): one pass reading weights, gradient and momentum buffer and writing two of them,
with torch.optim.SGD's own arithmetic. A cupy ElementwiseKernel would be that same one
pass, so the server needs no second GPU library, and the very code runs on CPU tensors,
where the tests check it against numpy.

Weights reach MPI through a pinned (page-locked) host buffer, and pushes go to the
device from the server's receive buffer: staging is always used, even when
`cuda_aware_mpi()` says the library could take device pointers. The Transport moves
numpy byte views, the server checks pushes (length, NaN/Inf) and decodes compressed
ones on the host, and device memory handed to a library that is not CUDA-aware (the
PyPI `mpich` wheel is not) crashes the job instead of failing cleanly. The answer is
recorded in each run's provenance (`cuda_aware_mpi`), so runs on a CUDA-aware cluster
show where a direct path could be tried.
"""
from __future__ import annotations

import ctypes
import sys

import numpy as np
import torch
from torch.optim.sgd import sgd as torch_sgd  # the functional form of torch.optim.SGD


class TorchArrays:
    """float32 torch tensors on `device` (a GPU in a run; CPU tensors in tests)."""

    def __init__(self, device: str):
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"server_device: {device}, but torch finds no CUDA device here")
        self._staging: torch.Tensor | None = None  # the weights on their way to the wire

    def adopt(self, host: np.ndarray) -> torch.Tensor:
        return torch.tensor(np.asarray(host, np.float32), device=self.device)

    def upload(self, push: np.ndarray) -> torch.Tensor:
        # A blocking copy: once it returns, the server may receive the next push into
        # the same host buffer.
        return torch.from_numpy(push).to(self.device)

    def stage(self, weights: torch.Tensor) -> np.ndarray:
        """The weights in a reused host buffer, valid until the next call: page-locked on a
        GPU, so the copy is one DMA at full speed."""
        if self._staging is None or self._staging.shape != weights.shape:
            self._staging = torch.empty(weights.shape, dtype=torch.float32, pin_memory=self.device.type == "cuda")
        self._staging.copy_(weights, non_blocking=True)
        # The copy is only queued on the stream: wait for it, or MPI (which knows nothing
        # of CUDA streams) would send a half-written buffer.
        self._wait()
        return self._staging.numpy()

    def export(self, array: torch.Tensor) -> np.ndarray:
        """A host vector of `array`'s values, for a checkpoint (a copy from a GPU)."""
        return array.cpu().numpy()

    def load(self, array: torch.Tensor, host: np.ndarray) -> None:
        array.copy_(torch.from_numpy(np.ascontiguousarray(host, np.float32)))

    def add(self, weights: torch.Tensor, push: torch.Tensor) -> None:
        weights.add_(push)

    def sgd(self, weights: torch.Tensor, push: torch.Tensor, buffer: torch.Tensor | None, lr: float,
            momentum: float, weight_decay: float) -> torch.Tensor | None:
        """torch.optim.SGD's step, fused; returns the momentum buffer (created at the first
        step with momentum, None without)."""
        buffers = [buffer]
        torch_sgd([weights], [push], buffers, fused=True, lr=lr, momentum=momentum, weight_decay=weight_decay,
                  dampening=0.0, nesterov=False, maximize=False)
        return buffers[0]

    def _wait(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()


def cuda_aware_mpi() -> bool | None:
    """Whether this process's MPI library takes CUDA device buffers; None when that cannot
    be told: MPI not started in this process (the simulator), or a library without the
    query. MPICH (4.0 on) and Open MPI both export `int MPIX_Query_cuda_support(void)`
    (true only if built with CUDA and enabled at run time); mpi4py 4 does not wrap it, so
    it is looked up in the loaded library."""
    mpi = sys.modules.get("mpi4py.MPI")  # never start MPI just to ask
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return None
    for library in _loaded_mpi_libraries():
        try:
            query = getattr(ctypes.CDLL(library), "MPIX_Query_cuda_support")
        except (OSError, AttributeError):
            continue
        query.restype, query.argtypes = ctypes.c_int, []
        return bool(query())
    return None


def _loaded_mpi_libraries() -> list[str]:
    """Paths of the libmpi* objects mapped into this process (Linux; elsewhere none)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split(maxsplit=5)[5].strip() for line in maps if "/libmpi" in line}
    except (OSError, IndexError):
        return []
    return sorted(p for p in paths if p.rsplit("/", 1)[-1].startswith("libmpi"))
