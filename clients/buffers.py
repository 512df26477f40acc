"""Host buffers for what a client sends and receives: framed on a CPU, page-locked for a GPU.

On a CPU a vector has room for a message header around it (paramserver/wire/frame.py),
so a push goes out in place, without a copy into a frame; for a GPU it is page-locked
memory, so the copies to and from the device are DMAs at full speed.
"""
from __future__ import annotations

import numpy as np
import torch

from paramserver.wire import frame


def host_copy(tensor: torch.Tensor) -> np.ndarray:
    """`tensor`'s values in host memory of their own. From a GPU they land in page-locked
    memory: one DMA at full speed, into a buffer torch's caching host allocator recycles."""
    tensor = tensor.detach()
    if tensor.device.type == "cpu":  # with room for a message header: a push goes out in place
        host = frame.empty(tensor.numel(), tensor.numpy().dtype).reshape(tensor.shape)
        np.copyto(host, tensor.numpy())
        return host
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    # non_blocking only queues the copy on the stream: wait for it before anything reads
    # the buffer, MPI above all, which knows nothing of CUDA streams.
    torch.cuda.current_stream(tensor.device).synchronize()
    return host.numpy()


def host_empty(size: int, device: torch.device) -> np.ndarray:
    """An empty float32 host vector for data on its way to or from `device`: page-locked
    for a GPU (copies to and from it are DMAs at full speed), plain numpy on a CPU."""
    if device.type == "cpu":
        return frame.empty(size, np.float32)  # with room for a message header: sent in place
    return torch.empty(size, dtype=torch.float32, pin_memory=True).numpy()
