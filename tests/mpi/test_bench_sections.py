"""Every section of `asgd bench` runs, at its tiniest (bench/scale.py's TINY), and yields
the rows its table is made of: the bench is measured rarely, by hand, and once broke
unseen (a client ended before the window the peers section timed). The figures are not
looked at; only that each section measured what its table shows."""
from __future__ import annotations

import pytest

from bench import suite
from bench.peers.setup import fashion_mnist_installed
from bench.scale import TINY

pytestmark = [pytest.mark.slow, pytest.mark.mpi]


def test_wire_measures_each_size():
    [row] = suite.wire(TINY)
    assert row["floats"] == 1e5 and row["round_trip_ms"] > 0 and row["apply_ms"] > 0
    assert {"apply_vs_copy", "vs_bound"} <= row.keys()


@pytest.mark.long
def test_load_measures_each_setting():
    rows = suite.load(TINY)
    assert [(r["servers"], r["clients"]) for r in rows] == [(1, 1), (2, 4), (1, 1)]
    assert all(r["pushes_per_s"] > 0 and r["server_push_us"] for r in rows)


def test_idle_compares_the_two_waits():
    idle = suite.idle(TINY)
    assert idle["blocking_cpu_s"] > 0 and idle["polled_cpu_s"] >= 0 and idle["speedup"] > 0


@pytest.mark.long
def test_server_bound_measures_ours_and_the_rpc_ps():
    bound = suite.server_bound(TINY)
    assert [(r["clients"], r["floats"]) for r in bound["rows"]] == [(1, bound["proxy_floats"])]
    assert all(r["ours_pushes_per_s"] > 0 and r["rpc_ps_pushes_per_s"] > 0 for r in bound["rows"])


@pytest.mark.skipif(not fashion_mnist_installed(), reason="the peers train on Fashion-MNIST, not installed here")
@pytest.mark.long
def test_peers_measures_every_system_in_the_same_trial():
    rows = suite.peers(TINY)
    assert [r["system"] for r in rows] == [suite.OURS_N1, "torch DDP (gloo)", "torch.distributed.rpc PS",
                                           "ours: async, n_sync 10", "ours: sync (allreduce)"]
    assert all(len(r["trials"]) == TINY.peers_trials and r["samples_per_s"] > 0 for r in rows)


@pytest.mark.long
def test_simulator_measures_its_wall_against_pure_compute():
    [row] = suite.simulator(TINY)
    assert row["clients"] == 2 and row["minibatches"] == TINY.sim_minibatches
    assert row["sim_wall_s"] > 0 and row["compute_s"] > 0


def test_the_scales_differ_only_in_their_counts():
    """--quick and the full bench run the same sections as the tests do here."""
    assert set(suite.chosen(None, ())) == set(suite.SECTIONS) - {"hosts"}
    assert TINY.quick and suite.QUICK.quick and not suite.FULL.quick
