"""Run a command that ends, with every process it started, when the process that started it does.

    python -m experiments.parent.lifeline PARENT_PID COMMAND [ARGS...]

`asgd train` starts the MPI launcher this way, so no process of a job outlives the
command the user typed, even one SIGKILLed. Linux's parent-death signal
(`prctl(PR_SET_PDEATHSIG)`) survives `exec`, but a launcher given it may still leave
processes behind: MPICH's hydra, sent SIGTERM, has now and then not passed it on, and
its ranks run in sessions of their own, so a process group misses them. So this process
stays between the parent and the command, and is the command's subreaper
(`PR_SET_CHILD_SUBREAPER`): every process below it stays below it, whoever of their
parents ends first. When the parent is gone it passes SIGTERM to the command (the
launcher forwards it to every rank, which records the run interrupted), and whatever
is left below it `STOP_GRACE_S` later it kills (experiments/parent/tree.py). A SIGTERM
or SIGINT from the parent while it lives (the supervisor stopping the job) is passed on
to the command; it exits as the command did. Elsewhere (macOS) the command just runs;
the ranks' own watch for a vanished server still ends a job there.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

from experiments.parent.tree import descendants, kill_tree

PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36
STOP_GRACE_S = 10.0  # how long a job has to end on SIGTERM before what is left is killed
WATCHED = {signal.SIGTERM, signal.SIGINT, signal.SIGCHLD}


def lifeline(command: list[str]) -> list[str]:
    """`command`, made to end when this process (this thread) ends."""
    return [sys.executable, "-m", "experiments.parent.lifeline", str(os.getpid()), *command]


def die_with(parent: int) -> None:
    """From now on this process gets SIGTERM when `parent` (its parent now) ends; it
    exits 143 at once if that already happened. Linux only; elsewhere nothing."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # it died before the signal was armed
            os._exit(143)


def start(command: list[str]) -> int:
    """`command` forked and exec'd with the signals as this process found them."""
    child = os.fork()
    if child == 0:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, WATCHED)
        try:
            os.execvp(command[0], command)
        except OSError as error:
            print(f"asgd: lifeline: cannot run {command[0]}: {error}", file=sys.stderr, flush=True)
        os._exit(127)
    return child


class Watch:
    """The command's life from here: signals passed on, children reaped, and once the
    parent is gone, the tree below ended."""

    def __init__(self, parent: int, child: int):
        self.parent, self.child = parent, child
        self.status: int | None = None  # the command's wait status, once it ended
        self.orphaned_at: float | None = None

    def run(self) -> int:
        """Until the command ended (or, the parent gone, everything below): its wait status."""
        while True:
            info = signal.sigtimedwait(WATCHED, 1.0 if self.orphaned_at is None else 0.05)
            if info is not None and info.si_signo != signal.SIGCHLD:
                self._pass_on(info.si_signo)
            if self.orphaned_at is None and os.getppid() != self.parent:
                self._pass_on(signal.SIGTERM)  # the parent-death signal may have come before it was armed
            self._reap()
            if self.orphaned_at is None:
                if self.status is not None:
                    return self.status
            elif not descendants(os.getpid()):
                return self.status if self.status is not None else 143 << 8
            elif time.monotonic() - self.orphaned_at > STOP_GRACE_S:
                for pid in descendants(os.getpid()):
                    kill_tree(pid)

    def _pass_on(self, signo: int) -> None:
        if os.getppid() != self.parent:
            if self.orphaned_at is not None:
                return
            self.orphaned_at, signo = time.monotonic(), signal.SIGTERM
        if self.status is None:
            os.kill(self.child, signo)

    def _reap(self) -> None:
        """Every child that ended (the command, or one it left to us), reaped."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.child:
                self.status = status


def exit_as(status: int) -> None:
    """Exit as a process with this wait status did: its code, or killed by its signal."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # whose action is not ours to set
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)  # a signal whose default is to go on
    os._exit(os.waitstatus_to_exitcode(status))


def main(argv: list[str]) -> None:
    parent, command = int(argv[0]), argv[1:]
    if not sys.platform.startswith("linux"):
        os.execvp(command[0], command)
    signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED)  # taken by sigtimedwait, never lost between two looks
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    die_with(parent)
    exit_as(Watch(parent, start(command)).run())


if __name__ == "__main__":
    main(sys.argv[1:])
