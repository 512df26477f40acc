"""How many servers a run needs (experiments/run/sizing.py), and `servers = auto` in the config."""
from __future__ import annotations

import math

import pytest

from experiments.run.sizing import BUSY_BOUND, load_note, server_load, servers_for
from runconfig.settings import RunConfig


def test_one_server_wherever_one_is_under_the_bound():
    # the held-out task: 0.1 ms a push, 5 ms a minibatch, 8 clients: 16 % busy
    assert servers_for(8, 5e-3, lambda s: 1e-4) == 1
    assert servers_for(8, 5e-3, lambda s: 1e-4 / s) == 1


@pytest.mark.parametrize("clients,push", [(8, 2.46e-3), (32, 2.46e-3), (8, 0.5e-3), (4, 0.7e-3)])
def test_the_fewest_servers_whose_busiest_is_under_the_bound(clients, push):
    """A push costing `push` on one server and push / S on each of S: the smallest S with
    K * push / S / window <= 1/2, at most one a client."""
    window = 6e-3
    picked = servers_for(clients, window, lambda s: push / s)
    assert picked == min(clients, math.ceil(clients * push / window / BUSY_BOUND - 1e-12))
    assert picked == 1 or clients * push / (picked - 1) / window > BUSY_BOUND


def test_never_more_servers_than_clients_even_where_the_bound_is_out_of_reach():
    assert servers_for(4, 1e-3, lambda s: 1e-3 + 1e-3 / s) == 4  # a fixed 1 ms no count of servers removes
    assert servers_for(1, 1e-3, lambda s: 1.0) == 1


def test_the_summary_records_the_busy_share_and_past_the_bound_the_count_needed():
    assert server_load(0.3, 1.0, 1) == {"server_busy": 0.3}
    assert server_load(0.9, 1.0, 2) == {"server_busy": 0.9, "servers_needed": 4}  # 0.9 * 2 / 0.5 = 3.6
    assert server_load(None, 1.0, 1) == {} and server_load(0.1, 0.0, 1) == {}
    assert load_note({"server_busy": 0.3}, 1) == ""
    assert "busy 90% of the run: --servers 4 or more" in load_note(server_load(0.9, 1.0, 2), 2)


def test_auto_is_one_server_wherever_the_tool_cannot_size_it():
    assert RunConfig(servers="auto").servers == 1  # MPI: no push cost before launch
    assert RunConfig(backend="sim", mode="sync", servers="auto").servers == 1
    assert RunConfig(backend="sim", servers="auto").servers == "auto"  # the simulator picks


def test_a_gathering_rule_keeps_its_server_under_a_quarter():
    """fresh answers a step's pushes once it is taken: the clients wait out all of the
    server's time, idle rho / (1 + rho), at most a fifth where rho <= 1/4."""
    assert servers_for(8, 6e-3, lambda s: 0.3e-3 / s, gathers=True) == 2  # 8 x 0.3 / 6 = 0.4 on one
    assert servers_for(8, 5e-3, lambda s: 0.1e-3 / s, gathers=True) == 1  # 0.16: no server added
    assert servers_for(32, 6e-3, lambda s: 0.3e-3 / s, gathers=True) == 7  # 1.6 / 0.25 = 6.4
    assert server_load(0.3, 1.0, 1, gathers=True) == {"server_busy": 0.3, "servers_needed": 2}
    assert "under 25%" in load_note(server_load(0.3, 1.0, 1, gathers=True), 1, gathers=True)
