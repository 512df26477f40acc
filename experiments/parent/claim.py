"""Who may write a run directory, and what must hold before anyone does.

A job writes its run directory while holding the run's lock (`FolderLock`): `asgd
train` takes it before it launches and keeps it until the last process of the job on
this host is gone (the ranks hold it too under MPICH; under Open MPI `asgd train` waits
for them: experiments/parent/supervise.py); rank 0 of a job the user launched with mpiexec takes it itself; the
simulator takes it in its one process. A second writer (a resume beside a running job,
two sweeps at one point) is refused with one line naming the holder. Once the lock is
held: a fresh run needs an empty directory, a resumed one logs that hold whole every
row its checkpoint accounts for.
"""
from __future__ import annotations

import os
from pathlib import Path

from experiments.parent.mpiexec import launcher_rank
from experiments.parent.supervise import LOCKED_RUN
from experiments.run.resume import verify_logs
from runconfig.settings import ConfigError, RunConfig
from rundir.layout import RunDir
from rundir.lock import FolderLock


def claim(cfg: RunConfig, out: str) -> FolderLock | None:
    """The run's lock, held (None where another process of this job holds it)."""
    if os.environ.get(LOCKED_RUN) == str(Path(out).resolve()) or launcher_rank() not in (None, 0):
        return None
    lock = RunDir(out).lock().acquire()
    try:
        if cfg.resume:
            verify_logs(out, cfg.steps, cfg.run_budget)
        elif not RunDir(out).empty():
            raise ConfigError(f"out: {out} already exists and is not an empty directory; choose another --out")
    except BaseException:
        lock.release()
        raise
    return lock
