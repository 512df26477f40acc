"""The bound on MPI's start (experiments/rank/startwatch.py), around a stand-in for an
MPI_Init that never returns and one that does."""
from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

HUNG = "import time; from experiments.rank.startwatch import bounded_start\nwith bounded_start({}):\n    time.sleep({})\nprint('started')"


def run(timeout: float, takes: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", HUNG.format(timeout, takes)], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env={"PMI_RANK": "3", "PYTHONPATH": str(ROOT), "PATH": ""})


def test_a_start_past_the_bound_ends_the_rank_saying_which_and_where():
    result = run(0.5, 30)
    assert result.returncode == -9 and result.stdout == ""
    assert result.stderr.startswith("asgd: error: rank 3 on host ")
    assert result.stderr.endswith(": MPI did not start in 0.5 s: can every host reach every other? (docs/cluster.md)\n")


def test_a_start_within_the_bound_goes_on_and_leaves_no_watcher():
    result = run(30, 0.2)
    assert result.returncode == 0 and result.stdout == "started\n" and result.stderr == ""


def test_srun_pmi2_gets_mpich_s_short_address_netmod_and_a_user_s_choice_is_kept():
    from experiments.rank.startwatch import fit_launcher

    under_srun = {"SLURM_MPI_TYPE": "pmi2"}
    fit_launcher(under_srun)
    assert under_srun["MPIR_CVAR_CH4_NETMOD"] == "ofi"
    chosen = {"SLURM_MPI_TYPE": "pmi2", "MPIR_CVAR_CH4_NETMOD": "ucx"}
    fit_launcher(chosen)
    assert chosen["MPIR_CVAR_CH4_NETMOD"] == "ucx"
    for other in ({}, {"SLURM_MPI_TYPE": "pmix"}, {"PMI_RANK": "0", "SLURM_STEP_ID": "0"}):  # mpiexec in an sbatch: hydra's PMI
        fit_launcher(other)
        assert "MPIR_CVAR_CH4_NETMOD" not in other
