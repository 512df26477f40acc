"""Dynamic local updates (DyLU; Liu et al. 2024, "Asynchronous Local-SGD Training for
Language Modeling", arXiv 2401.09135): each client's window, the minibatches it runs
between pushes, set from its measured speed relative to the fastest client's, so slow
clients push as often as fast ones:

    H_w = min(H, max(1, floor(H * v_w / v_ref)))     H = n_push (n_sync), v_ref = max v

The server decides, as only it sees every client's pushes: a client's speed v_w is the
minibatches of its push over the seconds since the server replied to it (its compute,
both transfers and its wait in the server's queue), on the run's clock (virtual in the
simulator), smoothed over pushes (`SMOOTHING`). Measured speeds differ by noise (a
client served second in the server's queue, a slower minibatch) where the hardware
does not, and the floor would take a minibatch off an equally fast client for the
smallest difference: so a speed within `TOLERANCE` of the fastest counts as the
fastest. The reply to each push carries the client's next window (`Weights.window`);
the client's loop (clients/loop.py) pushes when it has run that many minibatches since
its last push (with sharded servers the client follows server 0's reply; the others
handle the pushes in server 0's order, paramserver/drivers/follow.py). A shorter window means more pushes, never fewer minibatches: `steps`
still counts each client's minibatches.

v_ref is the fastest client still running: once the fast clients have run their steps,
the slow one is the fastest left and goes back to H. A speed is measured from the
first push on; until then a client's window is H. A checkpoint holds the speeds
(`state`), so after a resume each client's first window comes from them; the reply
times are not kept, so each client's first push after a resume is measured afresh.
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np

SMOOTHING = 0.5  # the newest measure's weight in a client's speed (an exponential moving average)
TOLERANCE = 0.05  # a speed this close to the fastest (relative) is measured as the fastest
WHOLE = 1e-9     # a ratio H * v_w / v_ref within this of a whole number counts as reaching it


def dylu_window(window: int, speeds: Sequence[float], client: int) -> int:
    """The window of `client` out of `window` (H), from every client's speed (minibatches
    a second; 0 where not measured, or not counted: a client that stopped). H while the
    client's own speed is unknown."""
    fastest = max(speeds, default=0.0)
    if speeds[client] <= 0 or fastest <= 0:
        return window
    return min(window, max(1, math.floor(window * speeds[client] / fastest + WHOLE)))


class Windows:
    """The speeds the server measures and the windows it gives, for `clients` clients."""

    def __init__(self, window: int, clients: int):
        self.window = window
        self.speeds = np.zeros(clients)               # minibatches a second; 0: not measured yet
        self.replied = np.full(clients, math.nan)     # when the server last replied to each client

    @classmethod
    def for_run(cls, settings, clients: int) -> "Windows | None":
        """The run's windows, where `dylu` is on (None: every window is n_push)."""
        return cls(settings.push_every, clients) if settings.dylu else None

    def grow(self) -> None:
        """One client more (a joiner), its speed not measured yet."""
        self.speeds = np.append(self.speeds, 0.0)
        self.replied = np.append(self.replied, math.nan)

    def pushed(self, client: int, minibatches: int, now: float) -> None:
        """`client` pushed `minibatches` minibatches at `now`: its speed since the last reply."""
        seconds = now - self.replied[client]
        if not seconds > 0:  # no reply yet (nan), or none on this clock since
            return
        rate, speed = minibatches / seconds, self.speeds[client]
        self.speeds[client] = rate if speed <= 0 else speed + SMOOTHING * (rate - speed)

    def reply(self, client: int, now: float, running: Iterable[int]) -> int:
        """The window for a reply to `client` at `now`, the fastest of the clients still
        `running` (their numbers) the reference."""
        self.replied[client] = now
        counted = np.zeros_like(self.speeds)
        running = list(running)
        counted[running] = self.speeds[running]
        fastest = counted.max()
        counted[counted >= (1 - TOLERANCE) * fastest] = fastest
        return dylu_window(self.window, counted, client)

    def state(self) -> dict[str, np.ndarray]:
        """The arrays a checkpoint holds."""
        return {"dylu.speeds": self.speeds.copy()}

    def load_state(self, arrays: dict[str, np.ndarray]) -> None:
        """The speeds a checkpoint holds (`state`'s)."""
        self.speeds[:] = arrays["dylu.speeds"]
