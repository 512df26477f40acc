"""The policy model of `fresh_reply`: how long a step of `fresh` (S = K, R = 0) takes with
each reply policy under each straggler model, without training: compute times only, in
base minibatch times, no server or wire cost. The straggler models are the project's own
(clients/stragglers.py, drawn from (seed, client, minibatch) as both backends draw them):

- study: lognormal sigma 0.5 a minibatch, the last client 2x slow (the scaling study's);
- spread: each client's speed drawn once, log-uniform in [0.1, 1];
- failures: equal speeds, a failure every 100 base times of computing per client (mean),
  each down for 20; the server does not see a failure, only the client's return;
- equal: equal speeds;
- study+failures, spread+failures: those stragglers and those failures together.

Policies: `wait`; `lean L`, paramserver/reply/pace.py's own `Pace` on the model's clock at its
`LEAN` L (`fresh_reply = "auto"` at LEAN 0.7: compute again iff L x the mean compute time
brings the push in before the step, an overdue client due now; `lean L overdue F`: with
the step taken without a client computing past F x its mean, as paramserver/reply/policy.py
takes it, the server waking then); `spread`, the rule
derived from each client's mean and spread (bench/studies/spread_pace.py); `oracle`,
which knows every client's next compute time and failure. Beside them, sync (every step waits for the slowest, and for a
failed client's return) and sync with one backup worker, both as the simulator times
them (experiments/sim/simulator.py's `LockstepClock`).

    python -m bench.studies.reply_policy [--steps 1000] [--seeds 3] [--models study,spread]

Prints, per model, K and policy, the seeds' mean time a step takes, the gradients that
enter a step per base time, and the share of computed minibatches dropped (late) or lost
(failed).
"""
from __future__ import annotations

import argparse
import heapq

import numpy as np

from clients.collective import Lockstep, LockstepFates
from clients.stragglers import Failures, Stragglers, client_speeds
from experiments.sim.simulator import LockstepClock, SimTiming
from bench.studies.spread_pace import SpreadPace
from paramserver.reply.pace import LEAN, Pace
from rundir.modes import Mode

def study(seed: int, clients: int) -> Stragglers:
    return Stragglers(seed, clients, 0.5, slow_clients=1, slow_factor=2.0)


def spread(seed: int, clients: int) -> Stragglers:
    return Stragglers(seed, clients, speeds=client_speeds(seed, clients, 0.1))


MODELS = {  # name -> (seed, clients) -> (stragglers, mtbf, failure_length)
    "study": lambda seed, k: (study(seed, k), None, None),
    "spread": lambda seed, k: (spread(seed, k), None, None),
    "failures": lambda seed, k: (Stragglers(seed, k), 100.0, 20.0),
    "equal": lambda seed, k: (Stragglers(seed, k), None, None),
    "study+failures": lambda seed, k: (study(seed, k), 100.0, 20.0),
    "spread+failures": lambda seed, k: (spread(seed, k), 100.0, 20.0),
}


def straggler_model(name: str, seed: int, clients: int) -> tuple[Stragglers, Failures | None]:
    stragglers, mtbf, length = MODELS[name](seed, clients)
    return stragglers, Failures(stragglers, mtbf, length) if mtbf else None


