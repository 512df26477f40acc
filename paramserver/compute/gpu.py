"""Whether MPI could take the server's GPU weights directly.

A GPU server (`server_device = "cuda[:N]"`, paramserver/compute/arrays.py) keeps its weights in
device memory and runs the rules' torch arithmetic there. Weights reach MPI through a
pinned (page-locked) host buffer, and pushes go to the device from the server's receive
buffer: staging is always used, even when
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
