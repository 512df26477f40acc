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
rather than at random, which queues them more at first, not less. At a half, each of
eight clients waits for the server (its own push and the queue before it) about
0.5 / 8 x 1.5, a tenth of its window.

A rule that gathers pushes into a step (`fresh`) answers them once the step is taken:
every client of the step may wait out the server's whole time for it, so a window of w
takes up to w (1 + rho) and the clients are idle up to rho / (1 + rho) of the time:
GATHER_BOUND, a third, keeps them idle at most a quarter, the queue's wait meanwhile a
quarter of a push. It sits between the study's two measurements (issue 56), each a
push's apply plus its reply's send (the proxy CNN's 0.83 MB at the measured profile's
11 GB/s, 0.077 ms): 0.1 ms of apply against a 5 ms minibatch at 8 clients (8 x 0.177 /
5 = 0.28 busy) where a second server gained nothing, 0.23 ms against 6.0 ms (8 x 0.307
/ 6 = 0.41) where a second took the default from 0.72 to 0.82 of C(8).
"""
from __future__ import annotations

import math
from typing import Any, Callable

BUSY_BOUND = 0.5
GATHER_BOUND = 1 / 3


def bound(gathers: bool) -> float:
    return GATHER_BOUND if gathers else BUSY_BOUND


def expected_busy(clients: int, window_s: float, push_s: Callable[[int], float], servers: int) -> float:
    """The busiest server's share of time: `clients` pushes a window of `window_s`
    (K clients each pushing once a window), each costing it `push_s(servers)`."""
    return clients * push_s(servers) / window_s


def servers_for(clients: int, window_s: float, push_s: Callable[[int], float], gathers: bool = False) -> int:
    """The fewest servers, at most one a client, whose busiest is busy at most the bound:
    one wherever one is (so no server is added where pushes are cheap)."""
    return next((s for s in range(1, clients) if expected_busy(clients, window_s, push_s, s) <= bound(gathers)),
                max(clients, 1))


def server_load(busy_s: float | None, time_s: float, servers: int, gathers: bool = False) -> dict[str, Any]:
    """The summary's `server_busy` (busiest server's busy seconds over the run's), and past
    the bound `servers_needed`: the count that would have kept it under the bound, a
    server's cost going with its slice (1/S). A floor: a saturated server is busy at
    most all the time, however much more work was waiting."""
    if busy_s is None or not time_s > 0:
        return {}
    share = busy_s / time_s
    over = {"servers_needed": math.ceil(share * servers / bound(gathers))} if share > bound(gathers) else {}
    return {"server_busy": share, **over}


def load_note(load: dict[str, Any], servers: int, gathers: bool = False) -> str:
    """The console's word on a run its servers bounded (empty where they did not)."""
    if "servers_needed" not in load:
        return ""
    return (f"; the server{'s were' if servers > 1 else ' was'} the bound, busy {load['server_busy']:.0%} of the "
            f"run: --servers {load['servers_needed']} or more would keep each under {bound(gathers):.0%}")
