"""The parent's side of a launch, without MPI: which launcher a `mpiexec` is, what each
is told, and the ranks' check that an inherited descriptor is still the one handed on."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from experiments.parent import supervise, tree
from experiments.parent.mpiexec import Launcher
from rundir.layout import RunDir

VERSIONS = {"hydra": "HYDRA build details:\n    Version:  5.0.2\n",
            "openmpi": "mpiexec (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/community/help/\n",
            "openmpi4": "mpiexec (OpenRTE) 4.1.6\n",
            "other": "Intel(R) MPI Library for Linux* OS, Version 2021.10\n"}


def fake_mpiexec(tmp_path: Path, says: str) -> str:
    path = tmp_path / "mpiexec"
    path.write_text(f"#!/bin/sh\ncat <<'END'\n{says}END\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize("which, kind, flags", [
    ("hydra", "hydra", ["-disable-auto-cleanup"]),
    ("openmpi", "openmpi", ["--with-ft", "ulfm", "--prtemca", "state_base_error_non_zero_exit", "0"]),
    ("openmpi4", "openmpi", []),  # no ULFM before Open MPI 5
    ("other", "other", []),
])
def test_each_launcher_is_told_what_keeps_a_job_past_a_dead_rank(tmp_path, which, kind, flags):
    launcher = Launcher.of(fake_mpiexec(tmp_path, VERSIONS[which]))
    assert launcher.kind == kind and launcher.flags() == flags
    command = launcher.command(3, ["train", "--clients", "2"])
    assert command[:len(flags) + 3] == [launcher.path, *flags, "-n", "3"]
    assert command[-3:] == ["train", "--clients", "2"]


def test_open_mpi_gets_its_root_and_oversubscription_variables_and_the_users_win(tmp_path, monkeypatch):
    monkeypatch.setenv("PRTE_MCA_rmaps_default_mapping_policy", "core")
    env = Launcher.of(fake_mpiexec(tmp_path, VERSIONS["openmpi"])).environment()
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == "1" and env["PRTE_MCA_rmaps_default_mapping_policy"] == "core"
    assert Launcher.of(fake_mpiexec(tmp_path, VERSIONS["hydra"])).environment() == dict(os.environ)


def test_a_rank_takes_only_the_descriptors_the_supervisor_handed_on(tmp_path):
    read, write = os.pipe()
    other = os.open(tmp_path / "other", os.O_WRONLY | os.O_CREAT)
    spec = supervise._identity(write)
    assert supervise._inherited(spec) == write
    os.close(write)
    assert supervise._inherited(spec) is None  # closed (Open MPI's launcher closes them)
    os.dup2(other, write)  # the number reused for something else (Open MPI's runtime does)
    try:
        assert supervise._inherited(spec) is None
    finally:
        for fd in (other, write, read):
            os.close(fd)


def test_a_launcher_left_without_ranks_is_killed_and_one_that_ends_keeps_its_status(monkeypatch):
    monkeypatch.setattr(supervise, "STOP_GRACE_S", 0.5)
    # a "launcher" whose one rank (PMI_RANK set) ends while it waits on forever
    stuck = subprocess.Popen(["sh", "-c", "PMI_RANK=0 sleep 1.5 & exec sleep 3600"])
    try:
        assert supervise._wait(stuck) == -signal.SIGKILL
    finally:
        stuck.kill()
    ends = subprocess.Popen(["sh", "-c", "PMI_RANK=0 sleep 1.2 & wait; exit 3"])
    assert supervise._wait(ends) == 3


def test_a_started_run_that_did_not_finish_failed_whatever_the_launchers_status(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")
    said = "rank 1 (client 0) failed: PeerDied: rank 0 (server, host vm, pid 9) died"
    assert supervise._outcome(RunDir(tmp_path), 0, False, said) == 1  # Open MPI under ULFM ended 0
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == f"failed: {said}"
    # the last line says why, as the run recorded it, whether or not the rank's own came through
    assert capsys.readouterr().err == f"asgd: run {tmp_path} failed: {said}\n"
    assert supervise._outcome(RunDir(tmp_path / "never started"), 0, False, None) == 0


def test_kill_tree_leaves_nothing_of_a_tree_that_keeps_starting_processes():
    """A parent starting a child every few ms (as a sweep starts its next point): none
    started between the listing and the kill survives, and all are gone on return."""
    marker = "29.0417"  # a sleep no other process has
    spawner = subprocess.Popen([sys.executable, "-c", "import subprocess, time\nwhile True:\n"
                                f"    subprocess.Popen(['sleep', '{marker}'])\n    time.sleep(0.003)"],
                               start_new_session=True)
    deadline = time.monotonic() + 30  # a hang guard
    while len(tree.descendants(spawner.pid)) < 20 and time.monotonic() < deadline:
        time.sleep(0.01)
    tree.kill_tree(spawner.pid)
    spawner.wait(timeout=30)
    left = [p for p in Path("/proc").glob("[0-9]*/cmdline") if _reads(p).split(b"\0")[1:2] == [marker.encode()]]
    assert left == []


def _reads(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


@pytest.mark.parametrize("command,status", [("exit 3", 3), ("kill -TERM $$", -signal.SIGTERM),
                                            ("kill -KILL $$", -signal.SIGKILL)])
def test_the_lifeline_ends_as_its_command_did(command, status):
    """The supervisor reads the launcher's exit status through the lifeline between them."""
    from experiments.parent.lifeline import lifeline

    assert subprocess.run(lifeline(["sh", "-c", command]), timeout=30).returncode == status
