"""Links that cost, end to end: what the server's log shows of a slow client, a shared
region and a saturated server link (experiments/sim/links.py). Every push carries 1 MB
(--sim-push-bytes), so a link's time for one is 1e6 / bandwidth seconds."""
from __future__ import annotations

import pytest

from experiments.cli import main
from tests.sim.test_sim import rows, sim

MB = ["--sim-push-bytes", "1000000"]


def push_times(run, client: int | None = None) -> list[float]:
    return [r["time"] for r in rows(run, "server") if "version" in r and client in (None, r["client"])]


def test_a_slow_clients_push_arrives_later_by_its_bytes_over_its_bandwidth(tmp_path, tiny_npz):
    """One client alone, on a fast link and on a slow one: its first push lands later by
    the difference twice, the weights of its first pull and then its push crossing the link."""
    fast, slow = (push_times(sim(tmp_path / name, tiny_npz, "--clients", "1", "--steps", "2", *MB,
                                 "--sim-client-links", link)) for name, link in (("fast", "1e9"), ("slow", "1e8")))
    assert slow[0] - fast[0] == pytest.approx(2 * (1e6 / 1e8 - 1e6 / 1e9), rel=1e-9)
    assert slow[1] - slow[0] - (fast[1] - fast[0]) == pytest.approx(2 * (1e6 / 1e8 - 1e6 / 1e9), rel=1e-9)


def test_two_clients_of_one_region_take_turns_on_its_link(tmp_path, tiny_npz):
    flags = ["--clients", "2", "--steps", "2", *MB, "--sim-client-links", "1e10"]
    apart = sim(tmp_path / "apart", tiny_npz, *flags)
    shared = sim(tmp_path / "shared", tiny_npz, *flags, "--sim-regions", "0-1", "--sim-region-bandwidth", "1e8")
    first, second = push_times(shared)[:2]
    assert second - first == pytest.approx(1e6 / 1e8, rel=1e-9)  # the second waited for the first's bytes
    alone = push_times(apart)[:2]
    assert alone[1] - alone[0] < 1e-3  # on their own links they land together: one push's service apart


def test_a_saturated_server_link_bounds_the_rate_of_pushes(tmp_path, tiny_npz):
    """Four clients (the add rule: each push answered at once) each ask the server's link
    for 10 ms in and 10 ms out a window of 10 ms: the link takes 10 ms a push, so pushes
    land at least that far apart, at 100 a second, however fast the clients are."""
    run = sim(tmp_path / "run", tiny_npz, "--rule", "add", "--clients", "4", "--steps", "10", *MB,
              "--sim-client-links", "1e10", "--sim-server-bandwidth", "1e8", "--servers", "1")  # one server's link
    times = push_times(run)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert min(gaps) >= 1e6 / 1e8 * (1 - 1e-9)
    assert (len(times) - 1) / (times[-1] - times[0]) == pytest.approx(100, rel=0.05)  # and the link stays busy


def test_a_region_naming_a_missing_client_exits_2_in_one_line(tmp_path, tiny_npz, capsys):
    assert main(["train", "--backend", "sim", "--data", str(tiny_npz), "--out", str(tmp_path / "run"),
                 "--clients", "4", "--sim-regions", "0-1;4", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "asgd: error: sim_regions: names client 4, but the run has 4"
