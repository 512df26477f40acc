"""Stragglers: how much longer than its compute a client's minibatch takes, seeded.

    time of client i's step t = compute x slow_i x exp(sigma z[i, t]) + pause[i, t]

`slow_i` is `slow_factor` for the last `slow_clients` clients (1 otherwise), z[i, t] a
standard normal (so the lognormal factor has median 1), and with probability
`pause_prob` a step is followed by a pause of `pause_time` seconds. Each draw is a pure
function of (seed, client, step), so a run and its resume see the same stragglers
whatever order the clients run in. The simulator puts the whole time on its virtual
clock (`compute` is its step time); under MPI a client sleeps the excess over what its
step really took (`Stragglers.extra`), so the effect shows on a 2-core machine too;
there a factor below 1 cannot make a step faster than the hardware, and counts as 1.
"""
from __future__ import annotations

import math
import time

import numpy as np

_STREAM = 0x57A6  # keeps these draws apart from every other use of the seed


class Stragglers:
    def __init__(self, seed: int, clients: int, sigma: float = 0.0, slow_clients: int = 0,
                 slow_factor: float = 1.0, pause_prob: float = 0.0, pause_time: float = 0.0):
        if slow_clients > clients:
            raise ValueError(f"slow_clients: must be at most clients ({clients}), got {slow_clients}")
        self.seed, self.clients, self.sigma = seed, clients, sigma
        self.slow = [slow_factor if i >= clients - slow_clients else 1.0 for i in range(clients)]
        self.pause_prob, self.pause_time = pause_prob, pause_time

    @classmethod
    def for_run(cls, cfg, clients: int) -> "Stragglers":
        """The run config's straggler model for `clients` clients."""
        return cls(cfg.seed, clients, cfg.step_sigma, cfg.slow_clients, cfg.slow_factor, cfg.pause_prob,
                   cfg.pause_time)

    @property
    def active(self) -> bool:
        return bool(self.sigma or self.pause_prob and self.pause_time or any(f != 1.0 for f in self.slow))

    def factor(self, client: int, step: int) -> float:
        """The compute time multiplier of `client`'s minibatch number `step` (from 1)."""
        z = self._draws(client, step)[0] if self.sigma else 0.0
        return self.slow[client] * math.exp(self.sigma * z)

    def pause(self, client: int, step: int) -> float:
        """Seconds of pause after that minibatch."""
        if not (self.pause_prob and self.pause_time):
            return 0.0
        return self.pause_time if self._draws(client, step)[1] < self.pause_prob else 0.0

    def duration(self, client: int, step: int, compute: float) -> float:
        """The minibatch's whole time, given its compute time."""
        return compute * self.factor(client, step) + self.pause(client, step)

    def extra(self, client: int, step: int, compute: float) -> float:
        """Seconds a real client sleeps after a minibatch whose compute took `compute`."""
        return max(0.0, self.duration(client, step, compute) - compute)

    def sleep_after(self, client: int, step: int, compute: float) -> None:
        if self.active:
            time.sleep(self.extra(client, step, compute))

    def _draws(self, client: int, step: int) -> tuple[float, float]:
        rng = np.random.default_rng([self.seed, _STREAM, client, step])
        return float(rng.standard_normal()), float(rng.random())
