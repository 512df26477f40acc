"""Ranks forked from a preloaded server (tests/preloaded.py): a stand-in's command run by
a fork of the server, in the stand-in's directory, environment and descriptors, ending
as the rank ends; the rank ends with its stand-in; without a server the stand-in is the
command."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from experiments.parent.tree import alive, descendants
from tests import preloaded
from tests.conftest import rank_server

# Fixed simulated times: a measured step on a busy host warns on stderr, which the first test reads.
SIM = ["train", "--backend", "sim", "--quiet", "--batch-size", "32", "--rule", "add", "--eval-samples", "50",
       "--sim-step-time", "0.01", "--sim-apply-time", "0.001"]


def stand_in(argv: list[str], cwd: Path, **environ: str) -> subprocess.Popen:
    """`asgd ARGV` run by a rank the session's server forks."""
    environ = {**os.environ, preloaded.SOCKET: rank_server().socket, **environ}
    return subprocess.Popen(preloaded.command(argv), cwd=cwd, env=environ,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_forked_rank_runs_in_the_stand_ins_directory_environment_and_stdio(tmp_path, tiny_npz):
    server = rank_server()
    done = stand_in([*SIM, "--data", str(tiny_npz), "--steps", "4", "--out", "run"], tmp_path,
                    ASGD_KERNEL_CACHE=str(tmp_path / "kernels"))
    assert done.communicate(timeout=120)[1] == "" and done.returncode == 0
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "complete"
    assert list((tmp_path / "kernels").iterdir()), "the rank did not see the stand-in's environment"
    refused = stand_in([*SIM, "--data", str(tiny_npz), "--lr", "-1"], tmp_path)
    assert refused.communicate(timeout=120)[1] == "asgd: error: lr: must be positive, got -1.0\n"
    assert refused.returncode == 2
    assert not descendants(server.pid), "a rank outlived its stand-in"


def test_a_stand_in_passes_sigterm_on_and_ends_as_its_rank_did(tmp_path, tiny_npz):
    rank_server()
    run = tmp_path / "run"
    running = stand_in([*SIM, "--data", str(tiny_npz), "--steps", "100000", "--out", str(run)], tmp_path)
    wait_for(lambda: (run / "server.jsonl").exists())
    running.send_signal(signal.SIGTERM)
    running.communicate(timeout=60)
    assert running.returncode == 130
    assert json.loads((run / "summary.json").read_text())["status"] == "failed: interrupted (SIGTERM)"


def test_a_rank_ends_with_its_stand_in_even_by_sigkill(tmp_path, tiny_npz):
    server = rank_server()
    run = tmp_path / "run"
    running = stand_in([*SIM, "--data", str(tiny_npz), "--steps", "100000", "--out", str(run)], tmp_path)
    try:
        wait_for(lambda: (run / "server.jsonl").exists())
        [rank] = descendants(server.pid)
    finally:
        running.kill()  # the job trains until it is stopped: never left behind
        running.communicate(timeout=60)
    wait_for(lambda: not alive(rank), timeout=10)


def test_without_a_server_the_stand_in_is_the_command_itself(tmp_path, tiny_npz):
    refused = subprocess.run(preloaded.command([*SIM, "--data", str(tiny_npz), "--lr", "-1"]), cwd=tmp_path,
                             env={**os.environ, preloaded.SOCKET: str(tmp_path / "no-server")},
                             capture_output=True, text=True, timeout=120)
    assert (refused.returncode, refused.stderr) == (2, "asgd: error: lr: must be positive, got -1.0\n")
