"""Whether `MPI_Comm_join` over a TCP socket lets a running job take in joiners from other
jobs without a dying joiner taking the job down: issue 55's way left to try.

    python -m bench.studies.comm_join [--fates die,ok,die,exit,ok] [--seconds 25]

The server job has two ranks: rank 0 serves, rank 1 stands for a client already in the
run and pings rank 0 as fast as it answers (its longest gap shows whether serving
stalled). Rank 0 listens on a TCP socket it polls without blocking; a joiner (a separately
launched `mpiexec -n 1` job) connects, shows the secret on the socket before any MPI call,
and both sides call `MPI.Comm.Join` on the socket, the server on a thread of its own
(MPI_THREAD_MULTIPLE) so that its loop goes on. Each joiner has a fate: `ok` joins, sends
a JOIN and waits for its answer; `exit` exits once its secret is shown, before its Join;
`die` exits 1 ms into its Join (a joiner killed while MPI connects it). Set `UCX_TLS`
(e.g. `tcp,self`) in the environment to take UCX's shared memory out of the handshake.
It prints the server's log, each joiner's exit status and the server job's. A
measurement, not a test: what it found is in docs/joining.md.
"""
from __future__ import annotations

import argparse
import os
import queue
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.studies import mpiexec, start_server_job

SECRET = b"SECRET"
PING, JOIN = 1, 10


def ping(comm, seconds: float) -> None:
    """Rank 1: a client already in the run, pinging until `seconds` less one."""
    began, gaps, last = time.monotonic(), [], time.monotonic()
    while time.monotonic() - began < seconds - 1:
        comm.send(len(gaps), dest=0, tag=PING)
        comm.recv(source=0, tag=PING)
        now = time.monotonic()
        gaps.append(now - last)
        last = now
    comm.send(-1, dest=0, tag=PING)
    print(f"client: {len(gaps)} pings, longest gap {max(gaps):.3f} s", flush=True)


def serve(port_file: str, seconds: float) -> None:
    from mpi4py import MPI
    world, began = MPI.COMM_WORLD, time.monotonic()
    if world.Get_rank() == 1:
        return ping(world, seconds)
    world.Set_errhandler(MPI.ERRORS_RETURN)
    log = lambda *words: print(f"server {time.monotonic() - began:6.3f}:", *words, flush=True)  # noqa: E731
    log(f"thread level {MPI.Query_thread()}")
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    Path(port_file).write_text(str(listener.getsockname()[1]))
    joined: queue.Queue = queue.Queue()

    def join(conn: socket.socket) -> None:
        try:
            joined.put(MPI.Comm.Join(conn.fileno()))
            log("joined")
        except MPI.Exception as error:
            log(f"join failed: {error.Get_error_string()}")
        conn.close()

    comms, pinging = [], True
    while pinging or time.monotonic() - began < seconds:
        if pinging and world.Iprobe(source=1, tag=PING):
            n = world.recv(source=1, tag=PING)
            pinging = n >= 0
            if pinging:
                world.send(n, dest=1, tag=PING)
        if select.select([listener], [], [], 0)[0]:
            conn, _ = listener.accept()
            conn.settimeout(2.0)
            try:
                shown = conn.recv(len(SECRET)) == SECRET
            except OSError:
                shown = False
            if not shown:
                conn.close()
                continue
            conn.settimeout(None)
            log("secret shown; joining on a thread")
            threading.Thread(target=join, args=(conn,), daemon=True).start()
        while not joined.empty():
            comms.append(joined.get())
        for comm in comms:
            status = MPI.Status()
            if comm.Iprobe(source=MPI.ANY_SOURCE, tag=JOIN, status=status):
                comm.send(comm.recv(source=status.Get_source(), tag=JOIN), dest=status.Get_source(), tag=JOIN)
                log("JOIN answered")
    log("done")
    os._exit(0)  # a join thread may be stuck: MPI_Finalize would wait for it


def join(port_file: str, fate: str) -> None:
    from mpi4py import MPI
    conn = socket.create_connection(("127.0.0.1", int(Path(port_file).read_text())))
    conn.sendall(SECRET)
    if fate == "exit":
        os._exit(0)
    if fate == "die":
        threading.Timer(0.001, lambda: os._exit(9)).start()
    comm = MPI.Comm.Join(conn.fileno())
    comm.send("join", dest=0, tag=JOIN)
    comm.recv(source=0, tag=JOIN)
    os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fates", default="die,ok,die,exit,ok", help="each joiner's: ok, exit or die")
    parser.add_argument("--seconds", type=float, default=25.0, help="how long the server job serves")
    parser.add_argument("--role", choices=("server", "joiner"), help=argparse.SUPPRESS)
    parser.add_argument("--port-file", help=argparse.SUPPRESS)
    parser.add_argument("--fate", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "server":
        return serve(args.port_file, args.seconds)
    if args.role == "joiner":
        return join(args.port_file, args.fate)
    me = [sys.executable, "-m", "bench.studies.comm_join", "--seconds", str(args.seconds)]
    with tempfile.TemporaryDirectory() as folder:
        port_file = os.path.join(folder, "port")
        server = start_server_job(me, 2, port_file)
        for fate in args.fates.split(","):
            try:
                done = subprocess.run([mpiexec(), "-n", "1", *me, "--role", "joiner", "--port-file", port_file,
                                       "--fate", fate], timeout=12, start_new_session=True, capture_output=True)
                print(f"joiner ({fate}): exit {done.returncode}", flush=True)
            except subprocess.TimeoutExpired:
                print(f"joiner ({fate}): still there after 12 s", flush=True)
        try:
            print(f"server job: exit {server.wait(timeout=args.seconds + 20)}", flush=True)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, 9)
            print(f"server job: still there {args.seconds + 20:g} s after its end; killed", flush=True)


if __name__ == "__main__":
    main()
