"""Faults under real mpiexec: a rank stopped, killed or failing, and what the job does.

Each test starts a job in its own session, waits until it is well under way, hurts one
rank (found by its launcher's rank variable: PMI_RANK, OMPI_COMM_WORLD_RANK or
PMIX_RANK), and checks the outcome against what the run recorded and
the line naming the rank: never against how long it took. Every wait has a generous
deadline (a hang guard only) and the job's process tree is always killed at the end.
"""
from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from experiments.parent.supervise import rank_of
from experiments.parent.tree import descendants, kill_tree
from rundir.durable import load_arrays
from tests.conftest import (BIN, LAUNCHER, MPIEXEC, Started, assert_logged_once, each_logged_once, mpi_train,
                            run_command, start)

pytestmark = [pytest.mark.mpi, pytest.mark.slow]


def rows(run: Path, log: str) -> list[dict]:
    return [json.loads(line) for line in (run / f"{log}.jsonl").read_text().splitlines()]


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def flags(tiny_npz: Path, *more: str) -> list[str]:
    # the rule these tests were written for (a version a push)
    return ["--quiet", "--data", str(tiny_npz), "--batch-size", "32", "--eval-samples", "50", "--rule", "easgd", *more]


def rank_pid(job: Started, rank: int, run: Path, pushes: int) -> int:
    """The process of `rank`, once the server has logged `pushes` rows."""
    deadline = time.monotonic() + 120  # a hang guard only
    while not (run / "server.jsonl").exists() or (run / "server.jsonl").read_bytes().count(b"\n") < pushes:
        assert job.poll() is None and time.monotonic() < deadline, "the job ended before it could be hurt"
        time.sleep(0.02)
    return next(pid for pid in descendants(job.pid) if rank_of(pid) == rank)


def hurt(job: Started, pid: int, how: signal.Signals) -> str:
    """Signal one rank; the job's stderr once it ended (a generous timeout: a hang guard)."""
    try:
        os.kill(pid, how)
        return job.communicate(timeout=180)[1]
    finally:
        kill_tree(job.pid)


def hurt_a_job(tmp_path: Path, flags: list[str], rank: int, rows_first: int,
               how: signal.Signals) -> tuple[Path, Started, str]:
    """Start `asgd train FLAGS`, hurt `rank` once the server logged `rows_first` rows.
    Launched by asgd, whose ranks write to our stderr directly (hydra may drop what it
    forwards at an abort), under -disable-auto-cleanup: the survivors name the rank."""
    run = tmp_path / "run"
    job = start([str(BIN / "asgd"), "train", *flags, "--out", str(run)])
    return run, job, hurt(job, rank_pid(job, rank, run, rows_first), how)


@pytest.mark.long
def test_a_stopped_client_is_named_after_the_stall_timeout(tmp_path, tiny_npz):
    # SIGSTOP: alive but silent, as a hung GPU driver would leave it.
    run, job, err = hurt_a_job(tmp_path, ["--clients", "2", *flags(tiny_npz, "--steps", "100000",
                                                                   "--stall-timeout", "3")], 2, 20, signal.SIGSTOP)
    assert job.returncode != 0
    assert "ClientStalled" in err and "client 1 (rank 2, host " in err and "last step" in err
    lost = [r for r in rows(run, "server") if "lost" in r]
    assert len(lost) == 1 and lost[0]["rank"] == 2 and lost[0]["kind"] == "ClientStalled"
    silent = re.search(r"silent for (\d+) s \(stall timeout 3 s\)", lost[0]["lost"])
    assert silent and int(silent[1]) >= 3, lost  # named once the timeout passed, not before
    assert summary(run)["status"].startswith("failed: ClientStalled")


