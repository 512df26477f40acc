"""A bound on MPI's start, which no MPI call of ours can time out: MPI_Init waits until
every rank reaches every other, and where one host cannot reach another (a firewall, a
route, the wrong interface) MPICH's ranks wait there for ever (measured on the test
cluster, docs/cluster.md; Open MPI's end in seconds). A watcher process, forked before
MPI starts and killed once it has, ends its rank past the stall timeout, saying where
it was, so the launcher ends the job. The bound: stall_timeout, and at least 30 s.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Iterator

from experiments.parent.mpiexec import launcher_rank


@contextlib.contextmanager
def bounded_start(timeout: float) -> Iterator[None]:
    """Around the import that starts MPI: past `timeout` s this rank is killed."""
    parent = os.getpid()
    watcher = os.fork()
    if watcher == 0:
        _watch(parent, timeout)
    try:
        yield
    finally:
        os.kill(watcher, signal.SIGKILL)
        os.waitpid(watcher, 0)


def _watch(parent: int, timeout: float) -> None:
    """The watcher: sleeps (nothing else: it is the fork of a process with threads), and
    leaves at once if its rank ended by itself."""
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if os.getppid() != parent:
                return
            time.sleep(0.2)
        rank = launcher_rank()
        os.write(2, f"asgd: error: rank {'?' if rank is None else rank} on host {socket.gethostname()}: MPI did "
                    f"not start in {timeout:g} s: can every host reach every other? "
                    "(docs/cluster.md)\n".encode())
        os.kill(parent, signal.SIGKILL)
    finally:
        os._exit(0)
