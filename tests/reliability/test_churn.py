"""Churn with joins (scripts/churn.py): joiners killed with SIGKILL at random while the run
goes on, each replaced after a repair time. Nothing is lost or doubled, every killed
joiner is a lost client, and no process of the churn is left."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import BIN, LAUNCHER, ROOT, assert_churned, finish, kill_tree, run_command, start

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.long]  # minutes on 2 cores: a joiner's start-up is seconds


def _joinable(run: Path, tiny_npz: Path, clients: int, steps: int) -> list[str]:
    """A joinable run that goes on past its lost clients, on the tiny data set."""
    return [str(BIN / "asgd"), "train", "--quiet", "--data", str(tiny_npz), "--clients", str(clients), "--joinable",
            "--on-client-failure", "continue", "--steps", str(steps), "--budget", "run", "--batch-size", "32",
            "--eval-samples", "50", "--device", "cpu", "--stall-timeout", "60", "--out", str(run)]


def _churn(run: Path, *flags: str):
    """scripts/churn.py on `run`, failing a second after a start (mean), replaced after 0.2 s."""
    return run_command([sys.executable, str(ROOT / "scripts" / "churn.py"), str(run), "--mtbf", "1.0", "--repair",
                        "0.2", *flags], timeout=300)


def test_joiners_killed_and_replaced_while_the_run_goes_on_leave_every_row_once_and_no_process(tmp_path, tiny_npz):
    run = tmp_path / "run"
    args = _joinable(run, tiny_npz, clients=1, steps=3000)
    server = start(args)
    try:
        churn = _churn(run, "--joiners", "1", "--seed", "3")
        result = finish(server, args, 120)
    finally:
        kill_tree(server.pid)
    assert result.returncode == 0, result.stderr
    assert churn.returncode == 0, churn.stderr
    killed = re.findall(r"\(client (\d+)\) killed \(SIGKILL\)", churn.stdout)
    started = len(re.findall(r"joiner pid \d+ started", churn.stdout))
    assert killed and started - len(killed) in (0, 1), churn.stdout  # 0: the run ended during a repair time
    summary = assert_churned(run, churn.stdout, clients=1, lines=1)
    assert all(c["client"] >= 1 for c in summary["lost_clients"])
    left = subprocess.run(["pgrep", "-f", f"join {run}"], capture_output=True, text=True)
    assert left.stdout == "", left.stdout


def test_the_jobs_own_ranks_killed_are_replaced_by_joiners_under_open_mpi_refused_under_mpich(tmp_path, tiny_npz):
    """`--ranks`: both of the job's client ranks SIGKILLed at random (Open MPI 5's launcher
    keeps the job going without them), a joiner started after each, and those joiners
    killed and replaced in turn: the run completes with every row once, each killed rank's
    client lost. Under MPICH, whose launcher may end the whole job, one line and exit 2."""
    run = tmp_path / "run"
    args = _joinable(run, tiny_npz, clients=2, steps=1000)
    server = start(args)
    try:
        churn = _churn(run, "--ranks", "--joiners", "0", "--seed", "1")
        if LAUNCHER.kind != "openmpi":
            assert churn.returncode == 2 and churn.stderr.count("\n") == 1 and "only Open MPI 5" in churn.stderr
            return
        result = finish(server, args, 120)
    finally:
        kill_tree(server.pid)
    assert result.returncode == 0 and churn.returncode == 0, result.stderr + churn.stderr
    ranks = sorted(map(int, re.findall(r"rank (\d+) \(pid \d+\) killed", churn.stdout)))
    assert ranks == [1, 2], churn.stdout
    summary = assert_churned(run, churn.stdout, clients=2, lines=2)
    assert {0, 1} <= {c["client"] for c in summary["lost_clients"]}  # ranks 1 and 2 are clients 0 and 1
    assert summary["joined_clients"]
    left = subprocess.run(["pgrep", "-f", f"join {run}"], capture_output=True, text=True)
    assert left.stdout == "", left.stdout
