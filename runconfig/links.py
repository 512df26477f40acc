"""How the simulator's link settings are written: `sim_client_links` and `sim_regions`
(experiments/sim/links.py makes the links; runconfig/checks.py checks them)."""
from __future__ import annotations

import math


def parse_links(text: str) -> list[tuple[float, float]]:
    """`sim_client_links` as (bytes/s, latency s) pairs; ValueError unless the bandwidth is
    positive and finite and the latency non-negative and finite."""
    links = []
    for part in text.split(","):
        bandwidth, _, latency = part.partition("@")
        link = (float(bandwidth), float(latency) if latency else 0.0)
        if not (0 < link[0] < math.inf and 0 <= link[1] < math.inf):
            raise ValueError(text)
        links.append(link)
    return links


def parse_regions(text: str) -> list[list[int]]:
    """`sim_regions` as groups of client indices; ValueError unless each is a
    non-negative index or range and no client is in two groups."""
    groups = []
    for part in text.split(";"):
        group = []
        for item in part.split(","):
            first, _, last = item.partition("-")
            lo, hi = int(first), int(last) if last else int(first)
            if not 0 <= lo <= hi:
                raise ValueError(text)
            group += range(lo, hi + 1)
        groups.append(group)
    members = [c for group in groups for c in group]
    if len(members) != len(set(members)):
        raise ValueError(text)
    return groups
