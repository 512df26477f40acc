"""Which device a client trains on: the one asked for, else a GPU of its node's (shared round-robin by local rank), else the CPU."""
from __future__ import annotations

import torch


def pick_device(requested: str, local_rank: int) -> str:
    if requested != "auto":
        return requested
    if torch.cuda.is_available():
        return f"cuda:{local_rank % torch.cuda.device_count()}"
    return "cpu"


def device_name(device: str) -> str:
    return torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu"

