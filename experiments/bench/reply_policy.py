"""The policy model of `fresh_reply`: how long a step of `fresh` (S = K, R = 0) takes under
the scaling study's straggler model (lognormal sigma 0.5 a minibatch, the last client 2x
slow) with each reply policy, without training: compute times only, in units of one
minibatch's median time, no server or wire cost. `auto` is paramserver/pace.py's own
`Pace` on the model's clock, at several values of its `LEAN`; `oracle` knows every
client's next compute time. Beside them, sync (every step waits for the slowest) and sync
with one backup worker (the second slowest).

    python -m experiments.bench.reply_policy [--steps 3000] [--seeds 3]

Prints, per K and policy, the mean time a step takes and the share of gradients dropped.
"""
from __future__ import annotations

import argparse
import heapq

import numpy as np

from paramserver.pace import LEAN, Pace


class Model:
    """K clients pushing to one fresh server on a virtual clock."""

    def __init__(self, clients: int, policy: str, seed: int, lean: float = LEAN):
        self.k, self.policy = clients, policy
        self.rng = np.random.default_rng(seed)
        self.now, self.version, self.covered = 0.0, 0, 0
        self.pace = Pace(lambda: self.now, lean)
        self.pulled, self.finish, self.ahead = [0] * clients, {}, [self.draw(c) for c in range(clients)]
        self.deferred: list[int] = []
        self.events: list[tuple[float, int]] = []
        self.used = self.dropped = 0

    def draw(self, client: int) -> float:
        return float(np.exp(0.5 * self.rng.standard_normal())) * (2.0 if client == self.k - 1 else 1.0)

    def start(self, client: int) -> None:
        self.pulled[client] = self.version
        self.pace.replied(client)
        took, self.ahead[client] = self.ahead[client], self.draw(client)
        self.finish[client] = self.now + took
        heapq.heappush(self.events, (self.now + took, client))

    def waits(self, client: int) -> bool:
        computing = [c for c in self.finish if self.pulled[c] == self.version]
        needed = self.k - self.covered
        if self.policy == "wait":
            return True
        if self.policy == "oracle":
            due = sorted(self.finish[c] for c in computing)
            return len(due) >= needed and self.now + self.ahead[client] >= due[needed - 1]
        return self.pace.waits(client, needed, computing)

    def step_time(self, steps: int) -> tuple[float, float]:
        for c in range(self.k):
            self.start(c)
        while self.version < steps:
            self.now, client = heapq.heappop(self.events)
            del self.finish[client]
            self.pace.pushed(client)
            if self.pulled[client] != self.version:
                self.dropped += 1
                self.start(client)
                continue
            self.used += 1
            self.covered += 1
            if self.covered == self.k:
                self.version, self.covered = self.version + 1, 0
                for c in [client, *self.deferred]:
                    self.start(c)
                self.deferred.clear()
            elif self.waits(client):
                self.deferred.append(client)
            else:
                self.start(client)
        return self.now / steps, self.dropped / (self.used + self.dropped)


def sync_step(clients: int, seed: int, steps: int, backups: int) -> float:
    rng = np.random.default_rng(seed)
    times = np.exp(0.5 * rng.standard_normal((steps, clients)))
    times[:, -1] *= 2.0
    return float(np.sort(times, axis=1)[:, clients - 1 - backups].mean())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args(argv)
    print("K  policy          time/step  dropped   (seed means; time in median minibatches)")
    for k in (8, 32):
        seeds = range(args.seeds)
        for name, backups in (("sync", 0), ("sync, 1 backup", 1)):
            print(f"{k:<3}{name:<16}{np.mean([sync_step(k, s, args.steps, backups) for s in seeds]):>9.2f}")
        policies = [("wait", "wait", LEAN), ("oracle", "oracle", LEAN)]
        policies += [(f"auto, lean {lean}", "auto", lean) for lean in (1.0, 0.85, LEAN, 0.5)]
        for name, policy, lean in policies:
            runs = [Model(k, policy, s, lean).step_time(args.steps) for s in seeds]
            print(f"{k:<3}{name:<16}{np.mean([r[0] for r in runs]):>9.2f}{np.mean([r[1] for r in runs]):>9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
