"""Run a command that dies with the process that started it.

    python -m experiments.parent.lifeline PARENT_PID COMMAND [ARGS...]

Linux's parent-death signal (`prctl(PR_SET_PDEATHSIG)`) survives `exec`: the command
gets SIGTERM when its parent ends, even by SIGKILL. `asgd train` starts the MPI
launcher this way (which passes the SIGTERM on to every rank) and `asgd sweep` its
points, so no job outlives the command the user typed. Elsewhere (macOS) the command
just runs; the ranks' own watch for a vanished server still ends a job there.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


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


def main(argv: list[str]) -> None:
    parent, command = int(argv[0]), argv[1:]
    die_with(parent)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
