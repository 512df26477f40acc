"""A test fixture: ranks forked from a server that imported torch once, for the test
suite, which starts many small jobs through `mpiexec`. Not part of the package.

    ASGD_RANK_SERVER=SOCKET python -m tests.preloaded --serve   # the server (in the checkout)
    mpiexec -n K python tests/preloaded.py train ...            # each rank: `asgd train ...`

A rank started as `asgd train` first imports torch, most of a small job's CPU time
(docs/architecture.md, "Tests, by tier", gives the measure). Here the process the
launcher starts is a stand-in that imports only the standard library: it hands its command line, environment, working
directory and every descriptor it holds (its stdio, the launcher's PMI socket) over the
Unix socket `$ASGD_RANK_SERVER` to the server, which forks the rank from itself; the rank
takes them on at the same numbers and runs `experiments.cli.main`, as `asgd` would have,
MPI and all. The stand-in passes on the signals a launcher sends and ends as the rank
ended (its exit status, or its signal), which the server reports; the rank kills itself
the moment its stand-in is gone (SIGKILL included). Where no server answers, the
stand-in becomes `python -m experiments.cli` itself.

What is not as with an exec'd rank: the rank is the server's child, not the launcher's
(a walk down the process tree from mpiexec finds the stand-ins), and the kernel's record
of its environment (/proc/PID/environ) is the server's, while its `os.environ` is the
stand-in's; and a launcher that kills its ranks when one ends (hydra without
`-disable-auto-cleanup`) may report one with the SIGKILL its rank got rather than its own.
So it suits jobs nobody inspects as processes: the tests fork only the ranks of the jobs
they launch as a user types `mpiexec -n K asgd train` under MPICH (tests/conftest.py:
`mpi_train`); the tests of faults, signals and locks start exec'd ranks, as `asgd train`
does for a user.
"""
from __future__ import annotations

import fcntl
import importlib
import json
import os
import select
import signal
import socket
import struct
import sys
import threading
from pathlib import Path

SOCKET = "ASGD_RANK_SERVER"
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
             signal.SIGCONT, signal.SIGALRM)
HIGH_FD = 1024  # where a forked rank parks descriptors while it takes the stand-in's numbers
NUMBER = struct.Struct("q")


def command(argv: list[str]) -> list[str]:
    """What a launcher runs, a rank each, for `asgd ARGV`: this file by its path, as the
    tests are not installed and a rank may start in any directory."""
    return [sys.executable, str(Path(__file__).resolve()), *argv]


def stand_in(argv: list[str]) -> int:
    """The launcher's process: have the server fork the rank, then be it to the launcher."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(os.environ[SOCKET])
    except (OSError, KeyError):
        conn.close()
        os.execv(sys.executable, [sys.executable, "-m", "experiments.cli", *argv])
    fds = [fd for fd in _open_fds() if fd != conn.fileno()]
    request = json.dumps({"argv": argv, "cwd": os.getcwd(), "environ": dict(os.environ), "fds": fds}).encode()
    socket.send_fds(conn, [NUMBER.pack(len(request))], fds)
    conn.sendall(request)
    pid = _number(conn)
    for number in FORWARDED:
        signal.signal(number, lambda signum, _frame: _signal(pid, signum))
    try:
        status = _number(conn)
    except EOFError:  # the server is gone: the rank may not be
        while _signal(pid, 0):
            select.select([], [], [], 0.1)
        print(f"asgd: the rank server ended before rank process {pid}; its status is unknown",
              file=sys.stderr)
        return 1
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def serve(path: str) -> dict:
    """Fork a rank for each stand-in that connects to `path`, report each one's end to its
    stand-in; returns only in a forked rank: what its stand-in sent."""
    from experiments.parent.forked import PRELOAD  # what an `asgd` command imports first
    from experiments.parent.lifeline import die_with

    die_with(os.getppid())
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)  # stand-ins may connect now: they wait for the imports below
    for module in (*PRELOAD, "experiments.rank.entry"):
        importlib.import_module(module)
    ranks: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, the stand-in's connection)
    while True:
        for ready in select.select([listener, *ranks], [], [])[0]:
            if ready is listener:
                conn = listener.accept()[0]
                pid = os.fork()
                if pid == 0:
                    return _take_over(conn, [listener, *(c for _, c in ranks.values())], list(ranks))
                ranks[os.pidfd_open(pid)] = (pid, conn)
            else:
                pid, conn = ranks.pop(ready)
                os.close(ready)
                status = os.waitpid(pid, 0)[1]
                try:
                    conn.sendall(NUMBER.pack(status))
                except OSError:  # the stand-in is gone
                    pass
                conn.close()


def _take_over(conn: socket.socket, server_sockets: list[socket.socket], server_fds: list[int]) -> dict:
    """In the fork: the stand-in's descriptors at their numbers, its directory and
    environment, and a watch that ends this process with the stand-in."""
    for other in server_sockets:
        other.close()
    for fd in server_fds:
        os.close(fd)
    os.setsid()
    header, fds, _, _ = socket.recv_fds(conn, NUMBER.size, 256)
    request = json.loads(_exactly(conn, NUMBER.unpack(header)[0]))
    if len(fds) != len(request["fds"]):
        raise OSError(f"the stand-in sent {len(request['fds'])} descriptors, {len(fds)} came")
    parked = [_park(fd) for fd in fds]
    watch = socket.socket(fileno=_park(conn.detach()))
    for fd, target in zip(parked, request["fds"]):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["environ"])
    watch.sendall(NUMBER.pack(os.getpid()))
    threading.Thread(target=_die_with, args=(watch,), daemon=True, name="rank-watch").start()
    return request


def _park(fd: int) -> int:
    """`fd` moved to a number at or above HIGH_FD, out of the way of the stand-in's."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, HIGH_FD)
    os.close(fd)
    return moved


def _die_with(watch: socket.socket) -> None:
    """End this rank when its stand-in is gone: the launcher killed what it started."""
    try:
        while watch.recv(1):
            pass
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGKILL)


def _open_fds() -> list[int]:
    """This process's open descriptors (the listing's own, closed once read, left out)."""
    listed = [int(name) for name in os.listdir("/proc/self/fd")]
    return [fd for fd in listed if _is_open(fd)]


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _signal(pid: int, number: int) -> bool:
    try:
        os.kill(pid, number)
    except ProcessLookupError:
        return False
    return True


def _number(conn: socket.socket) -> int:
    return NUMBER.unpack(_exactly(conn, NUMBER.size))[0]


def _exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise EOFError("the other side closed")
        data += chunk
    return data


def main(argv: list[str]) -> int:
    if argv == ["--serve"]:
        request = serve(os.environ[SOCKET])
        sys.argv = [sys.argv[0], *request["argv"]]
        from experiments.cli import main as asgd

        return asgd(request["argv"])
    return stand_in(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