@pytest.mark.long
def test_a_killed_client_ends_the_job_named_and_the_run_resumes(tmp_path, tiny_npz):
    run, job, err = hurt_a_job(tmp_path, ["--clients", "2", *flags(tiny_npz, "--steps", "200", "--eval-every", "20")],
                               2, 60, signal.SIGKILL)
    assert job.returncode != 0 and f"--resume {run}" in err
    status = summary(run)["status"]  # the server's, naming the client: not the launcher's exit status
    named = status.startswith("failed: ClientDied") and "rank 2" in status and "died" in status
    if not named and LAUNCHER.kind == "hydra":
        # hydra's known defect (the continue test's xfail says it): its proxy SIGKILLs every
        # rank when it reaps one that died of a signal, in 3 of 10 tries on a loaded 2-core
        # machine before the server can name it (docs/reliability.md): the launcher's status,
        # or the other client naming the server it saw die; the run still resumes
        server_killed = "failed: PeerDied: rank 0 (server" in status and "died" in status
        assert status.startswith("failed: the MPI job ended with exit status") or server_killed, status
    else:
        assert named and "rank 2" in err and "died" in err, status
    result = run_command([str(BIN / "asgd"), "train", "--quiet", "--resume", str(run)], timeout=180)
    assert result.returncode == 0, result.stderr
    assert_logged_once(run, clients=2, steps=200, versions=400)


@pytest.mark.parametrize("policy", ["abort", "continue"])
@pytest.mark.long
def test_a_killed_server_ends_the_job_and_the_run_resumes_with_every_push_once(tmp_path, tiny_npz, policy):
    run, job, err = hurt_a_job(tmp_path, ["--clients", "2", "--on-client-failure", policy,
                                          *flags(tiny_npz, "--steps", "200", "--eval-every", "20")],
                               0, 60, signal.SIGKILL)
    assert job.returncode != 0
    # The dead server recorded nothing: the summary is the supervisor's, naming the first
    # rank that said why it failed ("rank 1 (client 0) failed: PeerDied: rank 0 (server,
    # ...) died"), or, in about one try in four on 2 busy cores where hydra ends the
    # clients before they can say it, the launcher's exit status.
    status = summary(run)["status"]
    assert ("rank 0 (server" in status and "died" in status) or \
        status.startswith("failed: the MPI job ended with exit status"), status
    assert f"--resume {run}" in err
    result = run_command([str(BIN / "asgd"), "train", "--quiet", "--resume", str(run)], timeout=180)
    assert result.returncode == 0, result.stderr
    assert_logged_once(run, clients=2, steps=200, versions=400)


@pytest.mark.xfail(LAUNCHER.kind == "hydra", strict=False,
                   reason="known defect of hydra 5.0.2 (MPICH): its proxy SIGKILLs every surviving rank as soon as "
                   "it reaps a rank that died of a signal, -disable-auto-cleanup notwithstanding; mid-run when the "
                   "dead rank is already a zombie as the proxy handles its closed sockets (strace; a race of about "
                   "a millisecond), so in some tries the job ends with exit 9, no rank says anything, no lost row. "
                   "MPICH's own fault tolerance (MPIR_CVAR_ENABLE_FT=1) fails in MPI_Init with this wheel")
@pytest.mark.long
def test_with_continue_a_killed_client_is_recorded_and_the_run_completes(tmp_path, tiny_npz):
    run, job, err = hurt_a_job(tmp_path, ["--clients", "3", "--on-client-failure", "continue",
                                          *flags(tiny_npz, "--steps", "150")], 2, 60, signal.SIGKILL)
    assert job.returncode == 0, err
    s = summary(run)
    [lost] = s["lost_clients"]
    assert lost["client"] == 1 and lost["rank"] == 2 and "ClientDied" in lost["reason"], (lost, err)
    assert s["status"] == "complete" and s["pushes_applied"] == s["version"] == s["minibatches"], (s, err)
    ran = each_logged_once([(r["client"], r["step"]) for r in rows(run, "clients")], 3)
    assert ran[1] == lost["last_step"] and sum(ran) == 3 * 150  # the others ran its share: the run's budget


