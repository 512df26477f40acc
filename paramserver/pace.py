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

The decision (`computes_again`). Let D be the time until the step would be complete
without this client and X its next compute time. Waiting idles it for D and then starts
its next gradient at the new weights. Computing again, if X < D, adds a gradient to
the step: one of its gradients, worth its mean compute time m of its work; if X > D,
the gradient is dropped and the client starts at the new weights X - D later than if it
had waited: that lateness is the loss (its time until D was idle either way). So it
computes again iff  m P(X < D) > E[(X - D)+].  With no spread this is X < D; a spread
moves the threshold below the mean, since a late gradient costs only its lateness while
an early one earns a whole gradient (lognormal sigma 0.5: D > 0.7 m, the constant the
earlier rule took from the policy model under that one draw). X is taken lognormal with
the client's measured mean and spread (the moment fit: positive, skewed, a product of
many slowdowns; no spread gives a fixed time). D is the time until the pushes the step
still needs come from the other clients computing at fresh weights, each expected at its
mean time given that it has not pushed yet (an overdue client is expected soon, by its
spread). The gain counts only this client's work; that its gradient can also bring the
step, and every waiting client's next gradient, forward is left out, which errs towards
waiting, the choice that can never drop a gradient.

Each client's time is from the weights sent to its next push, as the server sees it
(compute and both transfers), an exponentially weighted mean and variance (weight 0.2 on
the newest). Until every client has been timed once, it waits (so the first round is
synchronous). The estimates are the server's own observations, on the run's clock (wall
time over MPI, virtual time in the simulator); they are not checkpointed: a resumed run
waits for one round, then decides as before.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

SMOOTHING = 0.2  # weight of the newest observation in a client's mean and variance


def normal_cdf(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def lognormal(mean: float, var: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal with this mean and variance."""
    sigma2 = math.log1p(var / (mean * mean))
    return math.log(mean) - sigma2 / 2, math.sqrt(sigma2)


def computes_again(mean: float, var: float, gap: float) -> bool:
    """Whether a client of this mean and variance of compute time should compute again
    when the step is `gap` away: its mean times its chance to be in time against its
    expected lateness (the module's doc)."""
    if gap <= 0:
        return False
    if var <= 0:
        return mean < gap
    mu, sigma = lognormal(mean, var)
    d2 = (mu - math.log(gap)) / sigma  # P(X > gap) = Phi(d2)
    late = mean * normal_cdf(d2 + sigma) - gap * normal_cdf(d2)
    return mean * normal_cdf(-d2) > late


def survival(mean: float, var: float, elapsed: float) -> float:
    """P(X > elapsed) for a client of this mean and variance (no spread: a fixed time,
    with a relative tolerance for the rounding of its measured mean)."""
    if var <= 0:
        return 1.0 if elapsed <= mean * (1 + 1e-9) else 0.0
    mu, sigma = lognormal(mean, var)
    return normal_cdf((mu - math.log(elapsed)) / sigma) if elapsed > 0 else 1.0


def expected_time(mean: float, var: float, elapsed: float) -> float:
    """E[X | X > elapsed]: when a client that has computed for `elapsed` is expected to
    push, from its start; with no spread, its mean, or `elapsed` once overdue."""
    if var <= 0 or elapsed <= 0:
        return max(mean, elapsed)
    mu, sigma = lognormal(mean, var)
    d2 = (mu - math.log(elapsed)) / sigma
    survive = normal_cdf(d2)
    if survive < 1e-300:  # far past the whole distribution: any moment now
        return elapsed
    return max(elapsed, mean * normal_cdf(d2 + sigma) / survive)


@dataclass
class Pace:
    clock: Callable[[], float]
    sent: dict[int, float] = field(default_factory=dict)     # rank -> when it was last sent weights
    compute: dict[int, float] = field(default_factory=dict)  # rank -> its mean time from weights to push
    var: dict[int, float] = field(default_factory=dict)      # rank -> that time's variance
    failures: int = 0       # clients back from a failure (`failed`)
    exposure: float = 0.0   # the compute times measured, summed: the time failures could strike in

    def replied(self, rank: int) -> None:
        self.sent[rank] = self.clock()

    def pushed(self, rank: int) -> None:
        if rank not in self.sent:
            return
        took = self.clock() - self.sent[rank]
        self.exposure += took
        known = self.compute.get(rank)
        if known is None:
            self.compute[rank], self.var[rank] = took, 0.0
            return
        diff = took - known  # West's exponentially weighted mean and variance
        self.compute[rank] = known + SMOOTHING * diff
        self.var[rank] = (1 - SMOOTHING) * (self.var[rank] + SMOOTHING * diff * diff)

    def failed(self, rank: int) -> None:
        """`rank` is back from a failure: a pull after it lost its work (before `replied`)."""
        self.failures += 1

    def down(self, rank: int, now: float) -> bool:
        """Whether a client computing at fresh weights that has not pushed yet has more
        likely failed than not: the chance that a minibatch fails (at the failures measured
        per time computed) against its chance to be still computing by now."""
        if not self.failures:
            return False
        mean = self.compute[rank]
        fails = -math.expm1(-self.failures / self.exposure * mean) if self.exposure else 1.0
        return fails > (1 - fails) * survival(mean, self.var[rank], now - self.sent[rank])

    def due(self, rank: int, now: float) -> float:
        """When a client computing at fresh weights is expected to push."""
        start = self.sent[rank]
        return start + expected_time(self.compute[rank], self.var[rank], now - start)

    def again(self, rank: int, gap: float) -> bool:
        return computes_again(self.compute[rank], self.var[rank], gap)

    def waits(self, rank: int, needed: int, computing: list[int]) -> bool:
        """Whether `rank` should wait for the step that `needed` more pushes complete,
        `computing` the other clients whose next push would count for it."""
        if rank not in self.compute or any(r not in self.compute for r in computing):
            return True
        now = self.clock()
        computing = [r for r in computing if not self.down(r, now)]
        if needed > len(computing):
            return False  # they cannot complete it: this client must help
        due = sorted(self.due(r, now) for r in computing)[needed - 1]
        return not self.again(rank, due - now)
