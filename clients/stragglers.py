"""Stragglers, uneven hardware and failures: how long a client's minibatch takes, and
when the client is lost for a while, seeded.

    time of client i's step t = compute x slow_i / speed_i x exp(sigma z[i, t]) + pause[i, t]

`speed_i` is client i's hardware speed relative to the fastest (1): listed
(`client_speeds`), or drawn once, log-uniform in [speed_spread, 1]; `slow_i` is
`slow_factor` for the last `slow_clients` clients (1 otherwise); z[i, t] a standard
normal (so the lognormal factor has median 1); with probability `pause_prob` a step is
followed by a pause of `pause_time` seconds. `compute` is the client's base time, its
minibatch at speed 1. Each draw is a pure function of (seed, client, step), so a run and
its resume, and both backends, see the same stragglers whatever order the clients run
in. The simulator puts the whole time on its virtual clock (`compute` is its step time);
under MPI a client sleeps the excess over what its step really took
(`Stragglers.extra`), so the effect shows on a 2-core machine too; there a factor below
1 cannot make a step faster than the hardware, and counts as 1.

Failures (`Failures`): a client fails at exponential times, `mtbf` base minibatch times
apart on average, counted over the time it computes (a minibatch exposes it for its
`factor`, its length in base times); the memoryless draw makes that one seeded coin a
minibatch, of chance 1 - exp(-factor / mtbf), struck at the minibatch's end. The work
since its last push (the failing minibatch included) is lost; it is down for
`failure_length` base times and comes back with the server's weights.
"""
from __future__ import annotations

import math
import time

import numpy as np

from runconfig.checks import parse_speeds

_STREAM = 0x57A6  # keeps these draws apart from every other use of the seed
_SPEEDS = 0x5BEE  # the clients' speeds
_FAILS = 0xFA11   # the failures


def client_speeds(seed: int, clients: int, spread: float = 0.0, listed: str = "") -> list[float]:
    """Each client's speed relative to the fastest: as `listed` ("1,0.5,0.25"), or drawn
    log-uniform in [spread, 1] from (seed, client) alone (so client i's speed does not
    depend on how many clients run); all 1 without either."""
    if listed:
        speeds = parse_speeds(listed)
        if len(speeds) != clients:
            raise ValueError(f"client_speeds: lists {len(speeds)} speeds for {clients} clients")
        return speeds
    if not spread:
        return [1.0] * clients
    return [math.exp(np.random.default_rng([seed, _SPEEDS, i]).uniform(math.log(spread), 0.0))
            for i in range(clients)]


class Stragglers:
    def __init__(self, seed: int, clients: int, sigma: float = 0.0, slow_clients: int = 0,
                 slow_factor: float = 1.0, pause_prob: float = 0.0, pause_time: float = 0.0,
                 speeds: list[float] | None = None):
        if slow_clients > clients:
            raise ValueError(f"slow_clients: must be at most clients ({clients}), got {slow_clients}")
        self.seed, self.clients, self.sigma = seed, clients, sigma
        self.speeds = speeds or [1.0] * clients
        self.slow = [(slow_factor if i >= clients - slow_clients else 1.0) / self.speeds[i] for i in range(clients)]
        self.pause_prob, self.pause_time = pause_prob, pause_time

    @classmethod
    def for_run(cls, cfg, clients: int) -> "Stragglers":
        """The run config's straggler model for `clients` clients."""
        speeds = client_speeds(cfg.seed, clients, cfg.speed_spread, cfg.client_speeds)
        return cls(cfg.seed, clients, cfg.step_sigma, cfg.slow_clients, cfg.slow_factor, cfg.pause_prob,
                   cfg.pause_time, speeds)

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


class Failures:
    """When clients fail (see the module's doc): `fails(client, step, attempt)`, a pure
    function of (seed, client, step, attempt); `attempt` counts a sync step's tries of
    the same minibatch after a failure. `length`: base minibatch times a client is down."""

    def __init__(self, stragglers: Stragglers, mtbf: float, length: float):
        self.stragglers, self.mtbf, self.length = stragglers, mtbf, length

    @classmethod
    def for_run(cls, cfg, stragglers: Stragglers) -> "Failures | None":
        """The run's failures (None without `mtbf`)."""
        return cls(stragglers, cfg.mtbf, cfg.failure_length) if cfg.mtbf else None

    def fails(self, client: int, step: int, attempt: int = 0) -> bool:
        exposure = self.stragglers.factor(client, step)
        coin = np.random.default_rng([self.stragglers.seed, _FAILS, client, step, attempt]).random()
        return bool(coin < -math.expm1(-exposure / self.mtbf))

    def schedule(self, client: int, steps: int) -> list[int]:
        """The steps (1..steps) after which `client` fails, first tries only: what both
        backends' records show for an async run."""
        return [step for step in range(1, steps + 1) if self.fails(client, step)]
