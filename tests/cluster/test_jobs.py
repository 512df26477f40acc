"""Jobs across hosts over TCP, under each MPI, started as a user's `mpiexec` starts them
(every rank exec'd on its host through the launcher agent): to completion, every push
applied once and every (client, step) logged once, each rank's host and local rank in
the provenance."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import ROOT

from tests.cluster.conftest import AGENT, CLUSTER_ENV, assert_counts, assert_placed, cluster_command, run_job

TRAIN = ["--batch-size", "32", "--steps", "20", "--n-sync", "2", "--threads", "1", "--quiet"]


def test_one_server_and_four_clients_on_three_hosts(cluster, mpi, tmp_path, tiny_npz):
    run, placement = tmp_path / "run", {"h1": 2, "h2": 2, "h3": 1}
    result = run_job([*mpi.mpiexec(placement, 5), mpi.bin / "asgd", "train", "--data", tiny_npz, *TRAIN,
                      "--out", run], mpi.env(cluster), timeout=120)
    assert result.returncode == 0, result.stderr
    assert_counts(run, clients=4, steps=20, n_sync=2)
    ranks = assert_placed(run, placement)
    assert [(r["role"], r["host"]) for r in ranks] == \
        [("server", "h1"), ("client", "h2"), ("client", "h3"), ("client", "h1"), ("client", "h2")]


def test_two_servers_on_two_hosts(cluster, mpi, tmp_path, tiny_npz):
    run, placement = tmp_path / "run", {"h1": 2, "h2": 2}
    result = run_job([*mpi.mpiexec(placement, 4), mpi.bin / "asgd", "train", "--data", tiny_npz, "--servers", "2",
                      *TRAIN, "--out", run], mpi.env(cluster), timeout=120)
    assert result.returncode == 0, result.stderr
    assert_counts(run, clients=2, steps=20, n_sync=2)
    ranks = assert_placed(run, placement)
    assert [(r["role"], r["host"]) for r in ranks[:2]] == [("server", "h1"), ("server", "h2")]


def test_a_users_script_across_hosts(cluster, mpi, tmp_path):
    run, placement = tmp_path / "run", {"h1": 1, "h2": 1, "h3": 1}
    env = {**mpi.env(cluster), "EXAMPLE_DATA": "generated", "EXAMPLE_LIMIT": "256"}
    script = [mpi.bin / "python", ROOT / "examples" / "fashion_resnet.py", "--steps", "4",
              "--batch-size", "16", "--eval-samples", "64", "--eval-every", "100", "--threads", "1", "--quiet"]
    result = run_job([*mpi.mpiexec(placement, 3), *script, "--out", run], env, timeout=180)
    assert result.returncode == 0, result.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["minibatches"] == 8
    assert [r["host"] for r in assert_placed(run, placement)] == ["h1", "h2", "h3"]


def test_the_agent_refuses_an_unknown_host_in_one_line(cluster):
    result = subprocess.run([str(AGENT), "-x", "h9", "true"], capture_output=True, text=True, timeout=30,
                            env=cluster.env)
    assert result.returncode == 255
    assert result.stderr == "cluster-agent: unknown host 'h9' (the cluster's hosts: h1 h2 h3)\n"


def test_the_agent_runs_a_command_on_its_host_as_ssh_does(cluster):
    # ssh joins the words and a shell runs them there: $(hostname) is the host's, h3 its neighbour
    result = subprocess.run([str(AGENT), "h2", "echo", "$(hostname)", "&&", sys.executable, "-c",
                             "'import socket; print(socket.gethostbyname(\"h3\"))'"],
                            capture_output=True, text=True, timeout=30, env=cluster.env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["h2", f"{CLUSTER_ENV['ASGD_CLUSTER_NET']}.3"]


def test_up_and_down_twice_leave_nothing_behind(cluster):
    """A cluster of its own beside the session's: up twice, down twice, then no namespace,
    interface, hosts file or state of it left."""
    own = {"ASGD_CLUSTER_DIR": "/run/asgd-cluster-twice", "ASGD_CLUSTER_PREFIX": "asgdw",
           "ASGD_CLUSTER_NET": "10.231.2"}
    before = _network()
    try:
        first, second = cluster_command("up", "2", env=own), cluster_command("up", "2", env=own)
        assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
        assert second.stdout == "cluster: already up with 2 hosts\n"
        assert cluster_command("up", "3", env=own).returncode == 2  # another size: down first
        namespaces, links = _network()
        assert {"asgdw-h1", "asgdw-h2"} <= namespaces and {"asgdw-br", "asgdw-h1-v", "asgdw-h2-v"} <= links
    finally:
        downs = [cluster_command("down", env=own) for _ in range(2)]
    assert [d.returncode for d in downs] == [0, 0], downs[0].stderr + downs[1].stderr
    assert _network() == before
    assert not os.path.exists(own["ASGD_CLUSTER_DIR"]) and not os.path.exists("/etc/netns/asgdw-h1")


def _network() -> tuple[set[str], set[str]]:
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    return ({line.split()[0] for line in namespaces.splitlines() if line.strip()},
            {line.split(":")[1].strip().split("@")[0] for line in links.splitlines()})
