"""The GPU paths against the host paths they replace, on one GPU, without MPI.

    python -m bench.studies.gpu_paths [--device cuda] [--sizes 1e6,1.6e7,6e7] [--json OUT]

For each model size P (floats), the median milliseconds of a repeat after a warm-up:
- a client's push off the device: `host_copy` (into pinned memory, non_blocking, one
  synchronize) against `.cpu()` (into pageable memory);
- a client's pull onto the device: from the pinned `incoming` against from pageable memory;
- the server's work for one fetching push: apply, then pull (the weights staged for the
  wire), with the Store on the device (upload, the rule's torch kernels, staging to
  pinned memory) against the same Store on the host, for every update rule (sgd with
  server momentum 0.9 and weight decay);
- each rule's update alone, on weights already on the device: the fused cupy kernel
  (paramserver/compute/fused.py) against the rule's torch kernels, and both against a device
  memcpy (torch's and cupy's) that reads and writes as many bytes as the kernel does.
  The target is `fused_vs_memcpy` <= 1.5.
`bench/gpu_check.sh` runs it; with `--device cpu` it runs the same code on
CPU tensors, numpy standing in for cupy (a smoke test, not a measurement).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Callable

import numpy as np
import torch

from clients.buffers import host_copy, host_empty
from paramserver.compute.arrays import ServerArrays
from runconfig.settings import RunConfig
from paramserver.compute.fused import CupyKernel, Fused, numpy_kernel
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


def kernel_row(size: int, device: torch.device, rule: str, repeats: int) -> dict:
    """One update of `rule` by client 0 (pulled, staleness 1): fused, torch, memcpy."""
    on_gpu = device.type == "cuda"
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    start, d = torch.randn(size, device=device), torch.full((size,), 1e-6, device=device)
    torch_rule, fused_rule = make_rule(rule, SETTINGS, CLIENTS), make_rule(rule, SETTINGS, CLIENTS)
    torch_rule.pulled(0, start)
    fused_rule.pulled(0, start)
    fused = Fused(fused_rule, CupyKernel() if on_gpu else numpy_kernel)
    w_torch, weights = start.clone(), [start.clone()]

    def fused_step() -> None:  # returns after the flag is read: synchronised
        weights[0] = fused.apply(weights[0], d, 0, 1)

    row = {"floats": size, "rule": rule,
           "fused_ms": median_ms(fused_step, repeats),
           "torch_ms": median_ms(lambda: (torch_rule.apply(w_torch, d, 0, 1), sync()), repeats)}
    update = fused_rule.fused(0, 1)
    row["vectors_moved"] = 2 + len(update.reads) + 2 * (1 + len(update.state))  # w, d, reads in; w, state in and out
    source = torch.empty(size * row["vectors_moved"] // 2, device=device)  # a copy reads and writes it: the same bytes
    target = torch.empty_like(source)
    row["torch_memcpy_ms"] = median_ms(lambda: (target.copy_(source), sync()), repeats)
    if on_gpu:
        import cupy

        source_cp, target_cp = cupy.from_dlpack(source), cupy.from_dlpack(target)
        row["cupy_memcpy_ms"] = median_ms(lambda: (cupy.copyto(target_cp, source_cp), sync()), repeats)
    memcpy_ms = min(row["torch_memcpy_ms"], row.get("cupy_memcpy_ms", np.inf))
    row["fused_gb_s"] = 4 * size * row["vectors_moved"] / row["fused_ms"] / 1e6
    row["fused_vs_torch"] = row["fused_ms"] / row["torch_ms"]
    row["fused_vs_memcpy"] = row["fused_ms"] / memcpy_ms
    row["torch_vs_memcpy"] = row["torch_ms"] / memcpy_ms
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
              "server": [server_row(size, device, rule, args.repeats) for size in sizes for rule in RULES],
              "kernels": [kernel_row(size, device, rule, args.repeats) for size in sizes for rule in RULES]}
    print(json.dumps(result, indent=1))
    print("fused kernel: ms, and its ratio to the torch update and to a memcpy of the same bytes (target <= 1.5)")
    for row in result["kernels"]:
        print(f"{row['floats']:>10.0e} {row['rule']:>9}  fused {row['fused_ms']:8.3f} ms"
              f"  torch {row['torch_ms']:8.3f} ms  fused/torch {row['fused_vs_torch']:5.2f}  fused/memcpy {row['fused_vs_memcpy']:5.2f}"
              f"  torch/memcpy {row['torch_vs_memcpy']:5.2f}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=1)


if __name__ == "__main__":
    main()