@pytest.mark.long
def test_a_whole_job_killed_mid_run_resumes_with_every_minibatch_once(tmp_path, tiny_npz):
    """mpiexec and every rank SIGKILLed, mid-write perhaps. With DC-ASGD, whose state
    (each client's pulled weights, the mean square) the resumed server must take from
    the checkpoint, and AdamW on the clients, whose state (Adam counts its steps) each
    client must get back from it, at the step the checkpoint records for that client."""
    run = tmp_path / "run"
    job = start([MPIEXEC, "-n", "4", str(BIN / "asgd"), "train", *flags(tiny_npz, "--lr", "0.01",
                 "--steps", "400", "--eval-every", "100", "--rule", "dcasgd", "--optimizer", "adamw"),
                 "--out", str(run)])
    rank_pid(job, 0, run, 450)
    kill_tree(job.pid)
    job.communicate()
    assert not (run / "summary.json").exists()
    saved = load_arrays(run / "checkpoint" / "latest.npz")
    assert {"rule.backup.0", "rule.backup.1", "rule.backup.2", "rule.meansquare"} <= set(saved)
    assert [int(saved[f"client_optimizer.{c}.state.0.step"]) for c in range(3)] == saved["tally.client_steps"].tolist()
    result = mpi_train(4, "--resume", str(run), timeout=180)
    assert result.returncode == 0, result.stderr
    ran = assert_logged_once(run, clients=3, steps=400, versions=1200)
    final = load_arrays(run / "checkpoint" / "latest.npz")
    assert [int(final[f"client_optimizer.{c}.state.0.step"]) for c in range(3)] == ran


@pytest.mark.long
def test_with_continue_a_failing_client_is_recorded_and_the_run_completes(tmp_path, tiny_npz):
    run = tmp_path / "run"
    result = run_command([str(BIN / "asgd"), "train", "--clients", "2", "--on-client-failure", "continue",
                          "--inject-fault", "2:7", *flags(tiny_npz, "--steps", "60"), "--out", str(run)],
                         timeout=120)
    assert result.returncode == 0, result.stderr
    s = summary(run)
    assert s["status"] == "complete"
    assert s["lost_clients"] == [{"client": 1, "rank": 2, "last_step": 6, "reason": s["lost_clients"][0]["reason"]}]
    assert "InjectedFault" in s["lost_clients"][0]["reason"]
    assert s["minibatches"] == 2 * 60  # the run's budget: client 0 ran the lost client's share as well


def test_with_continue_two_sharded_servers_following_the_pace_go_on_without_a_failing_client(tmp_path, tiny_npz):
    """Server 0 decides when each client is answered and server 1 follows it
    (paramserver/drivers/follow.py); both lose the client, each when it hears, and go on."""
    run = tmp_path / "run"
    result = run_command([str(BIN / "asgd"), "train", "--clients", "3", "--servers", "2", "--on-client-failure",
                          "continue", "--inject-fault", "3:7", *flags(tiny_npz, "--steps", "40"), "--rule", "fresh",
                          "--fresh-reply", "auto", "--out", str(run)], timeout=120)
    assert result.returncode == 0, result.stderr
    s = summary(run)
    assert s["status"] == "complete" and [c["rank"] for c in s["lost_clients"]] == [3]
    assert s["minibatches"] == 3 * 40


@pytest.mark.parametrize("mode", ["sync", "local-sgd"])
@pytest.mark.long
def test_a_failing_rank_in_a_collective_mode_is_recorded_and_ends_the_job(tmp_path, tiny_npz, mode):
    run = tmp_path / "run"
    result = run_command([str(BIN / "asgd"), "train", "--clients", "3", "--mode", mode, "--inject-fault", "2:5",
                          *flags(tiny_npz, "--steps", "40"), "--out", str(run)], timeout=120)
    assert result.returncode != 0
    assert "rank 2 (client 2) failed: InjectedFault" in result.stderr
    status = summary(run)["status"]  # written by rank 0, which heard of it from rank 2
    assert status.startswith("failed: PeerFailed: rank 2 failed: InjectedFault")
