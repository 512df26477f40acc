"""`replay`: the order in which a recorded run's server took each client's first pull,
every applied push and each STOP, so a real (MPI) run's staleness pattern re-runs in the
simulator deterministically (docs/simulator.md). Apart from the event loop
(experiments/sim/simulator.py), which parks each message until the order reaches it.
"""
from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

from paramserver.wire.protocol import Tag
from rundir.durable import read_jsonl
from runconfig.settings import ConfigError, RunConfig


def replay_order(cfg: RunConfig, clients: int) -> list[tuple[Tag, int]]:
    """The order in which a recorded run's server took each client's first pull, every
    applied push and each STOP. A first pull goes right after the push that made the
    version the client pulled (clients.jsonl's `version_pulled`), so every client starts
    from the weights it started from then; later pulls come with their pushes
    (n_fetch == n_push)."""
    if cfg.push_every != cfg.fetch_every:
        raise ConfigError("replay: needs n_push == n_fetch (later pulls are not recorded apart from pushes)")
    run = Path(cfg.replay)
    try:
        pushes = [row["client"] for row in read_jsonl(run / "server.jsonl") if "version" in row]
        first_pull: dict[int, int] = {}
        for row in read_jsonl(run / "clients.jsonl"):
            if "version_pulled" in row:
                first_pull.setdefault(row["client"], row["version_pulled"])
    except (OSError, ValueError, KeyError) as error:
        raise ConfigError(f"replay: cannot read the logs of {run} ({error})") from None
    counts = Counter(pushes)  # under the run's budget a fast client pushed more than a slow one
    per_client = math.ceil(cfg.steps / cfg.push_every)
    budget = clients * cfg.steps  # the run's: its pushes' windows make it, the last ones under way with it
    fits = budget <= len(pushes) * cfg.push_every < budget + clients * cfg.fetch_every if cfg.run_budget \
        else set(counts.values()) == {per_client}
    if sorted(counts) != list(range(clients)) or sorted(first_pull) != list(range(clients)) or not fits:
        held = f"{budget} minibatches from" if cfg.run_budget else f"{per_client} pushes from each of"
        raise ConfigError(f"replay: {run} does not hold {held} {clients} clients")
    order = [(Tag.PULL, c) for c, v in first_pull.items() if v == 0]
    done = {c: 0 for c in range(clients)}
    for version, client in enumerate(pushes, start=1):
        order.append((Tag.PUSH, client))
        done[client] += 1
        if done[client] == counts[client]:  # its STOP must not overtake its parked last push
            order.append((Tag.STOP, client))
        order += [(Tag.PULL, c) for c, v in first_pull.items() if v == version]
    return order
