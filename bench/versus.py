"""Our server against the torch.distributed.rpc parameter server where the server limits,
trial by trial, in long-lived processes.

    from bench.versus import server_bound
    server_bound(clients=2, sizes=[10**4, 10**6], trials=5)     # under `if __name__ == "__main__":`

For K clients, two groups of processes are started once: our MPI job (1 server + K
clients, `mpiexec ... -m bench.versus`, which runs `wire.py load` on each
command its rank 0 reads from stdin) and the RPC parameter server with K trainers
(`peers.RpcLoadGroup`). For each size P, `trials.interleave` alternates, after one
warm-up pair:
- ours: K clients push P floats and pull them back through the real server loop (a
  fresh one each trial) as fast as they can, no compute, for `seconds`; pushes /
  `seconds`;
- the RPC PS: its K trainers call `update_and_fetch` with P floats for a window of
  `seconds` after a short warm-up; calls in the window / `seconds`.
Per trial, ratio = ours / RPC pushes/s. Start-up (mpiexec, importing torch, the RPC
rendezvous) is outside every trial. The group not being measured takes no CPU: our
ranks wait in a sleeping barrier or on stdin, and the RPC processes are stopped (see
`RpcLoadGroup`).
"""
from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time

from bench.peers.run import RpcLoadGroup
from bench.trials import interleave
from experiments.parent.mpiexec import find_mpiexec

RPC_WARMUP_S = 0.1  # before each RPC window: its processes and connections are up already
SLEEP_S = 1e-3  # how long an idle MPI rank sleeps between tests of the barrier
PREFIX = "versus: "  # marks rank 0's result lines among whatever else the job prints
TIMEOUT_S = 300.0  # for one command, start-up included


class OursJob:
    """Our MPI job of 1 server + `clients` clients, started once; `load` runs one trial."""

    def __init__(self, clients: int) -> None:
        command = [find_mpiexec() or "mpiexec", "-n", str(clients + 1), sys.executable, "-m", "bench.versus"]
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [self.lines.put(line) for line in self.proc.stdout], daemon=True).start()

    def load(self, size: int, seconds: float) -> float:
        """Our server's pushes/s in one `wire.py load` run."""
        return self.send({"size": size, "seconds": seconds})["pushes_per_s"]

    def send(self, command: dict | None) -> dict:
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + TIMEOUT_S
        while command is not None:
            if self.proc.poll() is not None:
                raise RuntimeError(f"our MPI job ended with exit status {self.proc.returncode}")
            try:
                line = self.lines.get(timeout=max(0.0, min(0.5, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"our MPI job gave no result within {TIMEOUT_S} s") from None
                continue
            if line.startswith(PREFIX):
                return json.loads(line[len(PREFIX):])
        return {}

    def __enter__(self) -> OursJob:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.proc.poll() is None:
                self.send(None)
            self.proc.wait(TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, 9)  # the session this job started: mpiexec and its ranks
            self.proc.wait()


def server_bound(clients: int, sizes: list[int], trials: int, seconds: dict[int, float] | float = 0.5) -> list[dict]:
    """Per size: both sides' pushes/s per trial and the per-trial ratios ours / RPC PS.
    `seconds`: each side's window per trial, or a window per size."""
    rows = []
    with OursJob(clients) as ours, RpcLoadGroup(clients) as rpc_ps:
        for size in sizes:
            window = seconds[size] if isinstance(seconds, dict) else seconds
            vs = interleave(lambda: ours.load(size, window), lambda: rpc_ps.window(size, window, RPC_WARMUP_S), trials)
            rows.append({"clients": clients, "floats": size, "seconds": window, "trials": trials,
                         "ours_pushes_per_s": vs["ours_median"], "rpc_ps_pushes_per_s": vs["other_median"],
                         "vs_rpc_ps": vs})
    return rows


def serve_commands() -> None:
    """An MPI rank of our job: rank 0 reads one JSON command a line ({"size", "seconds"},
    or null to end); every rank runs it; rank 0 prints the result after PREFIX."""
    from mpi4py import MPI

    from bench.wire import load

    comm = MPI.COMM_WORLD
    while True:
        line = sys.stdin.readline() if comm.rank == 0 else ""
        request = comm.Ibarrier()  # MPI's blocking barrier would busy-poll a core meanwhile
        while not request.Test():
            time.sleep(SLEEP_S)
        command = comm.bcast(json.loads(line or "null") if comm.rank == 0 else None)
        if command is None:
            return
        result = load(comm, int(command["size"]), float(command["seconds"]), servers=1)
        if comm.rank == 0:
            print(PREFIX + json.dumps(result), flush=True)


if __name__ == "__main__":
    serve_commands()
