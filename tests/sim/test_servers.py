"""Servers sized to the work in the simulator (`--servers auto`) and every async run's
`server_busy` (experiments/run/sizing.py)."""
from __future__ import annotations

import json
import math

from experiments.cli import main
from tests.sim.test_sim import TIMED, sim

FLAGS = ["--rule", "add", "--clients", "4", "--steps", "8"]  # 10 ms a minibatch (TIMED), a push a minibatch


def summary(run) -> dict:
    return json.loads((run / "summary.json").read_text())


def test_the_default_is_one_server_and_the_same_run_where_one_suffices(tmp_path, tiny_npz):
    """0.1 ms a push: four clients keep one server busy about 4 % of the time, so the
    default (`servers = auto`) adds none."""
    one = sim(tmp_path / "one", tiny_npz, *FLAGS, "--servers", "1")
    auto = sim(tmp_path / "auto", tiny_npz, *FLAGS)
    for log in ("clients.jsonl", "server.jsonl"):
        assert (auto / log).read_bytes() == (one / log).read_bytes()
    config = json.loads((auto / "config.json").read_text())
    assert config["servers"] == 1 and config["provenance"]["sim"]["servers_asked"] == "auto"
    s = summary(auto)
    assert s["server_busy"] == s["server_busy_s"] / s["time_s"] < 0.5 and "servers_needed" not in s


def test_auto_adds_servers_where_pushes_are_dear_and_keeps_each_under_half(tmp_path, tiny_npz, capsys):
    """4 ms a push on one server against a 10 ms window: four clients would keep it busy
    1.6 times over. A server's share goes with its slice: S = 4 is the first under half
    (4 x (4 / S ms + a slice's reply) / 10 ms); one server says it was the bound."""
    dear = ["--sim-apply-time", "0.004"]
    auto = sim(tmp_path / "auto", tiny_npz, *FLAGS, *dear)
    assert json.loads((auto / "config.json").read_text())["servers"] == 4
    assert summary(auto)["server_busy"] <= 0.5
    flags = [*TIMED, *FLAGS, *dear, "--servers", "1"]
    flags.remove("--quiet")
    assert main(["train", "--backend", "sim", "--data", str(tiny_npz), "--out", str(tmp_path / "one"), *flags]) == 0
    one = summary(tmp_path / "one")
    assert one["server_busy"] > 0.5 and one["servers_needed"] == math.ceil(one["server_busy"] / 0.5)
    assert f"the server was the bound, busy {one['server_busy']:.0%}" in capsys.readouterr().out
    assert one["time_s"] > summary(auto)["time_s"]


def test_the_pace_with_two_servers_decides_as_with_one_at_equal_costs(tmp_path, tiny_npz):
    """Server 0 decides for the run (paramserver/drivers/follow.py), so `fresh_reply = "auto"` no
    longer waits with several servers: at the costs of one server (an apply that does not
    shrink with the slice, transfers that take no time) a straggling run answers the same
    clients at the same virtual times with two servers as with one, pushes dropped alike."""
    flags = ["--rule", "fresh", "--fresh-reply", "auto", "--clients", "4", "--steps", "16", "--slow-clients", "1",
             "--slow-factor", "3", "--step-sigma", "0.3", "--sim-bandwidth", "1e30", "--sim-latency", "0.0002"]
    one = sim(tmp_path / "one", tiny_npz, *flags, "--servers", "1")
    two = sim(tmp_path / "two", tiny_npz, *flags, "--servers", "2")
    assert json.loads((two / "config.json").read_text())["servers"] == 2
    for log in ("clients.jsonl", "server.jsonl"):
        assert (two / log).read_bytes() == (one / log).read_bytes()
    s = summary(two)
    assert s["pushes_dropped"] > 0 and s["version"] == summary(one)["version"]  # the pace computed again, and waited


def test_auto_counts_the_bytes_the_codec_puts_on_the_wire(tmp_path, tiny_npz):
    """A slow link: float32 replies make one server's sends the bound, and auto adds
    servers; int8 pushes and replies carry about a quarter of the bytes, so auto needs
    fewer (it once counted float32's bytes whatever the codec)."""
    slow = ["--sim-bandwidth", "2e7", "--sim-latency", "0"]  # 20 MB/s
    plain = sim(tmp_path / "plain", tiny_npz, *FLAGS, *slow)
    packed = sim(tmp_path / "int8", tiny_npz, *FLAGS, *slow, "--compress", "int8", "--compress-pulls")
    servers = [json.loads((run / "config.json").read_text())["servers"] for run in (plain, packed)]
    assert servers[0] > 1 and servers[1] < servers[0], servers


def test_auto_never_exceeds_the_clients(tmp_path, tiny_npz):
    """0.1 s a push against a 10 ms window: no count of servers keeps two clients' server
    under the bound, and auto stops at one a client."""
    auto = sim(tmp_path / "auto", tiny_npz, "--rule", "add", "--clients", "2", "--steps", "4",
               "--sim-apply-time", "0.1")
    assert json.loads((auto / "config.json").read_text())["servers"] == 2


def test_a_resume_keeps_the_count_its_run_recorded_and_what_each_server_was_charged(tmp_path, tiny_npz):
    """The default picked 4 servers (4 ms a push, test above); config.json records them and
    a slice's 1 ms, so going on with more steps neither refuses the sharded run nor
    charges its servers differently."""
    run = sim(tmp_path / "run", tiny_npz, *FLAGS, "--sim-apply-time", "0.004")
    recorded = json.loads((run / "config.json").read_text())
    assert recorded["servers"] == 4 and recorded["sim_apply_time"] == 0.001
    assert main(["train", "--resume", str(run), "--steps", "12", "--quiet"]) == 0
    resumed = json.loads((run / "config.json").read_text())
    assert resumed["servers"] == 4 and resumed["provenance"]["sim"]["apply_time"] == 0.001
    assert summary(run)["status"] == "complete" and summary(run)["server_busy"] <= 0.5
