"""Joining across hosts (issue 55): a run whose server is on h1 and whose one client, on h2,
fails at its step 5 under `continue` waits at its door; a process on h3 outside the job
joins it (`asgd join`, started as ssh starts a command, or by a second Slurm job) and
finishes the lost client's shard, every sample once; under both MPIs (the joiner's
sockets are the tool's own), the second Slurm job under MPICH."""
from __future__ import annotations

import json
import time

import pytest

from experiments.parent.tree import kill_tree
from tests.cluster.conftest import AGENT, Job, rows, run_job
from tests.conftest import each_logged_once

RUN = ["--clients", "1", "--joinable", "--on-client-failure", "continue", "--inject-fault", "1:5", "--steps", "60",
       "--budget", "client", "--batch-size", "32", "--eval-samples", "50", "--stall-timeout", "60", "--threads", "1",
       "--quiet"]


@pytest.mark.parametrize("mpi, launch, servers", [("mpich", "ssh", 1), ("mpich", "srun", 1), ("mpich", "ssh", 2),
                                                 ("openmpi", "ssh", 1), ("openmpi", "ssh", 2)], indirect=["mpi"])
def test_a_process_on_another_host_joins_the_run_and_finishes_the_lost_clients_shard(cluster, mpi, tmp_path, tiny_npz,
                                                                                     launch, servers):
    """With two servers, server 1 is on h2 and the client on h1: the joiner on h3 joins
    server 0's door, then server 1's on another host (docs/joining.md, Sharded servers)."""
    if launch == "srun":
        cluster.need_slurm()
    run = tmp_path / "run"
    fault = ["--servers", "2", "--inject-fault", "2:5"] if servers == 2 else []  # the client is rank 2, on h1
    args = [*mpi.mpiexec({"h1": 1, "h2": 1}, servers + 1), *mpi.survive(), mpi.bin / "asgd", "train",
            "--data", tiny_npz, *RUN, *fault, "--out", run]
    job = Job(args, mpi.env(cluster))
    try:
        deadline = time.monotonic() + 120
        while not ((run / "door.json").exists() and (run / "server.jsonl").exists()
                   and any("lost" in r for r in rows(run, "server"))):
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()[1] if job.poll() else "timeout"
            time.sleep(0.1)
        joiner = ([str(AGENT), "h3"] if launch == "ssh" else ["srun", "-w", "h3", "-n", "1"]) + \
            [str(mpi.bin / "asgd"), "join", str(run)]
        joined = run_job(joiner, mpi.env(cluster), timeout=120)
        assert joined.returncode == 0, joined.stderr
        err = job.communicate(timeout=120)[1]
    finally:
        kill_tree(job.pid)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "complete", err
    assert [(c["client"], c["host"], c["version"], c["slot"]) for c in summary["joined_clients"]] == \
        [(1, "h3", 4, 0)]
    assert each_logged_once([(r["client"], r["step"]) for r in rows(run, "clients")], 2) == [4, 56]
    assert f"asgd: rank {servers + 1} (host h3) joins as client 1 at version 4" in err
