"""The reply by each client's mean and spread (bench/studies/spread_pace.py), by hand."""
from __future__ import annotations

import math

import pytest

from bench.studies.spread_pace import SpreadPace, computes_again, expected_time
from paramserver.reply.pace import SMOOTHING
from tests.unit.test_pace import Clock, timed as timed_by


def timed(compute: dict[int, float]) -> tuple[SpreadPace, Clock]:
    return timed_by(compute, SpreadPace)


def test_a_fixed_time_computes_again_only_if_it_is_in_time():
    """No spread: the step is due 0.8 after the push and the client takes 1.0, so its
    gradient would be late: it waits (LEAN 0.7 computes again here)."""
    pace, clock = timed({1: 1.0, 2: 1.8})
    clock.now = 11.0
    assert pace.var[1] == 0.0 and pace.waits(1, 1, [2])
    assert computes_again(1.0, 0.0, 1.01) and not computes_again(1.0, 0.0, 1.0)


def test_the_pace_keeps_a_moving_variance():
    pace, clock = timed({1: 1.0})
    clock.now = 13.0
    pace.pushed(1)  # 3.0 after 1.0: West's update, diff 2
    assert pace.var[1] == pytest.approx((1 - SMOOTHING) * SMOOTHING * 2.0 ** 2)


def lognormal_moments(sigma: float) -> tuple[float, float]:
    """Mean and variance of exp(sigma z), median 1."""
    mean = math.exp(sigma * sigma / 2)
    return mean, (math.exp(sigma * sigma) - 1) * mean * mean


def test_a_spread_leans_towards_computing_again():
    """Lognormal sigma 0.5 (median 1, mean 1.133), the step due 0.85 away, under the
    mean: in time with chance Phi(-d2) = 0.373 (mu = 0, d2 = -ln 0.85 / 0.5 = 0.325), a
    gain of 1.133 x 0.373 = 0.422 against the expected lateness 1.133 Phi(d2 + 0.5) - 0.85
    Phi(d2) = 0.368: it computes again. At 0.75: 0.32 against 0.435, it waits. A fixed
    time of the same mean waits at both."""
    mean, var = lognormal_moments(0.5)
    assert computes_again(mean, var, 0.85) and not computes_again(mean, var, 0.75)
    assert not computes_again(mean, 0.0, 0.85)
    assert not computes_again(mean, var, 0.0)  # the step is due now


def test_a_wider_spread_computes_again_earlier():
    """The threshold falls from the mean as the spread grows: about 0.72 of it at sigma
    0.5, 0.64 at sigma 1."""
    wide, narrow = lognormal_moments(1.0), lognormal_moments(0.5)
    assert computes_again(*wide, 0.68 * wide[0]) and not computes_again(*narrow, 0.68 * narrow[0])
    assert not computes_again(*wide, 0.6 * wide[0])


def test_an_overdue_client_with_a_spread_is_expected_soon_not_now():
    mean, var = lognormal_moments(0.5)
    assert expected_time(mean, var, 0.0) == pytest.approx(mean)
    assert 3.0 < expected_time(mean, var, 3.0) < 4.0  # by hand: 1.133 Phi(-1.697) / Phi(-2.197) = 3.62
    assert expected_time(mean, 0.0, 3.0) == 3.0       # a fixed time: due now


def test_a_client_overdue_after_failures_were_seen_counts_as_down():
    """Clients 1 and 2 take 1.0, 3 takes 4.0, no spread. Client 1 pushes at 11.5 with one
    push needed: 2 is overdue (due at 11). Before any failure it is due now, so 1 waits;
    once a failure has been seen, a client late past a fixed time has failed, and 1 must
    compute again, as 3 could not bring the push before 14."""
    pace, clock = timed({1: 1.0, 2: 1.0, 3: 4.0})
    clock.now = 11.5
    assert pace.waits(1, 1, [2])
    pace.failed(3)
    assert pace.down(2, clock.now) and not pace.down(3, clock.now)
    assert not pace.waits(1, 1, [2])
    assert not pace.waits(1, 1, [2, 3])  # 3, within its time, is due at 14: 1 would push at 12.5


def test_a_client_within_its_spread_is_late_not_down():
    """With a spread, an overdue client is down only if a failure is more likely than a
    time that long: rarely failing clients (1 in 1000 a minibatch) are late first."""
    pace, clock = timed({1: 1.0, 2: 1.0})
    pace.var[2] = lognormal_moments(0.5)[1]
    pace.exposure, pace.failures = 1000.0, 1
    clock.now = 11.5  # 1.5 into a time of median about 1: likely (0.2) still computing
    assert not pace.down(2, clock.now)
    clock.now = 20.0  # 10x its time: a lognormal sigma 0.5 almost never takes that long
    assert pace.down(2, clock.now)