class Model:
    """K clients pushing to one fresh server on a virtual clock."""

    def __init__(self, model: str, clients: int, policy: str, seed: int):
        self.k, self.policy = clients, policy
        self.stragglers, self.failures = straggler_model(model, seed, clients)
        self.now, self.version, self.covered = 0.0, 0, 0
        clock = lambda: self.now  # noqa: E731 - the pace's clock is the model's
        words = policy.split()
        lean = float(words[1]) if policy.startswith("lean") else LEAN
        overdue = float(words[words.index("overdue") + 1]) if "overdue" in words else 0.0
        self.pace = SpreadPace(clock) if policy == "spread" else Pace(clock, lean, overdue)
        self.pulled, self.minibatch, self.finish = [0] * clients, [0] * clients, {}
        self.deferred: list[int] = []
        self.events: list[tuple[float, int, bool]] = []  # (when, client (-1: the server wakes), whether back from a failure)
        self.used = self.dropped = self.lost = 0
        self.wake = None  # when the server last set itself to wake

    def fails(self, client: int, minibatch: int) -> bool:
        return self.failures is not None and self.failures.fails(client, minibatch)

    def start(self, client: int) -> None:
        """The client gets the weights and computes its next minibatch (or fails in it)."""
        self.pulled[client] = self.version
        self.pace.replied(client)
        self.minibatch[client] += 1
        n = self.minibatch[client]
        took = self.stragglers.factor(client, n)
        if self.fails(client, n):  # the oracle sees it back and computing again
            back = self.now + took + self.failures.length
            self.finish[client] = back + self.stragglers.factor(client, n + 1)
            heapq.heappush(self.events, (back, client, True))
            return
        self.finish[client] = self.now + took
        heapq.heappush(self.events, (self.now + took, client, False))

    def waits(self, client: int) -> bool:
        computing = [c for c in self.finish if self.pulled[c] == self.version]
        needed = self.k - self.covered
        if self.policy == "wait":
            return True
        if self.policy == "oracle":
            n = self.minibatch[client] + 1
            if self.fails(client, n):
                return True
            due = sorted(self.finish[c] for c in computing)
            return len(due) >= needed and self.now + self.stragglers.factor(client, n) >= due[needed - 1]
        out = self.pace.counted_out([c for c in range(self.k) if c != client and c not in self.deferred])
        needed -= len(out)  # as paramserver/reply/policy.py's `defer`: the step goes without them
        computing = [c for c in computing if c not in out]
        return needed <= 0 or self.pace.waits(client, needed, computing)

    def release(self) -> None:
        """paramserver/reply/policy.py's `release_due`: the step without the clients counted out
        once every other client waits for it; else the server wakes when they all are."""
        running = [c for c in range(self.k) if c not in self.deferred]
        if not self.deferred:
            return
        if len(self.pace.counted_out(running)) == len(running):
            self.step()
        elif (wake := self.pace.wake_at(running)) is not None and wake != self.wake:
            self.wake = wake
            heapq.heappush(self.events, (wake, -1, False))

    def step(self, *also: int) -> None:
        self.version, self.covered = self.version + 1, 0
        for c in [*also, *self.deferred]:
            self.start(c)
        self.deferred.clear()

    def pushed(self, client: int) -> None:
        self.pace.pushed(client)
        if self.pulled[client] != self.version:
            self.dropped += 1
            self.start(client)
            return
        self.used += 1
        self.covered += 1
        if self.covered == self.k:
            self.step(client)
        elif self.waits(client):
            self.deferred.append(client)
        else:
            self.start(client)

    def run(self, steps: int) -> tuple[float, float, float, float]:
        """(time a step, gradients used per base time, dropped share, lost share)."""
        for c in range(self.k):
            self.start(c)
        while self.version < steps:
            self.now, client, back = heapq.heappop(self.events)
            if client < 0:
                self.release()
                continue
            del self.finish[client]
            if back:
                self.lost += 1
                if isinstance(self.pace, SpreadPace):
                    self.pace.failed(client)
                self.start(client)
            else:
                self.pushed(client)
            self.release()
        computed = self.used + self.dropped + self.lost
        return self.now / steps, self.used / self.now, self.dropped / computed, self.lost / computed


def sync_run(model: str, clients: int, seed: int, steps: int, backups: int) -> tuple[float, float, float, float]:
    """Sync SGD under the model, as the simulator's `LockstepClock` times it."""
    stragglers, failures = straggler_model(model, seed, clients)
    fates = LockstepFates(stragglers, failures, backups, list(range(clients)), [1.0] * clients)
    clock = LockstepClock(SimTiming(1.0, 0.0, 1.0, 0.0), None, Lockstep(Mode.SYNC, steps, 1, clients, backups), fates)
    used = lost = computed = 0
    for step in range(1, steps + 1):
        fates = clock.straggle(step, [None if gone else 1.0 for gone in clock.away()])
        used += sum(f.kept for f in fates)
        lost += sum(f.lost for f in fates)
        computed += sum(not f.away for f in fates) + sum(f.lost for f in fates)
    return clock.now / steps, used / clock.now, (computed - used - lost) / computed, lost / computed


POLICIES = ("wait", "oracle", f"lean {LEAN}", f"lean {LEAN} overdue 3", "spread")


def measure(model: str, clients: int, policy: str, seeds: range, steps: int) -> np.ndarray:
    """The seeds' mean of (time a step, gradients used per base time, dropped, lost)."""
    if policy.startswith("sync"):
        runs = [sync_run(model, clients, s, steps, int(policy.endswith("backup"))) for s in seeds]
    else:
        runs = [Model(model, clients, policy, s).run(steps) for s in seeds]
    return np.mean(runs, axis=0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--clients", default="8,16,32")
    args = parser.parse_args(argv)
    print("model            K   policy              time/step  used/time  dropped  lost   (seed means; base minibatch times)")
    for model in args.models.split(","):
        for k in map(int, args.clients.split(",")):
            for policy in ("sync", "sync, 1 backup", *POLICIES):
                t, rate, dropped, lost = measure(model, k, policy, range(args.seeds), args.steps)
                print(f"{model:<17}{k:<4}{policy:<20}{t:>9.3f}{rate:>11.2f}{dropped:>9.3f}{lost:>7.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
