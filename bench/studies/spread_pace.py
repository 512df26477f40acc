"""`SpreadPace`: the reply by pace (paramserver/reply/pace.py) derived from each client's
measured mean and spread instead of the constant `LEAN`; measured against it in the
policy model (bench/studies/reply_policy.py, docs/rules.md). Not the default: under
the scaling study's stragglers at 32 clients it took 0.2% longer a step than LEAN 0.7.

The decision (`computes_again`). Let D be the time until the step would be complete
without this client and X its next compute time. Waiting idles it for D and then starts
its next gradient at the new weights. Computing again, if X < D, adds a gradient to
the step: one of its gradients, worth its mean compute time m of its work; if X > D,
the gradient is dropped and the client starts at the new weights X - D later than if it
had waited: that lateness is the loss (its time until D was idle either way). So it
computes again iff  m P(X < D) > E[(X - D)+].  With no spread this is X < D; a spread
moves the threshold below the mean, since a late gradient costs only its lateness while
an early one earns a whole gradient (lognormal sigma 0.5: D > 0.72 m, near the 0.7 that
paramserver/reply/pace.py's LEAN took from the policy model under that one draw). X is taken lognormal with
the client's measured mean and spread (the moment fit: positive, skewed, a product of
many slowdowns; no spread gives a fixed time). D is the time until the pushes the step
still needs come from the other clients computing at fresh weights, each expected at its
mean time given that it has not pushed yet (an overdue client is expected soon, by its
spread). The gain counts only this client's work; that its gradient can also bring the
step, and every waiting client's next gradient, forward is left out, which errs towards
waiting, the choice that can never drop a gradient.

Failures: a client computing at fresh weights that has not pushed is counted out if it
has more likely failed than not: the chance that a minibatch fails (the failures seen,
each a client's return after one, per time computed) against the chance, by its
measured times, that it is still computing.
"""
from __future__ import annotations

import math

from paramserver.reply.pace import SMOOTHING, Pace


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


class SpreadPace(Pace):
    """`Pace` with each client's exponentially weighted variance beside its mean (West's
    update, the same weight), deciding by `computes_again`, the failures seen counted."""

    def __init__(self, clock):
        super().__init__(clock)
        self.var: dict[int, float] = {}
        self.failures = 0       # clients back from a failure (`failed`)
        self.exposure = 0.0     # the compute times measured, summed: the time failures could strike in

    def pushed(self, rank: int) -> None:
        known = self.compute.get(rank)
        if rank not in self.sent:
            return
        took = self.clock() - self.sent[rank]
        self.exposure += took
        super().pushed(rank)
        diff = 0.0 if known is None else took - known
        self.var[rank] = 0.0 if known is None else (1 - SMOOTHING) * (self.var[rank] + SMOOTHING * diff * diff)

    def failed(self, rank: int) -> None:
        """`rank` is back from a failure: a pull after it lost its work (before `replied`)."""
        self.failures += 1

    def down(self, rank: int, now: float) -> bool:
        """Whether a client computing at fresh weights that has not pushed yet has more
        likely failed than not."""
        if not self.failures:
            return False
        mean = self.compute[rank]
        fails = -math.expm1(-self.failures / self.exposure * mean) if self.exposure else 1.0
        return fails > (1 - fails) * survival(mean, self.var[rank], now - self.sent[rank])

    def due(self, rank: int, now: float) -> float:
        """When a client computing at fresh weights is expected to push."""
        start = self.sent[rank]
        return start + expected_time(self.compute[rank], self.var[rank], now - start)

    def waits(self, rank: int, needed: int, computing: list[int]) -> bool:
        if rank not in self.compute or any(r not in self.compute for r in computing):
            return True
        now = self.clock()
        computing = [r for r in computing if not self.down(r, now)]
        if needed > len(computing):
            return False  # they cannot complete it: this client must help
        due = sorted(self.due(r, now) for r in computing)[needed - 1]
        return not computes_again(self.compute[rank], self.var[rank], due - now)
