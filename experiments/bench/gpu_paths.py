"""The GPU paths against the host paths they replace, on one GPU, without MPI.

    python -m experiments.bench.gpu_paths [--device cuda] [--sizes 1e6,1.6e7,6e7] [--json OUT]

For each model size P (floats), the median milliseconds of a repeat after a warm-up:
- a client's push off the device: `host_copy` (into pinned memory, non_blocking, one
  synchronize) against `.cpu()` (into pageable memory);
- a client's pull onto the device: from the pinned `incoming` against from pageable memory;
- the server's work for one fetching push: apply, then pull (the weights staged for the
  wire), with the Store on the device (upload, the rule's torch kernels, staging to
  pinned memory) against the same Store on the host, for every update rule (sgd with
  server momentum 0.9 and weight decay).
`experiments/bench/gpu_check.sh` runs it; with `--device cpu` it runs the same code on
CPU tensors (a smoke test, not a measurement).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Callable

import numpy as np
import torch

from clients.models import host_copy, host_empty
from paramserver.arrays import ServerArrays
from paramserver.config import RunConfig
from paramserver.rules import RULES, make_rule
from paramserver.store import Store

WARMUP = 3
SETTINGS = RunConfig(server_momentum=0.9)  # and the default weight decay, 5e-4
CLIENTS = 8  # the rules that depend on K see 8 clients


def median_ms(work: Callable[[], object], repeats: int) -> float:
    """Each call of `work` must end synchronised (every one here does)."""
    for _ in range(WARMUP):
        work()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def client_row(size: int, device: torch.device, repeats: int) -> dict:
    vector = torch.randn(size, device=device)
    pinned, pageable = host_empty(size, device), np.empty(size, np.float32)
    row = {"floats": size,
           "push_pinned_ms": median_ms(lambda: host_copy(vector), repeats),
           "push_pageable_ms": median_ms(lambda: vector.cpu().numpy(), repeats),
           "pull_pinned_ms": median_ms(lambda: vector.copy_(torch.from_numpy(pinned)), repeats),
           "pull_pageable_ms": median_ms(lambda: vector.copy_(torch.from_numpy(pageable)), repeats)}
    row["push_pinned_gb_s"] = 4 * size / row["push_pinned_ms"] / 1e6
    row["pull_pinned_gb_s"] = 4 * size / row["pull_pinned_ms"] / 1e6
    return row


def server_row(size: int, device: torch.device, rule: str, repeats: int) -> dict:
    start = np.random.default_rng(0).standard_normal(size, dtype=np.float32)
    push = np.full(size, 1e-6, np.float32)
    row = {"floats": size, "rule": rule}
    for name, backend in (("host", ServerArrays("cpu")), ("device", ServerArrays(str(device)))):
        store = Store(start, make_rule(rule, SETTINGS, CLIENTS), backend=backend)
        row[f"{name}_push_pull_ms"] = median_ms(lambda: (store.apply(0, push), store.pull(0)), repeats)
    row["speedup"] = row["host_push_pull_ms"] / row["device_push_pull_ms"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--sizes", default="1e6,1.6e7,6e7", help="model sizes, in floats")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json", help="where to write the results")
    args = parser.parse_args()
    device = torch.device(args.device)
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "client": [client_row(size, device, args.repeats) for size in sizes],
              "server": [server_row(size, device, rule, args.repeats) for size in sizes for rule in RULES]}
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=1)


if __name__ == "__main__":
    main()
