"""How much each section of `asgd bench` measures: FULL for the docs' page, QUICK a smoke
run (`--quick`), TINY the suite's check that every section runs and yields its rows
(tests/mpi/test_bench_sections.py). The same code runs at each; only the counts differ."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Scale:
    quick: bool  # the page says: too few repeats to quote
    wire_sizes: str  # floats a push, as bench/wire.py's --sizes
    wire_trials: int
    wire_repeats: int
    load_seconds: float  # one no-compute window
    load_repeats: int  # windows a setting, the median kept
    load_clients: tuple[int, ...]  # on one server, 1e6 floats
    load_servers: tuple[int, ...]  # sharded, under 4 clients, 4e6 floats
    load_proxy_clients: tuple[int, ...]  # on one server, the proxy CNN's floats
    bound_sizes: tuple[int, ...]  # floats, besides the proxy CNN's
    bound_clients: tuple[int, ...]
    bound_seconds: float  # a window (three times it from 4e6 floats)
    bound_trials: int
    bound_four_clients: bool  # the target table's 4 clients at the proxy CNN's size
    peers_steps: int  # timed minibatches a client, after bench.jobs.WARMUP
    peers_trials: int
    sim_minibatches: int  # a trial's, all clients together
    sim_trials: int
    sim_clients: tuple[int, ...]
    idle_seconds: float


FULL = Scale(False, "1e5,1e6,4e6,1.6e7", 7, 10, 1.0, 3, (1, 2, 4, 8), (1, 2, 4), (1, 2, 4),
             (10**4, 10**5, 10**6, 4 * 10**6, 16 * 10**6), (1, 2), 0.5, 5, True, 150, 4, 240, 3, (1, 8, 32), 2.0)
QUICK = Scale(True, "1e5,1e6,4e6", 3, 5, 0.5, 1, (1, 2, 4, 8), (1, 2, 4), (1,), (10**4,), (1, 2), 0.3, 2, False,
              40, 1, 160, 1, (8,), 2.0)
TINY = Scale(True, "1e5", 1, 1, 0.2, 1, (1,), (2,), (1,), (), (1,), 0.2, 1, False, 5, 1, 16, 1, (2,), 0.5)
