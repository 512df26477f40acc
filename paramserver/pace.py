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
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

SMOOTHING = 0.2  # weight of the newest observation in a client's compute time
# A client computes again if LEAN x its compute time would bring its push in before the
# step: leaning towards computing, since a wrong "again" costs one dropped gradient while
# the client already starts the next one, and a wrong "wait" idles it; in the policy
# model (experiments/bench/reply_policy.py) 0.7 took 5-10% off the time a step of 8 or
# 32 clients under the study's stragglers takes, against 1.0.
LEAN = 0.7


@dataclass
class Pace:
    clock: Callable[[], float]
    lean: float = LEAN
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
