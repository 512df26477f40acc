"""Which peer processes are dead: a dead rank is named in about a second, not at a timeout.

MPI itself says nothing useful when a rank dies: a receive from it just never completes.
Two cheap signals do: MPICH's launcher (hydra, run with `-disable-auto-cleanup`) sends
SIGUSR1 to every surviving rank when one dies, and a rank on this host whose process id
no longer runs (or is a zombie) is dead. `PeerWatch` catches SIGUSR1 (whose default
action would kill the survivors) and looks at the process ids of the ranks on its own
host when the signal came or at least once a second. Ranks on other hosts are covered
by the drivers' stall timeouts instead. The last wait, MPI_Finalize's, is bounded by
that timeout too (`finish_within`).
"""
from __future__ import annotations

import atexit
import faulthandler
import os
import signal
import time
from typing import Callable

CHECK_EVERY_S = 1.0


class PeerDied(RuntimeError):
    """A rank this process waits for is gone."""

    def __init__(self, ranks: list[int], what: str):
        super().__init__(what)
        self.ranks = ranks


class PeerWatch:
    """Liveness of the ranks of one job, as far as this host can see it."""

    def __init__(self, ranks: list[dict], host: str):
        """`ranks`: one dict per rank with its "rank", "role", "host" and "pid"."""
        self.local = {r["rank"]: r["pid"] for r in ranks if r["host"] == host and r["pid"] != os.getpid()}
        self.names = {r["rank"]: f"rank {r['rank']} ({r['role']}, host {r['host']}, pid {r['pid']})" for r in ranks}
        self.reported: set[int] = set()
        self.alarm = False
        self.next_check = time.monotonic() + CHECK_EVERY_S
        signal.signal(signal.SIGUSR1, self._on_alarm)

    def _on_alarm(self, signum: int, frame: object) -> None:
        self.alarm = True

    def close(self) -> None:
        """Ignore the launcher's alarms from now on: Python drops its handlers at exit,
        and a late SIGUSR1 (a rank that ended first) would kill this one in MPI_Finalize."""
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)

    def check(self, peers: list[int] | None = None) -> None:
        """Raise PeerDied when one of `peers` (None: any rank not reported dead before) is dead.

        Cheap enough to call in every wait loop: it looks at processes only after an
        alarm or once per second."""
        now = time.monotonic()
        if not self.alarm and now < self.next_check:
            return
        self.alarm, self.next_check = False, now + CHECK_EVERY_S
        candidates = [r for r in self.local if r not in self.reported] if peers is None else peers
        dead = [r for r in candidates if r in self.local and not _running(self.local[r])]
        if dead:
            self.reported.update(dead)
            raise PeerDied(dead, ", ".join(self.names[r] for r in dead) + " died")


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (macOS): ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def finish_within(seconds: Callable[[], float], finalize: Callable[[], object]) -> None:
    """`finalize` (MPI_Finalize) at this process's exit, within `seconds()` (the stall
    timeout), rather than after the interpreter's end (mpi4py's), where no watchdog runs.
    It waits for every rank, under MPICH in the launcher's PMI barrier, a blocking socket
    read where no check of ours runs: a rank or launcher gone by then held a client there
    for ever (it outlived its server). Past the bound the process leaves, exit status 1,
    its stack on stderr (faulthandler's watchdog: a thread of C, which a call that holds
    the interpreter cannot stop)."""
    atexit.register(_finish, seconds, finalize)


def _finish(seconds: Callable[[], float], finalize: Callable[[], object]) -> None:
    faulthandler.dump_traceback_later(seconds(), exit=True)
    finalize()
    faulthandler.cancel_dump_traceback_later()
