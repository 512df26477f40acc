"""`asgd` commands started as forks of a process that has already imported torch and the tool.

A sweep runs each point as its own `asgd train` process, so that a point that crashes,
hangs or is killed takes nothing else with it. Started with `python -m experiments.cli`
each point first spent about 2 s of CPU importing torch (measured on the project's
2-core machine), most of a small simulated point's time. Here one server process
(`multiprocessing`'s forkserver, started on the first point, single-threaded) imports
them once and forks each point from itself: a process of its own as before, in a session
of its own, with the caller's working directory and environment of the moment it is
started (not the server's: a sweep started from a notebook or a test sees the variables
set since), its stdout discarded (or kept, as the tests keep their commands') and its
stderr kept in a file the caller names, in the caller's working directory or another.
Its command line is the server's; its name (`ps -o comm`, top) says `asgd train`.

A point ends with the process that started it: it gets SIGTERM when the server ends
(Linux's parent-death signal), and the server ends when the last process that asked it
for forks does, even by SIGKILL; `asgd train` then ends as on Ctrl-C, its job with it.
"""
from __future__ import annotations

import ctypes
import importlib
import multiprocessing
import multiprocessing.connection
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from experiments.parent.lifeline import die_with

PR_SET_NAME = 15
# what the server imports before it forks: all a point would import first
PRELOAD = ["torch", "experiments.cli", "clients.user.check", "experiments.run.inputs", "experiments.sim.simulator"]
# multiprocessing reads a fork's exit status from the server without a lock, and every
# Process.start() reads those of all ended forks: two threads reading one status at once
# leave one of them an EOF, which it records as exit 255 (measured: 3 of 200 forks started
# and waited for from 4 threads). Starts and reads of a status take this lock.
_STATUS = threading.Lock()


class Forked:
    """One started command: `pid`, `wait()`, then `stderr` (and `stdout`)."""

    def __init__(self, module: str, argv: list[str], stderr: Path, stdout: Path | None = None,
                 cwd: str | Path | None = None):
        """`python -m MODULE ARGV...` (the module's `main(argv)`), forked, its stderr
        written to the file `stderr` (and kept there), its stdout to `stdout` (else
        discarded), run in `cwd` (else the caller's working directory)."""
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)
        for path in (stderr, stdout):
            if path is not None:
                path.write_bytes(b"")
        self.stderr_path, self.stdout_path = stderr, stdout
        self.stderr = self.stdout = ""
        self.process = context.Process(target=_run, args=(module, argv, str(cwd or os.getcwd()), dict(os.environ),
                                                          str(stderr), str(stdout or os.devnull)))
        with _STATUS:
            self.process.start()
        self.pid: int = self.process.pid

    def wait(self, timeout: float | None = None) -> int:
        """The exit status (negative: the signal that ended it), once it has ended and its
        stderr (and stdout, where kept) is read; raises subprocess.TimeoutExpired if it
        runs past `timeout`. Safe from two threads at once (a sweep's point and its
        Ctrl-C), as Popen.wait is, and beside other threads' forks: the status is read from
        the server once."""
        if not multiprocessing.connection.wait([self.process.sentinel], timeout):
            raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
        with _STATUS:
            self.process.join()
            self.stderr = self.stderr_path.read_text(errors="replace")
            if self.stdout_path is not None:
                self.stdout = self.stdout_path.read_text(errors="replace")
        return self.process.exitcode


def _run(module: str, argv: list[str], cwd: str, environ: dict[str, Any], stderr: str, stdout: str) -> None:
    """In the fork: become the caller's command (see the module docstring), then run it."""
    os.setsid()
    _let_the_server_end()
    die_with(os.getppid())
    if sys.platform.startswith("linux"):  # the name ps and top show
        ctypes.CDLL(None).prctl(PR_SET_NAME, ctypes.c_char_p(b"asgd " + argv[0].encode()[:10]), 0, 0, 0)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(environ)
    for fd, path in ((1, stdout), (2, stderr)):
        opened = os.open(path, os.O_WRONLY)
        os.dup2(opened, fd)
        os.close(opened)
    sys.exit(importlib.import_module(module).main(argv))


def _let_the_server_end() -> None:
    """Close the fork's copy of the pipe whose last writer's end ends the server: every
    fork inherits one (so that it may fork in turn), which would keep the server, and so
    every point, alive after the sweep was killed."""
    from multiprocessing import forkserver

    server = forkserver._forkserver  # noqa: SLF001 (the standard library's one server)
    if server._forkserver_alive_fd is not None:  # noqa: SLF001
        os.close(server._forkserver_alive_fd)  # noqa: SLF001
        server._forkserver_alive_fd = None  # noqa: SLF001
