"""How many servers a run needs (experiments/run/sizing.py), and `servers = auto` in the config."""
from __future__ import annotations

import math

import pytest

from experiments.run.sizing import BUSY_BOUND, load_note, server_load, servers_for
from experiments.sim.costs import sized
from runconfig.settings import ConfigError, RunConfig


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


def test_the_default_is_auto_and_one_server_wherever_the_tool_cannot_size_it():
    assert RunConfig().servers == 1  # MPI: the ranks are fixed before any rank times a push
    assert RunConfig(backend="sim", mode="sync").servers == 1  # no server
    assert RunConfig(backend="sim").servers == "auto"  # the simulator picks from the costs
    assert RunConfig(backend="sim", servers=1).servers == 1  # a typed count stands


@pytest.mark.parametrize("settings", [{"lr_scaling": "adascale"},
                                      {"rule": "fresh", "fresh_batch": "auto"},
                                      {"rule": "sgd", "clip_grad_norm": 1.0}])
def test_the_default_is_one_server_where_a_setting_needs_one(settings):
    """Each of these refuses several servers in its own check; the default, which nobody
    typed, must not turn that into a refusal: it is one server there."""
    assert RunConfig(backend="sim", **settings).servers == 1
    with pytest.raises(ConfigError):
        RunConfig(backend="sim", servers=2, **settings)


def test_a_config_fault_is_still_named_for_itself_under_the_default():
    with pytest.raises(ConfigError, match="^lr: must be positive"):
        RunConfig(backend="sim", lr=-1.0)


@pytest.mark.parametrize("clients,servers", [(1, 1), (2, 1), (8, 2), (32, 6)])
def test_the_default_at_the_studys_costs(clients, servers):
    """The scaling study's costs (6 ms a minibatch, 0.23 ms of server time a push, the
    proxy CNN's 206,922 float32 on the measured profile's links) under the default fresh:
    8 x 0.307 ms / 6 ms = 0.41 busy on one server, past a third, so two at 8 clients
    (each charged a slice's 0.115 ms), six at 32; never more than the clients."""
    cfg = RunConfig(backend="sim", rule="fresh", sim_step_time=0.006, sim_apply_time=0.00023)
    picked, timing = sized(cfg, None, None, 206_922, clients)
    assert picked.servers == timing.servers == servers
    assert timing.apply_time == pytest.approx(0.00023 / servers)


def test_the_default_adds_no_server_where_pushes_are_cheap():
    """The issue's held-out case: 0.1 ms a push, 5 ms a minibatch, 8 clients: with the
    reply's send, 8 x 0.177 ms / 5 ms = 0.28 busy, where a second server gained nothing."""
    cfg = RunConfig(backend="sim", rule="fresh", sim_step_time=0.005, sim_apply_time=0.0001)
    assert sized(cfg, None, None, 206_922, 8)[0].servers == 1


def test_a_gathering_rule_keeps_its_server_under_a_third():
    """fresh answers a step's pushes once it is taken: the clients wait out up to all of
    the server's time, idle up to rho / (1 + rho), at most a quarter where rho <= 1/3."""
    assert servers_for(8, 6e-3, lambda s: 0.3e-3 / s, gathers=True) == 2  # 8 x 0.3 / 6 = 0.4 on one
    assert servers_for(8, 5e-3, lambda s: 0.177e-3 / s, gathers=True) == 1  # 0.28: no server added
    assert servers_for(32, 6e-3, lambda s: 0.3e-3 / s, gathers=True) == 5  # 1.6 x 3 = 4.8
    assert server_load(0.3, 1.0, 1, gathers=True) == {"server_busy": 0.3}
    assert server_load(0.4, 1.0, 1, gathers=True) == {"server_busy": 0.4, "servers_needed": 2}
    assert "under 33%" in load_note(server_load(0.4, 1.0, 1, gathers=True), 1, gathers=True)
