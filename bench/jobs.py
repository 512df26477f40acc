"""How the bench starts its MPI jobs: on this machine, or one rank a host across `Hosts`.

One launch path for every section: `mpi` runs a benchmark module and `train_rate` an
`asgd train` run, each given where its ranks go, so the across-hosts section
(bench/hosts.py) measures with the very code the one-host sections run.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from experiments.parent.mpiexec import Launcher, find_mpiexec
from runconfig.settings import ConfigError
from rundir.durable import read_jsonl
from rundir.layout import RunDir

PYTHON = [sys.executable, "-m"]
WARMUP = 5


@dataclass(frozen=True)
class Hosts:
    """Hosts a job's ranks go round, one each in turn (rank 0 on the first), reached the
    way mpiexec reaches them: ssh, or `agent` in its place (the test cluster's
    scripts/cluster-agent); `env`: what the agent needs to find its hosts."""

    names: tuple[str, ...]
    agent: str | None = None
    env: dict[str, str] = field(default_factory=dict, hash=False)

    def part(self, first: int, count: int) -> Hosts:
        """`count` of these hosts from the `first`th, reached the same way."""
        return Hosts(self.names[first:first + count], self.agent, self.env)


def load_avg() -> float:
    """The machine's load average over the last minute (what `uptime` prints first)."""
    return round(os.getloadavg()[0], 2)


def loads_cell(loads: list[float]) -> str:
    """'1.9-3.4': the lowest and highest load average noted."""
    return f"{min(loads):.1f}-{max(loads):.1f}"


def host_flags(kind: str, hosts: Hosts) -> list[str]:
    """The launcher's flags that put one rank a host, in turn, on `hosts` (`kind` as
    `Launcher.kind` says: MPICH's hydra or Open MPI's)."""
    names = ",".join(hosts.names)
    if kind == "hydra":
        return [*(["-launcher", "ssh", "-launcher-exec", hosts.agent] if hosts.agent else []), "-hosts", names]
    if kind == "openmpi":
        return [*(["--mca", "plm_rsh_agent", hosts.agent] if hosts.agent else []), "--host", names, "--map-by", "node"]
    raise ConfigError(f"bench: hosts: only MPICH's and Open MPI's mpiexec can be told the hosts; {kind!r} cannot")


def mpiexec(ranks: int, hosts: Hosts | None = None) -> tuple[list[str], dict[str, str]]:
    """The launcher's command up to the program, and its environment: `ranks` ranks on
    this machine, or one a host in turn on `hosts`."""
    path = find_mpiexec() or "mpiexec"
    if hosts is None:
        return [path, "-n", str(ranks)], {**os.environ, "OMP_NUM_THREADS": "1"}
    launcher = Launcher.of(path)
    env = {**launcher.environment(), **hosts.env, "OMP_NUM_THREADS": "1"}
    return [path, *host_flags(launcher.kind, hosts), "-n", str(ranks)], env


def mpi(ranks: int, module: str, *args: str, timeout: float = 300, hosts: Hosts | None = None) -> Any:
    """Run a benchmark module on `ranks` MPI ranks; what rank 0 wrote to --json (across
    hosts, the temporary folder must be on a file system they share)."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "result.json"
        launch, env = mpiexec(ranks, hosts)
        subprocess.run([*launch, *PYTHON, module, *args, "--json", str(out)], check=True, timeout=timeout, env=env)
        return json.loads(out.read_text())


def ours_load(servers: int, clients: int, size: float, seconds: float, hosts: Hosts | None = None) -> dict:
    """`wire.py load` once."""
    return mpi(servers + clients, "bench.wire", "load", "--size", str(size), "--seconds", str(seconds),
               "--servers", str(servers), hosts=hosts)


def median_of(runs: list[dict]) -> dict:
    """The run with the median pushes/s: on a machine with fewer cores than ranks one
    run's rate depends on how the scheduler happened to place them."""
    runs = sorted(runs, key=lambda r: r["pushes_per_s"])
    return {**runs[len(runs) // 2], "repeats_pushes_per_s": [r["pushes_per_s"] for r in runs]}


def proxy_floats() -> int:
    """Floats in the default model (`asgd train`'s, on Fashion-MNIST's shape): a push of the proxy CNN."""
    from clients.models import build_model
    from bench.peers.setup import SHAPES
    from runconfig.settings import RunConfig

    cfg = RunConfig()
    shape, classes = SHAPES[cfg.model]
    return sum(p.numel() for p in build_model(cfg.model, shape, classes, cfg.seed).parameters())


def asgd_train(out: Path, *flags: str, timeout: float = 600, hosts: Hosts | None = None) -> dict:
    """One `asgd train` run (on this machine it starts its own MPI job; across `hosts`,
    under an mpiexec that puts the server on the first and a client on each other); its summary."""
    command = [*PYTHON, "experiments.cli", "train", "--quiet", "--out", str(out), *flags]
    launch, env = mpiexec(len(hosts.names), hosts) if hosts else ([], None)
    subprocess.run([*launch, *command], check=True, timeout=timeout, env=env)
    return RunDir(out).summary()


def timed_rate(run: Path, clients: int, steps: int, batch: int) -> float:
    """samples/s over steps WARMUP+1 .. WARMUP+steps, timed by the slowest client (as the peers are)."""
    times = {(r["client"], r["step"]): r["time"] for r in read_jsonl(run / "clients.jsonl")}
    slowest = max(times[(c, WARMUP + steps)] - times[(c, WARMUP)] for c in range(clients))
    return clients * steps * batch / slowest


def trainer(folder: str, clients: int, steps: int, batch: int, *more: str,
            hosts: Hosts | None = None) -> Callable[[], float]:
    """For a trial: each call one fresh `asgd train` run under `folder` with the peers'
    settings (and `more` flags), its samples/s (`timed_rate`)."""
    flags = ["--clients", str(clients), "--steps", str(WARMUP + steps), "--threads", "1", "--batch-size", str(batch),
             "--eval-samples", "100", *more]

    def rate() -> float:
        run = Path(tempfile.mkdtemp(dir=folder)) / "run"
        asgd_train(run, *flags, hosts=hosts)
        return timed_rate(run, clients, steps, batch)
    return rate
