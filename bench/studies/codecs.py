"""The blockwise codecs' cost a push: a client's encode with error feedback plus the
server's decode, the compiled kernel (paramserver/compute/quantkernel.py) against numpy's
passes (paramserver/wire/compress.py), on one core.

    python -m bench.studies.codecs [--size 206922] [--trials 15] [--repeats 20] [--core 0] [--clock cpu|wall]
        [--json OUT]

The default size is the default CNN's (clients/models.py's `small_cnn` on 28x28x1, 10
classes: 206,922 floats). The process is pinned to `--core` and torch to one thread, as
the issue's target (encode + decode at most 1 ms a push on one core) asks; glibc keeps
freed memory as in a run (`keep_freed_memory`), so a fresh payload costs no page faults.
Per codec, trials interleave (bench/trials.py) the compiled and the numpy side, each a
mean over `--repeats` pushes of encode-with-feedback then decode; ratio per trial =
compiled / numpy. Both sides give the same bytes (tests/unit/test_blockwise.py), so
only the time differs. `--clock cpu` (the default) times the thread's CPU seconds
(`time.thread_time`), what a push takes of a core however many processes share it (on a
loaded host wall time is mostly waiting for the core); `wall`, the seconds that passed.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from typing import Callable

import numpy as np
import torch

from bench.trials import interleave, ratio_cell
from clients.devices import keep_freed_memory
from paramserver.compute.quantkernel import make_codec as compiled
from paramserver.wire.compress import Codec, ErrorFeedback, make_codec

DEFAULT_SIZE = 206_922  # the default CNN's floats
CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}


def timed(codec: Codec, size: int, repeats: int, clock: Callable[[], float]) -> Callable[[], float]:
    """One trial: the mean seconds (of `clock`) of a push's encode (with feedback) and its decode."""
    rng = np.random.default_rng(0)
    pushes = [(rng.standard_normal(size) * 1e-3).astype(np.float32) for _ in range(4)]
    feedback, out = ErrorFeedback(codec, size), np.empty(size, np.float32)

    def trial() -> float:
        start = clock()
        for k in range(repeats):
            codec.decode(feedback.encode(pushes[k % len(pushes)]), out)
        return (clock() - start) / repeats
    return trial


def measure(size: int, trials: int, repeats: int, clock: Callable[[], float] = time.thread_time) -> dict[str, dict]:
    results = {}
    for name in ("int8", "int4"):
        fast = compiled(name)
        if fast.kernel is None:
            raise SystemExit("codecs: no g++ here: nothing compiled to compare")
        results[name] = interleave(timed(fast, size, repeats, clock), timed(make_codec(name), size, repeats, clock),
                                   trials, warmup=2)
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=DEFAULT_SIZE)
    parser.add_argument("--trials", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--core", type=int, default=0)
    parser.add_argument("--clock", choices=CLOCKS, default="cpu")
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    os.sched_setaffinity(0, {args.core})
    torch.set_num_threads(1)
    keep_freed_memory()
    results = measure(args.size, args.trials, args.repeats, CLOCKS[args.clock])
    print(f"encode (error feedback) + decode, {args.size:,} floats, one core; ms ({args.clock}) a push, median "
          f"(min) of {args.trials} interleaved trials of {args.repeats} pushes")
    print("| codec | compiled | numpy | compiled / numpy (IQR) |\n|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {1e3 * r['ours_median']:.3f} ({1e3 * min(r['ours']):.3f}) | "
              f"{1e3 * r['other_median']:.3f} ({1e3 * min(r['other']):.3f}) | {ratio_cell(r)} |")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"size": args.size, "trials": args.trials, "repeats": args.repeats, "clock": args.clock,
                       **results}, out, indent=1)


if __name__ == "__main__":
    main()
