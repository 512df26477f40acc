"""How many servers a run needs: the fewest whose busiest server is busy at most
BUSY_BOUND of the run's time. `servers = auto` picks that count where the tool runs the
job and knows the costs before it starts (the simulator, a sweep's simulated points);
every async run's summary records the share its busiest server was busy
(`server_busy`) and, past the bound, the count that would have kept under it.

Why a half. A server is one queue. With pushes arriving at random (Poisson) and a
fixed cost each (M/D/1), a push waits on average rho / (2 (1 - rho)) of its own cost
before the server takes it, where rho is the share of time the server is busy: at 0.25
a sixth, at 0.5 a half, at 0.75 one and a half, at 0.9 four and a half. Up to a half the
wait stays below the cost that no count of servers removes (a push's own apply, which S
servers cut by S); past it the wait grows faster than the load and, at 1, without bound:
the server, not the clients, then sets the pace. Clients at equal speeds arrive in step
rather than at random, which queues them more at first, not less.
"""
from __future__ import annotations

import math
from typing import Any, Callable

BUSY_BOUND = 0.5


def expected_busy(clients: int, window_s: float, push_s: Callable[[int], float], servers: int) -> float:
    """The busiest server's share of time: `clients` pushes a window of `window_s`
    (K clients each pushing once a window), each costing it `push_s(servers)`."""
    return clients * push_s(servers) / window_s


def servers_for(clients: int, window_s: float, push_s: Callable[[int], float]) -> int:
    """The fewest servers, at most one a client, whose busiest is busy at most BUSY_BOUND:
    one wherever one is (so no server is added where pushes are cheap)."""
    return next((s for s in range(1, clients) if expected_busy(clients, window_s, push_s, s) <= BUSY_BOUND),
                max(clients, 1))


def server_load(busy_s: float | None, time_s: float, servers: int) -> dict[str, Any]:
    """The summary's `server_busy` (busiest server's busy seconds over the run's), and past
    BUSY_BOUND `servers_needed`: the count that would have kept it under the bound, a
    server's cost going with its slice (1/S). A floor: a saturated server is busy at
    most all the time, however much more work was waiting."""
    if busy_s is None or not time_s > 0:
        return {}
    share = busy_s / time_s
    over = {"servers_needed": math.ceil(share * servers / BUSY_BOUND)} if share > BUSY_BOUND else {}
    return {"server_busy": share, **over}


def load_note(load: dict[str, Any], servers: int) -> str:
    """The console's word on a run its servers bounded (empty where they did not)."""
    if "servers_needed" not in load:
        return ""
    return (f"; the server{'s were' if servers > 1 else ' was'} the bound, busy {load['server_busy']:.0%} of the "
            f"run: --servers {load['servers_needed']} or more would keep each under {BUSY_BOUND:.0%}")
