"""Shared test helpers: a small generated dataset and a hard-timeout command runner."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def make_tiny_npz(path: Path, n: int = 768, seed: int = 0) -> Path:
    """8x8 images whose class is the quadrant holding a bright blob: learnable in seconds."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 4, n)
    x = rng.integers(0, 60, (n, 1, 8, 8)).astype(np.uint8)
    for i, label in enumerate(y):
        r, c = divmod(int(label), 2)
        x[i, 0, 4 * r:4 * r + 4, 4 * c:4 * c + 4] += 150
    np.savez(path, x=x, y=y)
    return path


@pytest.fixture(scope="session")
def tiny_npz(tmp_path_factory) -> Path:
    return make_tiny_npz(tmp_path_factory.mktemp("data") / "tiny.npz")


def run_command(args: list[str], timeout: float, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """Run in a new process group; on timeout kill that group (only it) and fail the test."""
    proc = subprocess.Popen(args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(args)} did not finish in {timeout} s (deadlock?)\n{out}\n{err}")
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def mpi_train(ranks: int, *flags: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`mpiexec -n RANKS asgd train FLAGS` as a user types it."""
    return run_command([str(BIN / "mpiexec"), "-n", str(ranks), str(BIN / "asgd"), "train", "--quiet", *flags],
                       timeout)
