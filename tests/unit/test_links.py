"""The simulator's links (experiments/sim/links.py): a transfer's time from its path."""
from __future__ import annotations

import pytest

from experiments.sim.links import Links
from runconfig.settings import ConfigError, RunConfig

B = 1e6  # bytes a transfer carries


def links(clients: int, servers: int = 1, **settings) -> Links:
    cfg = RunConfig(backend="sim", clients=clients, servers=servers, **settings)
    return Links.for_run(cfg, 1e9, 2e-6, clients)


def test_the_default_links_charge_the_one_number_model():
    """Sends as `latency + bytes / bandwidth`, never waiting on another client's; what the
    server sends costs only the latency here (SimTiming.served charges it to the server)."""
    plain = links(3)
    for client in range(3):
        assert plain.send(client, B, 0.5) == 0.5 + (2e-6 + B / 1e9)
    assert plain.send(0, B, 0.5) == (0.5 + B / 1e9) + (2e-6 + B / 1e9)  # its own next send waits for the first
    assert plain.receive(1, B, 0.5) == 0.5 + 2e-6  # what the server sends: SimTiming.served
    assert plain.send(2, 0.0, 0.5) == 0.5 + 2e-6


def test_a_client_link_takes_its_bandwidth_and_latency_both_ways():
    slow = links(2, sim_client_links="1e9@0.001,1e8@0.05")
    assert slow.send(0, B, 0.0) == pytest.approx(0.001 + B / 1e9, rel=1e-12)
    assert slow.send(1, B, 0.0) == pytest.approx(0.05 + B / 1e8, rel=1e-12)
    assert slow.receive(1, B, 1.0) == pytest.approx(1.0 + 0.05 + B / 1e8, rel=1e-12)


def test_clients_of_one_region_take_turns_on_its_link():
    shared = links(3, sim_client_links="1e10", sim_regions="0-1", sim_region_bandwidth=1e8, sim_region_latency=0.02)
    turn = B / 1e8  # the region's link is the slowest on the path
    assert shared.send(0, B, 0.0) == pytest.approx(0.02 + turn, rel=1e-12)
    assert shared.send(1, B, 0.0) == pytest.approx(0.02 + 2 * turn, rel=1e-12)  # after client 0's bytes
    assert shared.send(2, B, 0.0) == pytest.approx(B / 1e10, rel=1e-12)  # outside the region: no wait
    assert shared.receive(1, B, 0.0) == pytest.approx(0.02 + turn, rel=1e-12)  # the other way is free


def test_a_later_booking_takes_an_earlier_gap_and_never_moves_a_booked_one():
    shared = links(2, sim_client_links="1e10", sim_regions="0-1", sim_region_bandwidth=1e8)
    turn = B / 1e8
    assert shared.send(0, B, 1.0) == pytest.approx(1.0 + turn)
    assert shared.send(1, B, 0.0) == pytest.approx(turn)  # done before client 0's starts
    assert shared.send(1, B, 0.995) == pytest.approx(1.0 + 2 * turn)  # would overlap it: after it


def test_each_server_link_carries_its_slice_and_saturates():
    """Four clients push at once to two servers on 1e8 B/s links: each server's link takes
    half of every push, one after another, so the k-th arrives after k half-pushes."""
    sharded = links(4, servers=2, sim_client_links="1e10", sim_server_bandwidth=1e8)
    arrivals = [sharded.send(client, B, 0.0) for client in range(4)]
    assert arrivals == pytest.approx([(k + 1) * B / 2 / 1e8 for k in range(4)], rel=1e-12)


@pytest.mark.parametrize("settings,field", [
    ({"sim_regions": "0-3;8"}, "sim_regions: names client 8"),
    ({"sim_regions": "0-3;3-4"}, "sim_regions: expected"),
    ({"sim_client_links": "1e9,-5"}, "sim_client_links: expected"),
    ({"sim_client_links": "1e9,1e9,1e9"}, "sim_client_links: lists 3 links for 8 clients"),
    ({"sim_server_bandwidth": -1.0}, "sim_server_bandwidth: must be non-negative"),
    ({"sim_region_bandwidth": -1.0}, "sim_region_bandwidth: must be non-negative"),
    ({"sim_regions": "0-3", "mode": "sync"}, "sim_regions: needs --backend sim and --mode async"),
])
def test_bad_links_are_refused_in_one_line(settings, field):
    with pytest.raises(ConfigError, match=field):
        RunConfig(backend="sim", clients=8, **settings)


def test_a_region_past_the_run_is_refused_when_the_count_comes_later():
    cfg = RunConfig(backend="sim", sim_regions="0-9")
    with pytest.raises(ConfigError, match="names client 9, but the run has 8"):
        Links.for_run(cfg, 1e9, 0.0, 8)
