"""How long a join through server 0's door takes, and what it costs the clients already there.

    python -m bench.studies.door_join [--joiners J] [--tries N] [--steps S]

Each try starts `asgd train` (self-launched over MPI: 2 clients on the tiny data set, the
second failing at its step 5 under `continue`, `--joinable`, the run's budget), waits for its door file and
the lost client, then starts J `asgd join` processes at once. From the run directory it
prints, for each joiner: its start-up (from its launch to its `joined` row, wall seconds:
importing torch, the model and data, the connection), the server's side (from the
`joined` row to the joiner's first applied push, the run's clock: what issue 55's target
bounds, within n_sync minibatch times + 0.1 s), and client 0's applied pushes per second
in the 2 s before the first join and the 2 s after it. With `--raw` the joins come from
this process's sockets (JOIN, then the weights, then closed): how long the server takes to
serve J joins at once, with no start-up in it. Printed, never asserted.
"""
from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from paramserver.wire import frame
from paramserver.wire.protocol import Join, Tag
from paramserver.wire.stream import SocketLink

from tests.conftest import make_tiny_npz

ASGD = str(Path(sys.executable).with_name("asgd"))
WINDOW_S = 2.0


def _rows(run: Path, log: str) -> list[dict]:
    path = run / f"{log}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _served(door: dict, joiners: int) -> list[float]:
    """J joins at once from this process, each on a thread: the seconds from its JOIN sent
    to its weights in (no start-up: the server's side alone); each then closes, a lost client."""
    def join() -> float:
        link = SocketLink(socket.create_connection(("127.0.0.1", door["port"]), timeout=30))
        start = time.perf_counter()
        link.send(0, Tag.JOIN, Join(door["secret"], "raw"))
        welcome = link.recv(30).header
        landing = frame.empty(welcome.weights.size)
        link.complete(link.expect_weights([0], [landing]), [0], landing.nbytes, 30)
        took = time.perf_counter() - start
        link.close()
        return took
    with ThreadPoolExecutor(joiners) as pool:
        return list(pool.map(lambda _: join(), range(joiners)))


def one_try(folder: Path, data: Path, joiners: int, steps: int, raw: bool) -> dict:
    run = folder / "run"
    server = subprocess.Popen([ASGD, "train", "--quiet", "--data", str(data), "--clients", "2", "--joinable",
                               "--on-client-failure", "continue", "--inject-fault", "2:5", "--steps", str(steps),
                               "--budget", "run", "--device", "cpu", "--eval-samples", "50", "--out", str(run)],
                              stderr=subprocess.DEVNULL, start_new_session=True)
    while not ((run / "door.json").exists() and any("lost" in r for r in _rows(run, "server"))):
        if server.poll() is not None:
            raise RuntimeError("the run ended before the joiners came")
        time.sleep(0.05)
    if raw:
        served = _served(json.loads((run / "door.json").read_text()), joiners)
        server.wait(timeout=600)
        return {"served_s": served}
    launched = time.time()
    procs = [subprocess.Popen([ASGD, "join", str(run)], stderr=subprocess.DEVNULL) for _ in range(joiners)]
    startup = []  # wall seconds from the launch to each `joined` row seen
    while len(startup) < joiners and any(p.poll() is None for p in procs):
        seen = sum("joined" in r for r in _rows(run, "server"))
        startup += [time.time() - launched] * (seen - len(startup))
        time.sleep(0.02)
    for proc in procs:
        proc.wait(timeout=300)
    server.wait(timeout=600)
    rows = _rows(run, "server")
    joined = [r for r in rows if "joined" in r]
    first_push = {j["joined"]: min((r["time"] for r in rows if r.get("client") == j["joined"] and "staleness" in r),
                                   default=None) for j in joined}  # None: it never pushed (the budget was spent)
    at = min(j["time"] for j in joined)
    pushes0 = [r["time"] for r in rows if r.get("client") == 0 and "staleness" in r]
    before = sum(at - WINDOW_S <= t < at for t in pushes0) / WINDOW_S
    after = sum(at <= t < at + WINDOW_S for t in pushes0) / WINDOW_S
    return {"server_s": [first_push[j["joined"]] - j["time"] for j in joined if first_push[j["joined"]] is not None],
            "joined": len(joined),
            "joined_at": [j["time"] for j in joined], "startup_s": startup,
            "client0_rate": (before, after), "exit": [p.returncode for p in procs]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--joiners", type=int, default=1)
    parser.add_argument("--tries", type=int, default=3)
    parser.add_argument("--raw", action="store_true", help="joins from this process's sockets, not `asgd join`: "
                                                            "the server's side of a join, without start-ups")
    parser.add_argument("--steps", type=int, default=3000,
                        help="a client's share of the run's budget (budget = run: 2 x S minibatches in all, "
                             "shared with the joiners): client 0 must outlast the joins")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = make_tiny_npz(Path(tmp) / "tiny.npz")
        for i in range(args.tries):
            folder = Path(tmp) / f"try{i}"
            folder.mkdir()
            got = one_try(folder, data, args.joiners, args.steps, args.raw)
            if args.raw:
                served = sorted(got["served_s"])
                print(f"try {i}: {len(served)} raw joins at once, JOIN sent -> weights in: median "
                      f"{1e3 * statistics.median(served):.1f} ms, max {1e3 * served[-1]:.1f} ms", flush=True)
                continue
            server = got["server_s"]
            print(f"try {i}: {got['joined']} of {args.joiners} joined, {len(server)} pushed (exit {got['exit']}); "
                  f"start-up (launch -> "
                  f"joined row) {min(got['startup_s'], default=0):.2f}-{max(got['startup_s'], default=0):.2f} s; "
                  f"joined row -> first "
                  f"applied push: median {1e3 * statistics.median(server or [0]):.1f} ms, max {1e3 * max(server or [0]):.1f} ms; "
                  f"joins spread over {max(got['joined_at']) - min(got['joined_at']):.2f} s; client 0 pushes/s "
                  f"2 s before / after the first join: {got['client0_rate'][0]:.0f} / {got['client0_rate'][1]:.0f}",
                  flush=True)


if __name__ == "__main__":
    main()
