"""Do streamed fragments keep a real client busy over a slow link? Over MPI, across hosts.

    python -m bench.studies.fragment_link [--pairs 3] [--steps 400] [--n-sync 8] [--share 0.5] [--wide]

The simulator says that where a whole push and its pull take half a window, a client
that waits computes 2/3 of the time and one that streams P = 4 fragments all of it
(docs/results/notes.md). Whether a real MPI job does too depends on its transfers going
on while the client computes, with no MPI call to drive them. On the test cluster
(scripts/cluster.sh, root) the server runs on h1 and one client on h2, whose link is held
to a rate (`tc` token bucket filters on both ends of h2's veth: pushes out, weights in)
at which a push and its pull take `--share` of a window of n_sync minibatches, the
minibatch time and the frames' bytes measured by a first run on the unlimited link (and a
run with fragments there: what a push's own work at either end costs the client). Then
`--pairs` pairs of runs, whole pushes and `--fragments 4` in turn (`add`, the
Fashion-MNIST default model, 0.8 MB a push; `--wide`: `wide_mlp`, 23 MB, whose fragments
no socket buffer holds, so MPI moves them only while the client calls into it), and for
each the summary's `client_busy` (the client's wall seconds computing over its span,
docs/training.md), its virtual twin from the simulator at the measured costs, the wall
time and the final test error. Printed, never asserted.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

from torch import nn

from bench.cluster import bench_cluster, cluster_env
from bench.jobs import asgd_train
from rundir.durable import read_jsonl
from rundir.layout import RunDir

FLAGS = ["--clients", "1", "--rule", "add", "--threads", "1", "--eval-samples", "500", "--device", "cpu"]


def wide_mlp(*, width: int = 2048) -> nn.Module:
    """Fashion-MNIST's images through two hidden layers of `width`: 5.8M floats, a push of 23 MB."""
    return nn.Sequential(nn.Flatten(), nn.Linear(784, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, 10))


def limit(host: int, rate: float) -> None:
    """Hold host `host`'s link to `rate` bytes/s each way (0: lift it): a token bucket on
    both ends of its veth, whose queue holds a second at the rate, so a window's frames
    wait and none is dropped."""
    prefix = cluster_env()["ASGD_CLUSTER_PREFIX"]
    for dev, netns in (("eth0", f"{prefix}-h{host}"), (f"{prefix}-h{host}-v", None)):
        tc = [*(["ip", "netns", "exec", netns] if netns else []), "tc", "qdisc"]
        subprocess.run([*tc, "del", "dev", dev, "root"], capture_output=True)  # none there yet: fine
        if rate:
            subprocess.run([*tc, "add", "dev", dev, "root", "tbf", "rate", f"{int(rate * 8)}bit",
                            "burst", str(max(65536, int(rate / 100))), "limit", str(int(max(rate, 1e6)))],
                           check=True, capture_output=True, text=True)


def costs(run: Path, n_sync: int) -> dict:
    """What the unlimited run measured: a minibatch's seconds (the median gap between
    consecutive rows of one window), and a push's and a pull's bytes."""
    rows = list(read_jsonl(run / "clients.jsonl"))
    gaps = [b["time"] - a["time"] for a, b in zip(rows, rows[1:]) if a["step"] % n_sync]
    s = RunDir(run).summary()
    return {"minibatch_s": statistics.median(gaps), "push_bytes": s["bytes_pushed"] / s["pushes_sent"],
            "pull_bytes": s["bytes_pulled"] / s["pushes_sent"]}  # the first pull, and one a push but the last


def simulated(folder: Path, name: str, flags: list[str], measured: dict, rate: float) -> float:
    """The simulator's `client_busy` for the same run at the measured costs."""
    summary = asgd_train(folder / name, *flags, "--backend", "sim", "--sim-step-time", f"{measured['minibatch_s']:.6f}",
                         "--sim-bandwidth", f"{rate:.0f}")
    return summary["client_busy"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--n-sync", type=int, default=8)
    parser.add_argument("--share", type=float, default=0.5, help="a push and its pull, as a share of a window")
    parser.add_argument("--wide", action="store_true", help="the 23 MB model, not the default 0.8 MB one")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    flags = [*FLAGS, "--steps", str(args.steps), "--n-sync", str(args.n_sync),
             *(["--model", f"{Path(__file__).resolve()}:wide_mlp"] if args.wide else [])]
    with bench_cluster() as hosts, tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        folder, pair = Path(tmp), hosts.part(0, 2)
        free = {name: asgd_train(folder / f"free-{name}", *flags, *more, hosts=pair)["client_busy"]
                for name, more in (("whole", []), ("P=4", ["--fragments", "4"]))}
        measured = costs(folder / "free-whole", args.n_sync)
        window = args.n_sync * measured["minibatch_s"]
        rate = (measured["push_bytes"] + measured["pull_bytes"]) / (args.share * window)
        print(f"unlimited: a minibatch {1e3 * measured['minibatch_s']:.2f} ms, a push {measured['push_bytes']:.0f} B, "
              f"a pull {measured['pull_bytes']:.0f} B; client_busy {free['whole']:.3f} whole, "
              f"{free['P=4']:.3f} with P = 4; "
              f"the link held to {8 * rate / 1e6:.0f} Mbit/s each way")
        results: dict[str, list[dict]] = {"whole": [], "P=4": []}
        try:
            limit(2, rate)
            for trial in range(args.pairs):
                for name, more in (("whole", []), ("P=4", ["--fragments", "4"])):
                    s = asgd_train(folder / f"{name}-{trial}", *flags, *more, hosts=pair)
                    results[name].append({"client_busy": s["client_busy"], "time_s": s["time_s"],
                                          "final_test_error": s["final_test_error"]})
                    print(f"  {name} #{trial}: client_busy {s['client_busy']:.3f}, {s['time_s']:.2f} s, "
                          f"error {s['final_test_error']:.4f}", flush=True)
        finally:
            limit(2, 0)
        sim = {name: simulated(folder, f"sim-{name}", [*flags, *more], measured, rate)
               for name, more in (("whole", []), ("P=4", ["--fragments", "4"]))}
    print("\n| pushes | client_busy, MPI (runs) | simulator at the measured costs | wall s (runs) | final error |")
    print("|---|---|---:|---|---|")
    for name, runs in results.items():
        cells = [", ".join(f"{r[k]:{f}}" for r in runs) for k, f in
                 (("client_busy", ".3f"), ("time_s", ".2f"), ("final_test_error", ".4f"))]
        print(f"| {name} | {cells[0]} | {sim[name]:.3f} | {cells[1]} | {cells[2]} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"measured": measured, "unlimited": free, "rate": rate, "mpi": results,
                                               "sim": sim}))


if __name__ == "__main__":
    main()
