"""Churn for a joinable run: joiners that fail at random and come back after a repair time.

    python scripts/churn.py RUN_DIR [--joiners N] [--mtbf S] [--repair S] [--seed 0]
                            [--launch "srun -n 1"] [--ranks]

Waits for the run's door (RUN_DIR/door.json: the run was started with `--joinable` over
MPI), starts N `asgd join RUN_DIR` processes and keeps N running while the run serves:
each, once it has joined (its start-up, importing torch and loading the data, is not
its time as a client), fails after an exponential time of mean `--mtbf` seconds (drawn
from `--seed`), is killed with SIGKILL, process group and all, as a preempted node would
be, and a new joiner starts `--repair` seconds later. The server sees each kill as a lost client, and
each new joiner takes a lost client's shard where its pushes left it (docs/joining.md).
Ends when the run has finished (its summary.json) or its door is gone, every joiner it
started gone with it, and prints what it did and when each joiner joined (where a
kill's down time ends), a line an event. `--launch` prefixes each
joiner's command (a Slurm step on another node, say); by default it runs here.

With `--ranks` the run's own client ranks on this host fail too (config.json's record of
its ranks: their process ids), each after an exponential time of the same mean from when
the door opened, SIGKILLed alone, and a joiner starts `--repair` seconds after each. Only
under Open MPI 5, whose launcher (`--with-ft ulfm`, as `asgd train` starts it) keeps the
job going without a killed rank: under MPICH's a rank killed by a signal can end the
whole job (docs/reliability.md), so `--ranks` is refused there, one line and exit 2.

Across hosts "this host" is the one this script runs on, by its host name as config.json
records each rank's: run it on the node whose ranks should fail (ssh NODE python
scripts/churn.py ...). A joiner is killed by its process group here, so one `--launch`
starts elsewhere dies with it only where the launcher keeps it in that group (the test
cluster's scripts/cluster-agent does; ssh without a terminal would not):
tests/cluster/test_churn.py.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

POLL_S = 0.05


def _asgd() -> str:
    beside = Path(sys.executable).with_name("asgd")
    return str(beside) if beside.exists() else "asgd"


class Joiner:
    """One `asgd join` process; its failure is due `life` seconds after it said it joined."""

    def __init__(self, command: list[str], life: float):
        self.proc = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        self.life, self.fails_at, self.client, self.told = life, None, "not joined", False
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line.strip())
            joined = re.search(r"joined .* as (client \d+)", line)
            if joined and self.fails_at is None:
                self.client, self.fails_at = joined[1], time.monotonic() + self.life


def client_ranks(run: Path) -> list[tuple[int, int]]:
    """(rank, process id) of the run's client ranks on this host, as config.json records
    them; refused (ValueError, one line) where the job's launcher may end the whole job
    when one is killed."""
    config = json.loads((run / "config.json").read_text())
    provenance = config.get("provenance", {})
    if not str(provenance.get("mpi_library", "")).startswith("Open MPI v5"):
        raise ValueError(f"--ranks: {run} runs under {provenance.get('mpi_library', 'no MPI')!r}; only Open MPI 5's "
                         "launcher keeps a job going when a rank is killed (docs/reliability.md)")
    host = socket.gethostname()
    return [(r["rank"], r["pid"]) for r in provenance.get("ranks", []) if r.get("role") == "client"
            and r.get("host") == host and "pid" in r]


class Churn:
    def __init__(self, run: Path, joiners: int, mtbf: float, repair: float, seed: int, launch: list[str],
                 ranks: bool = False):
        self.run, self.joiners, self.mtbf, self.repair, self.launch = run, joiners, mtbf, repair, launch
        self.fail_ranks = ranks
        self.draw = random.Random(seed)
        self.running: dict[int, Joiner] = {}
        self.due: list[float] = []  # when the next joiners start (after a repair)
        self.start = time.monotonic()
        self.kills = self.started = 0
        self.ranks: list[tuple[int, int, float]] = []  # the job's client ranks to fail: (rank, pid, when)

    def say(self, what: str) -> None:
        print(f"churn {time.monotonic() - self.start:7.2f} s: {what}", flush=True)

    def serving(self) -> bool:
        return (self.run / "door.json").exists() and not (self.run / "summary.json").exists()

    def spawn(self) -> None:
        joiner = Joiner([*self.launch, _asgd(), "join", str(self.run)], self.draw.expovariate(1 / self.mtbf))
        self.running[joiner.proc.pid] = joiner
        self.started += 1
        self.say(f"joiner pid {joiner.proc.pid} started")

    def step(self) -> None:
        now = time.monotonic()
        for rank, pid, when in [r for r in self.ranks if r[2] <= now]:
            self.ranks.remove((rank, pid, when))
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:  # it had ended: the run is done with it
                continue
            self.kills += 1
            self.due.append(now + self.repair)
            self.say(f"rank {rank} (pid {pid}) killed (SIGKILL); a joiner in {self.repair:g} s")
        for pid, joiner in list(self.running.items()):
            if joiner.fails_at is not None and not joiner.told:  # its down time ends here
                joiner.told = True
                self.say(f"joiner pid {pid} joined as {joiner.client}")
            if joiner.proc.poll() is not None:
                del self.running[pid]
                joiner.reader.join()
                last = f": {joiner.lines[-1]}" if joiner.lines else ""
                self.say(f"joiner pid {pid} ended, exit {joiner.proc.returncode}{last}")
            elif joiner.fails_at is not None and now >= joiner.fails_at:
                os.killpg(pid, signal.SIGKILL)
                joiner.proc.wait()
                del self.running[pid]
                self.kills += 1
                self.due.append(now + self.repair)
                self.say(f"joiner pid {pid} ({joiner.client}) killed (SIGKILL); another in {self.repair:g} s")
        for when in [w for w in self.due if w <= now]:
            self.due.remove(when)
            if self.serving():
                self.spawn()

    def churn(self) -> int:
        while not self.serving():
            if (self.run / "summary.json").exists():
                print(f"churn: {self.run} has finished", file=sys.stderr)
                return 2
            time.sleep(POLL_S)
        if self.fail_ranks:  # config.json records the ranks once the job runs, as its door shows
            try:
                ranks = client_ranks(self.run)
            except (OSError, ValueError) as error:
                print(f"churn: {error}", file=sys.stderr)
                return 2
            now = time.monotonic()
            self.ranks = [(rank, pid, now + self.draw.expovariate(1 / self.mtbf)) for rank, pid in ranks]
        for _ in range(self.joiners):
            self.spawn()
        while self.serving() or self.running:
            self.step()
            time.sleep(POLL_S)
        summary = self.run / "summary.json"
        status = json.loads(summary.read_text()).get("status") if summary.exists() else "no summary"
        self.say(f"the run ended ({status}): {self.started} joiners started, {self.kills} killed")
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="the run directory of a run started with --joinable over MPI")
    parser.add_argument("--mtbf", type=float, default=30.0, help="a joiner's mean seconds between failures")
    parser.add_argument("--repair", type=float, default=5.0, help="seconds from a kill to its replacement's start")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--launch", default="", help="a prefix for each joiner's command, e.g. 'srun -n 1'")
    parser.add_argument("--ranks", action="store_true", help="the run's client ranks on this host fail too (Open MPI)")
    parser.add_argument("--joiners", type=int, default=1, help="joiners kept running (default 1; 0 with --ranks)")
    args = parser.parse_args(argv)
    if args.joiners < (0 if args.ranks else 1) or args.mtbf <= 0 or args.repair < 0:
        parser.error("--joiners must be at least 1 (0 with --ranks), --mtbf positive, --repair not negative")
    return Churn(args.run, args.joiners, args.mtbf, args.repair, args.seed, shlex.split(args.launch),
                 args.ranks).churn()


if __name__ == "__main__":
    sys.exit(main())
