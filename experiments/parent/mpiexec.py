"""The parent's side of an MPI launch: which `mpiexec`, and what it needs to start a job.

`asgd train` typed without mpiexec (and each point of an MPI sweep) starts one here;
the tests start theirs the same way. The launcher is `$ASGD_MPIEXEC` when set (to test
or run under another MPI), else the one beside this Python (the venv's MPI wheel), else
the first on PATH. mpi4py must be built for (or, from PyPI, find at run time) the same
MPI library: one MPI a venv.

What each launcher is told:
- MPICH's (hydra): `-disable-auto-cleanup`, so a dead rank does not take every rank
  with it at once: the survivors name it, record it and end the job themselves, or go
  on without it (`--on-client-failure continue`).
- Open MPI's (prterun): as root it starts nothing without OMPI_ALLOW_RUN_AS_ROOT (and
  _CONFIRM), and no more ranks than cores without oversubscription (PRTE's mapping
  policy, Open MPI 5; the rmaps variable, Open MPI 4); and `--with-ft ulfm` (Open MPI
  5: MPI's own fault tolerance). Without it the launcher ends the whole job the moment a
  rank dies, SIGTERM to every rank, so nothing can go on without a lost client and the
  summary would say `interrupted` without naming the dead rank; with it MPI itself tells
  the survivors which rank failed (paramserver/wire/transport.py), as under MPICH, and they
  go on or end the job (MPI_Abort) as `on_client_failure` says. And
  `--prtemca state_base_error_non_zero_exit 0`: PRTE otherwise counts a rank's non-zero
  exit (a client that failed and said so) as the job's error and ends the job once no
  other client rank runs, its server waiting at its door for a joiner included (measured:
  gone 1.5 s after the last client's exit). The job's exit status still says a failure:
  a failing run's server ends it with MPI_Abort.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from runconfig.settings import ConfigError

MPIEXEC = "ASGD_MPIEXEC"
OPEN_MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                # by slot, the default, named: a bare ":oversubscribe" (as `--oversubscribe`)
                # maps by core and, free to oversubscribe, puts every rank on the first
                # host of a hostfile or a Slurm allocation (tests/cluster)
                "PRTE_MCA_rmaps_default_mapping_policy": "slot:oversubscribe",
                "OMPI_MCA_rmaps_base_oversubscribe": "1"}


def find_mpiexec() -> str | None:
    """$ASGD_MPIEXEC, else the mpiexec beside this Python, else PATH's (None: there is none)."""
    if os.environ.get(MPIEXEC):
        return shutil.which(os.environ[MPIEXEC])
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


@dataclass(frozen=True)
class Launcher:
    """An `mpiexec`: `kind` is "hydra" (MPICH), "openmpi" or "other"; `ulfm`: it can keep
    a job going after a rank died (Open MPI 5's `--with-ft ulfm`)."""

    path: str
    kind: str
    ulfm: bool = False

    @classmethod
    def of(cls, path: str) -> "Launcher":
        """What `path --version` says it is."""
        try:
            said = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            said = ""
        if "HYDRA" in said:
            return cls(path, "hydra")
        version = re.search(r"\(Open(?: MPI|RTE)\) (\d+)", said)
        if version:
            return cls(path, "openmpi", ulfm=int(version[1]) >= 5)
        return cls(path, "other")

    def environment(self) -> dict[str, str]:
        """The variables it needs, with the caller's own settings kept."""
        needs = OPEN_MPI_ENV if self.kind == "openmpi" else {}
        return {**needs, **os.environ}

    def flags(self) -> list[str]:
        """What keeps a job alive past a dead rank, so the survivors can name it."""
        if self.kind == "hydra":
            return ["-disable-auto-cleanup"]
        if self.kind == "openmpi" and self.ulfm:
            return ["--with-ft", "ulfm", "--prtemca", "state_base_error_non_zero_exit", "0"]
        return []

    def command(self, ranks: int, argv: list[str]) -> list[str]:
        """The command that runs `asgd train argv` on `ranks` ranks."""
        return [self.path, *self.flags(), "-n", str(ranks), sys.executable, "-m", "experiments.cli", *argv]


RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


def launcher_rank(environ: dict[str, str] | None = None) -> int | None:
    """This process's rank (or, given its `environ`, another's) if an MPI launcher started
    it (MPICH, Open MPI, PMIx), else None."""
    env = os.environ if environ is None else environ
    for name in RANK_VARIABLES:
        if name in env:
            return int(env[name])
    return None


def refuse_torchrun(environ: dict | None = None) -> None:
    """torchrun (or torch.distributed.launch) sets RANK and LOCAL_RANK for each process it
    starts; each would start an mpiexec of its own. Say how to launch instead."""
    env = os.environ if environ is None else environ
    if "RANK" in env and "LOCAL_RANK" in env:
        raise ConfigError("launch: started by torchrun (RANK and LOCAL_RANK set, no MPI launcher); asgd runs on "
                          "MPI: use 'mpiexec -n K+1 asgd train ...' or 'mpiexec -n K+1 python train.py' "
                          "(Slurm: srun --mpi=pmi2), or --backend sim")

