"""Whether a server can wait for joiners on a thread blocked in MPI_Comm_accept while its
main thread serves: two separately launched jobs, MPI's dynamic processes.

    python -m bench.studies.accept_thread [--joiners 2] [--wait 20] [--knock | --dead]

Issue 55's `asgd train --joinable` needs server 0 to accept new clients without stopping
its loop. MPI has no non-blocking accept, so the natural design is a thread blocked in
`COMM_SELF.Accept` (mpi4py asks for MPI_THREAD_MULTIPLE; `MPI.Query_thread()` says which
it got) handing each merged communicator to the main loop, which polls them with
`Iprobe`. This launches the server as one `mpiexec -n 1` job (it opens a port, writes its
name to a file, accepts `--joiners` times on a thread and answers each JOIN from its main
loop) and each joiner as another `mpiexec -n 1` job, one after the other, each allowed
`--wait` seconds for its answer. It prints, in the server's seconds since the port was
open, when each connection was accepted and when its JOIN was seen and answered, and
each joiner's own times. `--knock`: the other design, no thread: each joiner writes a
knock file once its `Connect` is under way (on a thread of its own) and the server calls
`Accept` in its main thread only after a knock; `--dead`: so, but the joiner exits 0.2 s
after knocking and the server accepts 2 s after the knock (a joiner killed while it joins).
A measurement, not a test: what it found is in docs/joining.md.
"""
from __future__ import annotations

import argparse
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.studies import mpiexec, start_server_job

JOIN = 10  # the message tag of the probe's join and its answer


def serve_knocked(port_file: str, joiners: int, dead: bool) -> None:
    """Accept in the main thread, once a joiner has knocked."""
    from mpi4py import MPI
    port = MPI.Open_port()
    Path(port_file).write_text(port)
    for n in range(joiners):
        knock = Path(f"{port_file}.knock{n}")
        while not knock.exists():
            time.sleep(0.01)
        time.sleep(2.0 if dead else 0.0)
        began = time.monotonic()
        print(f"server: knock {n + 1}; accepting", flush=True)
        comm = MPI.COMM_SELF.Accept(port).Merge(high=False)
        print(f"server: accepted after {time.monotonic() - began:.3f} s", flush=True)
        if not dead:
            comm.recv(source=1, tag=JOIN)
            comm.send("welcome", dest=1, tag=JOIN)
    print("server: done", flush=True)
    os._exit(0)


def serve(port_file: str, joiners: int, wait: float) -> None:
    from mpi4py import MPI
    print(f"server: thread level {MPI.Query_thread()} (MULTIPLE is {MPI.THREAD_MULTIPLE})", flush=True)
    port = MPI.Open_port()
    Path(port_file).write_text(port)
    accepted: queue.Queue = queue.Queue()

    def accept() -> None:
        for _ in range(joiners):
            accepted.put(MPI.COMM_SELF.Accept(port).Merge(high=False))
    threading.Thread(target=accept, daemon=True).start()
    began, comms, answered = time.monotonic(), [], 0
    while time.monotonic() - began < wait * (joiners + 1) and answered < joiners:
        while not accepted.empty():
            comms.append(accepted.get())
            print(f"server: accepted joiner {len(comms)} at {time.monotonic() - began:.3f} s", flush=True)
        for comm in comms:
            if comm.Iprobe(source=1, tag=JOIN):
                comm.recv(source=1, tag=JOIN)
                comm.send("welcome", dest=1, tag=JOIN)
                answered += 1
                print(f"server: JOIN seen and answered at {time.monotonic() - began:.3f} s", flush=True)
        time.sleep(0.001)
    print(f"server: answered {answered} of {joiners}", flush=True)
    os._exit(0)  # a joiner may still be connected: MPI_Finalize would wait for it


def join(port_file: str, knock: str = "", dead: bool = False) -> None:
    from mpi4py import MPI
    began = time.monotonic()
    port, connected = Path(port_file).read_text(), queue.Queue()
    if knock:  # the Connect under way on a thread, then the knock
        threading.Thread(target=lambda: connected.put(MPI.COMM_SELF.Connect(port)), daemon=True).start()
        time.sleep(0.3)
        Path(knock).write_text("knock")
        if dead:
            time.sleep(0.2)
            print("joiner: exiting after its knock", flush=True)
            os._exit(0)
    comm = (connected.get() if knock else MPI.COMM_SELF.Connect(port)).Merge(high=True)
    print(f"joiner: connected in {time.monotonic() - began:.3f} s", flush=True)
    comm.send("join", dest=0, tag=JOIN)
    comm.recv(source=0, tag=JOIN)
    print(f"joiner: answered after {time.monotonic() - began:.3f} s", flush=True)
    os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--joiners", type=int, default=2)
    parser.add_argument("--wait", type=float, default=20.0, help="seconds a joiner waits for its answer")
    parser.add_argument("--knock", action="store_true", help="accept after a knock, in the main thread")
    parser.add_argument("--dead", action="store_true", help="--knock, each joiner exiting after its knock")
    parser.add_argument("--role", choices=("server", "joiner"), help=argparse.SUPPRESS)
    parser.add_argument("--port-file", help=argparse.SUPPRESS)
    parser.add_argument("--knock-file", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    knocked = args.knock or args.dead
    if args.role == "server":
        return serve_knocked(args.port_file, args.joiners, args.dead) if knocked else \
            serve(args.port_file, args.joiners, args.wait)
    if args.role == "joiner":
        return join(args.port_file, args.knock_file, args.dead)
    me = [sys.executable, "-m", "bench.studies.accept_thread", "--joiners", str(args.joiners), "--wait",
          str(args.wait), *(["--knock"] if args.knock else []), *(["--dead"] if args.dead else [])]
    with tempfile.TemporaryDirectory() as folder:
        port_file = os.path.join(folder, "port")
        server = start_server_job(me, 1, port_file)
        for n in range(args.joiners):
            print(f"launching joiner {n + 1}", flush=True)
            try:
                knock = ["--knock-file", f"{port_file}.knock{n}"] if knocked else []
                subprocess.run([mpiexec(), "-n", "1", *me, "--role", "joiner", "--port-file", port_file, *knock],
                               timeout=args.wait, start_new_session=True)
            except subprocess.TimeoutExpired:
                print(f"joiner {n + 1}: no answer within {args.wait:g} s", flush=True)
        try:
            server.wait(timeout=args.wait * (args.joiners + 2))
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, 9)


if __name__ == "__main__":
    main()
