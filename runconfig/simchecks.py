"""The simulator's settings checked: its costs and profile, its links (experiments/sim/links.py),
the joins it starts and the runs it replays (runconfig/checks.py asks it with the other groups)."""
from __future__ import annotations

import math
from typing import Any

from runconfig.links import parse_links, parse_regions
from runconfig.require import parsed as _parsed, require as _require
from rundir.modes import Mode

SIM_PROFILES = ("measured", "paper")  # their values: experiments/sim/costs.py


def check_simulator(cfg: Any) -> None:
    """The simulator's settings: its costs, links, joins and replays."""
    for name in ("sim_step_time", "sim_apply_time", "sim_latency", "sim_bandwidth", "sim_push_bytes"):
        _require(getattr(cfg, name) >= 0, name, f"must be non-negative (0: the profile's), got {getattr(cfg, name)}")
    _check_links(cfg)
    _require(cfg.sim_profile in SIM_PROFILES, "sim_profile",
             f"unknown profile {cfg.sim_profile!r} (choose from {', '.join(SIM_PROFILES)})")
    _require(0 <= cfg.speed_jitter < 1, "speed_jitter", f"must be in [0, 1), got {cfg.speed_jitter}")
    _require(not cfg.replay or (cfg.backend == "sim" and cfg.mode == Mode.ASYNC), "replay",
             "needs --backend sim and --mode async")
    _require(not cfg.sim_calibrate or (cfg.backend == "sim" and cfg.mode == Mode.ASYNC), "sim_calibrate",
             "needs --backend sim and --mode async (only the async server pushes)")
    if cfg.joins:
        _check_joins(cfg)


def _check_joins(cfg: Any) -> None:
    _require(cfg.backend == "sim" and cfg.joinable, "joins", "needs --backend sim and --joinable")
    _require(not cfg.replay, "joins", "cannot be replayed (replay orders the first K clients only)")
    joins = _parsed(parse_joins, cfg.joins)
    _require(joins is not None, "joins", f"expected C@T[,C@T...] (client, virtual seconds), got {cfg.joins!r}")
    numbers = [client for client, _ in joins]
    first = cfg.clients if cfg.clients is not None else numbers[0]
    _require(numbers == list(range(first, first + len(numbers))), "joins",
             f"the joiners must be clients {first}, {first + 1}, ... in the order of their times, got {cfg.joins!r}")


def parse_joins(text: str) -> list[tuple[int, float]]:
    """`joins`' C@T pairs, sorted by time; ValueError on a malformed one or a negative time."""
    pairs = []
    for item in text.split(","):
        client, at = item.strip().split("@")
        pairs.append((int(client), float(at)))
    if any(at < 0 or not math.isfinite(at) for _, at in pairs):
        raise ValueError(text)
    return sorted(pairs, key=lambda pair: pair[1])


def _check_links(cfg: Any) -> None:
    """The simulator's links (experiments/sim/links.py); the run's client count checks the rest."""
    for name in ("sim_region_bandwidth", "sim_region_latency", "sim_server_bandwidth"):
        _require(getattr(cfg, name) >= 0, name, f"must be non-negative (0: unlimited or none), got {getattr(cfg, name)}")
    for name, parse, form in (("sim_client_links", parse_links, "BYTES_PER_S[@LATENCY_S] separated by commas, "
                               "bandwidth positive and latency non-negative"),
                              ("sim_regions", parse_regions, "client indices or ranges (0-3) separated by commas, "
                               "groups by semicolons, no client in two groups")):
        text = getattr(cfg, name)
        _require(not text or _parsed(parse, text) is not None, name, f"expected {form}, got {text!r}")
        _require(not text or (cfg.backend == "sim" and cfg.mode == Mode.ASYNC), name,
                 "needs --backend sim and --mode async (a collective's allreduce is charged at sim_bandwidth)")
    if cfg.clients is not None and cfg.sim_client_links:
        count = len(parse_links(cfg.sim_client_links))
        _require(count in (1, cfg.clients), "sim_client_links", f"lists {count} links for {cfg.clients} clients")
    if cfg.clients is not None and cfg.sim_regions:
        named = max(max(group) for group in parse_regions(cfg.sim_regions))
        _require(named < cfg.clients, "sim_regions", f"names client {named}, but the run has {cfg.clients}")
