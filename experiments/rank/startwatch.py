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


# Slurm's PMI-2 plugin (srun --mpi=pmi2) answers MPICH's PMI-1 requests, and reads each
# with a single read() of a bounded buffer (its "TODO: read until newline"). MPICH's UCX
# netmod publishes its address as 9 put lines of about 770 bytes each (measured on the test
# cluster); in a CI run some were read in halves ("mpi/pmi2: value not properly
# terminated"), the peers got corrupt addresses and MPI_Init hung or aborted. The OFI
# netmod's address is one 65-byte line. The user's own choice of netmod is kept.


def fit_launcher(environ: dict[str, str] | None = None) -> None:
    """Before MPI starts: under srun's PMI-2, MPICH's OFI netmod (Open MPI ignores it)."""
    env = os.environ if environ is None else environ
    if env.get("SLURM_MPI_TYPE") == "pmi2":
        env.setdefault("MPIR_CVAR_CH4_NETMOD", "ofi")


@contextlib.contextmanager
def bounded_start(timeout: float) -> Iterator[None]:
    """Around the import that starts MPI: past `timeout` s this rank is killed. The
    launcher's needs (fit_launcher) are met first."""
    fit_launcher()
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
