"""Churn across hosts (issue 55): scripts/churn.py fails a joinable run's client on h2 and
the joiners that stand in for it, while the server and the other client go on on h1.

Under Open MPI churn.py runs on h2 itself (through the agent, as a user would ssh there)
with `--ranks`: "this host" is h2, so it kills h2's client rank and not h1's, and its
joiners, started on h2, cross the bridge to the server's door on h1. MPICH's launcher
may end the whole job when a rank is killed, so there churn.py fails joiners only, from
this machine, each started on h2 with `--launch` (the agent, as ssh would): killing the
launch's process group has to reach the joiner on the other host, or it would go on
training and never be lost."""
from __future__ import annotations

import re

import pytest

from experiments.parent.tree import kill_tree
from tests.cluster.conftest import AGENT, Job, assert_placed, ranks_of, run_job, wait_for
from tests.conftest import ROOT, assert_churned, finish

# Nine minibatches in ten sleep 0.1 s after (a straggler's pause, slept for real under MPI),
# so the run lasts tens of seconds however idle the machine: time for joiners to start.
RUN = ["--clients", "2", "--joinable", "--on-client-failure", "continue", "--steps", "200", "--budget", "run",
       "--pause-prob", "0.9", "--pause-time", "0.1", "--batch-size", "32", "--eval-samples", "50",
       "--stall-timeout", "60", "--threads", "1", "--quiet"]
PLACEMENT = {"h1": 2, "h2": 1}  # rank 0 (the server) and rank 2 (client 1) on h1, rank 1 (client 0) on h2
# random.Random(1048)'s failures at a mean of 4 s: 1.2, 0.7, 14.9 s. Under --ranks h2's rank
# dies 1.2 s after the door opens, the first joiner 0.7 s after it joined and the second
# lives on; without, the first joiner lives 1.2 s and the second 0.7 s: inside the run.
CHURN = ["--mtbf", "4", "--repair", "0.3", "--seed", "1048"]


@pytest.mark.parametrize("mpi", ["openmpi", "mpich"], indirect=True)
def test_churn_of_h2_kills_its_client_and_joiners_and_the_run_on_h1_completes_with_every_row_once(
        cluster, mpi, tmp_path, tiny_npz):
    run = tmp_path / "run"
    train = [*mpi.mpiexec(PLACEMENT, 3), *mpi.survive(), mpi.bin / "asgd", "train", "--data", tiny_npz, *RUN,
             "--out", run]
    churn = [mpi.bin / "python", ROOT / "scripts" / "churn.py", run, *CHURN]
    if mpi.name == "openmpi":
        churn = [AGENT, "h2", *churn, "--ranks", "--joiners", "0"]
    else:
        churn = [*churn, "--joiners", "1", "--launch", f"{AGENT} h2"]
    job = Job(train, mpi.env(cluster))
    try:  # churn.py waits for the door: a job that died before it opened would leave it waiting
        wait_for(lambda: (run / "door.json").exists() or job.poll() is not None, job, 120, "the door")
        assert job.poll() is None, job.communicate()[1]
        churned = run_job(churn, mpi.env(cluster), timeout=240)
        trained = finish(job, [str(a) for a in train], timeout=60)
    finally:
        kill_tree(job.pid)
    assert trained.returncode == 0 and churned.returncode == 0, trained.stderr + churned.stdout + churned.stderr
    ranks = assert_placed(run, PLACEMENT)
    assert [r["rank"] for r in ranks if r["host"] == "h2"] == [1]
    killed_ranks = re.findall(r"rank (\d+) \(pid \d+\) killed", churned.stdout)
    killed_joiners = re.findall(r"\(client \d+\) killed \(SIGKILL\)", churned.stdout)
    assert killed_ranks == (["1"] if mpi.name == "openmpi" else []) and killed_joiners, churned.stdout
    summary = assert_churned(run, churned.stdout, clients=2, lines=1)
    assert [c["client"] for c in summary["lost_clients"] if c["client"] < 2] == \
        ([0] if mpi.name == "openmpi" else [])  # h1's client 1 never
    assert summary["joined_clients"] and {c["host"] for c in summary["joined_clients"]} == {"h2"}
    assert ranks_of(run) == []
