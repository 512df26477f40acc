"""The benchmark baselines (bench/peers/run.py): they run, DDP ranks agree, and no
process outlives the call, whether it hangs or fails."""
from __future__ import annotations

import multiprocessing as mp
import time

import pytest

from bench.peers.setup import PeerError, Workload, make_workload, run_processes
from bench.peers.run import ddp_throughput, rpc_ps_load, rpc_ps_throughput

pytestmark = pytest.mark.slow  # every test spawns processes that import torch: seconds each


def _hang(rank: int, w: Workload) -> None:
    time.sleep(3600)


def _rank_1_fails(rank: int, w: Workload) -> None:
    if rank == 1:
        raise ValueError("rank 1 gave up")
    _hang(rank, w)


@pytest.mark.parametrize("bench", [ddp_throughput, rpc_ps_throughput])
@pytest.mark.long
def test_baseline_reports_throughput(bench) -> None:
    # ddp_throughput also raises unless both ranks end with bit-identical weights.
    result = bench(clients=2, steps=3, batch_size=16, warmup=1, timeout=60)
    assert result["clients"] == 2 and result["steps"] == 3 and result["batch_size"] == 16
    assert result["samples_per_s"] == pytest.approx(2 * 3 * 16 / result["wall_s"])
    assert 0 < result["wall_s"] < result["call_s"]


@pytest.mark.long
def test_rpc_load_pushes_and_reports() -> None:
    result = rpc_ps_load(1, 1000, 1.0, timeout=60)  # raises (TimeoutError) past its timeout
    assert result["pushes"] > 0 and result["clients"] == 1 and result["floats"] == 1000
    assert result["pushes_per_s"] == pytest.approx(result["pushes"] / result["seconds"])
    assert result["mbytes_per_s"] == pytest.approx(result["pushes"] * 2 * 4 * 1000 / result["seconds"] / 1e6)
    assert not mp.active_children()


def test_hanging_processes_are_killed_at_the_timeout() -> None:
    with pytest.raises(TimeoutError, match="within 3"):  # not the hour they would sleep
        run_processes(_hang, 2, make_workload(2, 1, 1, "cnn", 0, 1, timeout=3))
    assert not mp.active_children()


def test_a_failure_is_reported_and_the_rest_killed() -> None:
    # Rank 0 sleeps for an hour: waited for until the 60 s deadline, the call would raise
    # TimeoutError; PeerError says rank 1's failure ended it.
    with pytest.raises(PeerError, match="rank 1 gave up"):
        run_processes(_rank_1_fails, 2, make_workload(2, 1, 1, "cnn", 0, 1, timeout=60))
    assert not mp.active_children()
