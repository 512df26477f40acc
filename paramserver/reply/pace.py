"""Whether a client whose gradient joins a step still being gathered should wait for the
step or compute again (`fresh_reply = "auto"`), from the clients' measured pace.

Rennala SGD (Tyurin & Richtarik 2023) has every worker compute at the current point
until the step, and the server broadcasts the new point the moment it is taken, so a
worker is never idle and never a step behind. A parameter server answers only the client
that asked, so a gathered client has two choices, and each is right in one case:
- `wait` for the step: right when the step comes before the client could finish another
  gradient (equal speeds: every gradient of the round arrives at once, so a second one
  would land a step late and be dropped at R = 0; waiting is then synchronous SGD);
- compute `again` at the same weights: right when a straggler keeps the step open
  longer than the client's own compute time (its second gradient then counts).
`auto` decides per push: from each client's compute time (a moving mean of the time
from the weights sent to its next push, as the server sees it: compute and both
transfers) and when each still-computing client with fresh weights is expected, the
time the gather would complete without this client; the client computes again if it
would push before that (leaning towards computing: `LEAN`), else it waits. Until every
client has been timed once, it waits (so the first round is synchronous). The estimates are the server's own observations,
on the run's clock (wall time over MPI, virtual time in the simulator); they are not
checkpointed: a resumed run waits for one round, then decides as before.

A client the step would wait for that has computed for `overdue` times its mean compute
time since it was sent weights is counted out (`overdue`, a factor: 0 = off): it is more
likely down than late (a failure loses its work and it comes back only with a PULL), so
the step is taken without it (paramserver/reply/policy.py's `release_due`, which each driver
calls at `wake_at`, the time the last client the step waits for falls overdue, when no
message comes before: the MPI loop's timed wait, the simulator's event), and its late
push, if one comes, is stale and dropped at R = 0, answered with the new weights. A factor
of the mean rather than the mean plus a multiple of the spread: the pace keeps no spread,
and a failure keeps a client away for many compute times, so the bound's exact size
matters little against it (docs/rules.md measures 1.5, 2 and 3).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

SMOOTHING = 0.2  # weight of the newest observation in a client's compute time
# A client computes again if LEAN x its compute time would bring its push in before the
# step: leaning towards computing, since a wrong "again" costs one dropped gradient while
# the client already starts the next one, and a wrong "wait" idles it; in the policy
# model (bench/studies/reply_policy.py) 0.7 took 5-10% off the time a step of 8 or
# 32 clients under the study's stragglers takes, against 1.0.
LEAN = 0.7


@dataclass
class Pace:
    clock: Callable[[], float]
    lean: float = LEAN
    overdue: float = 0.0  # the factor of its mean compute time after which a client is counted out (0: never)
    sent: dict[int, float] = field(default_factory=dict)     # rank -> when it was last sent weights
    compute: dict[int, float] = field(default_factory=dict)  # rank -> its mean time from weights to push

    def replied(self, rank: int) -> None:
        self.sent[rank] = self.clock()

    def pushed(self, rank: int) -> None:
        if rank not in self.sent:
            return
        took = self.clock() - self.sent[rank]
        known = self.compute.get(rank)
        self.compute[rank] = took if known is None else (1 - SMOOTHING) * known + SMOOTHING * took

    def waits(self, rank: int, needed: int, computing: list[int]) -> bool:
        """Whether `rank` should wait for the step that `needed` more pushes complete,
        `computing` the other clients whose next push would count for it."""
        if rank not in self.compute or any(r not in self.compute for r in computing):
            return True
        if needed > len(computing):
            return False  # they cannot complete it: this client must help
        now = self.clock()
        due = sorted(max(now, self.sent[r] + self.compute[r]) for r in computing)[needed - 1]
        return now + self.lean * self.compute[rank] >= due

    def deadline(self, rank: int) -> float | None:
        """When `rank`, computing since it was last sent weights, falls overdue (None: never,
        or not timed yet)."""
        if not self.overdue or rank not in self.compute or rank not in self.sent:
            return None
        return self.sent[rank] + self.overdue * self.compute[rank]

    def counted_out(self, ranks: list[int]) -> list[int]:
        """Those of `ranks` (clients still computing) that are overdue now."""
        now = self.clock()
        return [r for r in ranks if (d := self.deadline(r)) is not None and now >= d]

    def wake_at(self, ranks: list[int]) -> float | None:
        """When every one of `ranks` (the clients a gathered step waits for) is overdue, so
        the step goes without them if none pushes before (None: one never falls overdue)."""
        deadlines = [self.deadline(r) for r in ranks]
        return None if not ranks or None in deadlines else max(deadlines)
