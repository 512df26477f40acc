"""The test cluster (scripts/cluster.sh: hosts as network and UTS namespaces on one
machine, on a private bridge) for `asgd bench --cluster`, and why a machine cannot hold one.

The bench's cluster has names of its own (`BENCH_CLUSTER`, each overridden by the same
variable in the environment), so it never takes down one a user or the cluster tier
brought up; one already up under those names is used and left up.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from bench.jobs import Hosts

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "cluster.sh"
AGENT = ROOT / "scripts" / "cluster-agent"
BENCH_CLUSTER = {"ASGD_CLUSTER_DIR": "/run/asgd-cluster-bench", "ASGD_CLUSTER_PREFIX": "asgdb",
                 "ASGD_CLUSTER_NET": "10.231.3"}
HOSTS = 3  # the server's host and one for each of the two clients


class ClusterError(RuntimeError):
    """The test cluster could not be brought up."""


def missing(what: str = "the test cluster") -> str | None:
    """Why this machine cannot hold the test cluster (None: it can)."""
    if os.geteuid() != 0:
        return f"{what} needs root (network namespaces)"
    for tool in ("ip", "nsenter", "unshare"):
        if shutil.which(tool) is None:
            return f"{what} needs {tool} (iproute2, util-linux)"
    if subprocess.run(["ip", "netns", "list"], capture_output=True).returncode:
        return f"{what} needs 'ip netns' (iproute2 with network namespaces)"
    if not SCRIPT.exists():
        return f"{what} needs a source checkout's scripts/cluster.sh (not at {SCRIPT})"
    return None


def cluster_env() -> dict[str, str]:
    """The bench cluster's names, each as the environment sets it if it does."""
    return {name: os.environ.get(name, default) for name, default in BENCH_CLUSTER.items()}


def _script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **cluster_env()})


@contextmanager
def bench_cluster() -> Iterator[Hosts]:
    """HOSTS hosts h1.. of the test cluster, reached through its agent; brought up here
    (and taken down after, whatever happens) unless already up."""
    was_up = _script("status").returncode == 0
    up = _script("up", str(HOSTS))
    if up.returncode:
        said = (up.stderr.strip() or up.stdout.strip() or "no message").splitlines()[-1]
        raise ClusterError(f"the test cluster did not come up: {said}")
    try:
        yield Hosts(tuple(f"h{i}" for i in range(1, HOSTS + 1)), str(AGENT), cluster_env())
    finally:
        if not was_up:
            down = _script("down")
            if down.returncode:
                raise ClusterError(f"the test cluster's down failed: {down.stderr.strip()}")
