"""Which device each rank works on, and how the host's allocator serves torch.

On a node, the clients take its GPUs one each (`node_devices`); a server takes a GPU
only where `server_device` asks for one, and the clients leave that one to it while
there are others. The GPUs are those CUDA lets this process see: CUDA_VISIBLE_DEVICES,
which Slurm's GPU binding sets (--gpus-per-task, --gpu-bind), narrows them, and a
rank's `cuda:i` is the i-th visible one (`visible_gpu` says which that is).
"""
from __future__ import annotations

import ctypes
import os
import platform
from contextlib import contextmanager
from typing import Iterator

import torch


def node_devices(requested: str, server_device: str, clients: list[bool], gpus: int) -> list[str]:
    """The device of each rank on one node, in local rank order (`clients`: whether
    each is a client; `gpus`: how many this node shows). `requested` is the clients'
    `device`: cpu or cuda:N as given, auto or cuda onto the GPUs one each (round-robin
    past the last), auto without a GPU the CPU. A server gets `server_device` (where it
    keeps the weights) and evaluates there: no GPU unless that names one."""
    server_gpus = {_index(server_device) for is_client in clients if not is_client} - {None}
    free = [g for g in range(gpus) if g not in server_gpus] or list(range(gpus))
    devices, k = [], 0
    for is_client in clients:
        if not is_client:
            devices.append(server_device)
        elif requested in ("auto", "cuda") and free:
            devices.append(f"cuda:{free[k % len(free)]}")
            k += 1
        else:
            devices.append("cpu" if requested == "auto" else requested)
    return devices


def _index(device: str) -> int | None:
    if not device.startswith("cuda"):
        return None
    return int(device.partition(":")[2] or 0)


def gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def use_device(device: str) -> None:
    """Make `device` this process's current CUDA device, so what allocates on "the"
    GPU (cupy's kernels, CUDA-aware MPI, a bare torch.device("cuda")) uses this rank's."""
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))


def visible_gpu(device: str, environ: dict[str, str] | None = None) -> str | None:
    """Which physical GPU `device` is (its entry in CUDA_VISIBLE_DEVICES: an index or a
    UUID, as Slurm or the user wrote it), None on the CPU."""
    index = _index(device)
    if index is None:
        return None
    visible = (os.environ if environ is None else environ).get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return str(index)
    entries = [entry.strip() for entry in visible.split(",")]
    return entries[index] if index < len(entries) else None


def pick_device(requested: str) -> str:
    """The device of a process alone on its node (the simulator's)."""
    return node_devices(requested, "cpu", [True], gpu_count())[0]


def device_name(device: str) -> str:
    return torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu"


def share_cores(threads: int, sharing: int) -> None:
    """torch's threads: `threads`, or (0) this node's cores shared among the `sharing`
    processes that compute on it, so none time-shares a core with another."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    torch.set_num_threads(threads or max(1, cores // max(1, sharing)))


@contextmanager
def threads_kept() -> Iterator[None]:
    """torch's thread count back to what it was once the block ends. A run sets its own
    (its --threads, or every core; every core again to evaluate), and a process that runs
    one in itself (the Python API, a test, the bench) goes on with the count it chose:
    a count left behind changes the floats of what that process computes next."""
    threads = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(threads)


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)
MMAP_THRESHOLD = 32 << 20  # glibc's largest: blocks up to this size come from the heap
TRIM_THRESHOLD = 1 << 30   # free memory at the heap's top kept until there is this much


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep the memory a process frees, as tcmalloc or jemalloc do;
    returns whether it was set.

    By default glibc maps every block over 128 KB afresh from the kernel and unmaps it on
    free, and hands the heap's free top back, so a CPU forward pass whose activations are
    a few MB takes a page fault for every page of every batch. Measured on the 2-core
    reference machine with a small BatchNorm ResNet: its test pass 2-4x faster, a
    2-client training run's wall time 20% less. The price is that memory freed after a
    peak is not returned to the system until exit. Left alone where the user chose an
    allocator (LD_PRELOAD) or glibc's settings (MALLOC_*_ variables, GLIBC_TUNABLES), and
    off glibc."""
    if os.environ.get("LD_PRELOAD") or os.environ.get("GLIBC_TUNABLES") or any(
            name.startswith("MALLOC_") and name.endswith("_") for name in os.environ):
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)
    return all(libc.mallopt(number, value) for number, value in
               ((_M_MMAP_THRESHOLD, MMAP_THRESHOLD), (_M_TRIM_THRESHOLD, TRIM_THRESHOLD)))
