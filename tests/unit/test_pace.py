"""fresh_reply = "auto": who waits for the step, from the clients' pace, by hand."""
from __future__ import annotations

import pytest

from paramserver.reply.pace import LEAN, SMOOTHING, Pace


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def timed(compute: dict[int, float], make=Pace) -> tuple[Pace, Clock]:
    """Every client sent weights at 0 and pushed after its compute time, then sent
    weights again at 10: each client's pace is its compute time (`make`: the pace's
    class, also the bench's SpreadPace)."""
    clock = Clock()
    pace = make(clock)
    for rank in compute:
        pace.replied(rank)
    for rank, took in sorted(compute.items(), key=lambda kv: kv[1]):
        clock.now = took
        pace.pushed(rank)
    clock.now = 10.0
    for rank in compute:
        pace.replied(rank)
    return pace, clock


def test_the_pace_is_a_moving_mean_of_weights_to_push():
    pace, clock = timed({1: 1.0})
    clock.now = 13.0
    pace.pushed(1)
    assert pace.compute[1] == pytest.approx((1 - SMOOTHING) * 1.0 + SMOOTHING * 3.0)


def test_equal_speeds_wait_as_sync_does():
    pace, clock = timed({1: 1.0, 2: 1.0, 3: 1.0})
    clock.now = 11.0  # client 1 pushed; 2 and 3 are due now, long before its next push at 12
    assert pace.waits(1, 2, [2, 3])


def test_a_straggler_keeps_the_step_open_so_a_fast_client_computes_again():
    pace, clock = timed({1: 1.0, 2: 1.0, 3: 4.0})
    clock.now = 11.0  # 2 is due at 11, the straggler 3 at 14: client 1 would push again at 12
    assert not pace.waits(1, 2, [2, 3])
    assert pace.waits(1, 1, [2, 3])  # one more push completes it: 2's, due now


def test_an_overdue_client_counts_as_due_now():
    pace, clock = timed({1: 1.0, 2: 0.5})
    clock.now = 11.0  # client 2 was due at 10.5
    assert pace.waits(1, 1, [2])


def test_unknown_pace_waits_and_too_few_computing_compute_again():
    pace, clock = timed({1: 1.0, 2: 1.0})
    assert pace.waits(1, 1, [2, 5])  # client 5 has not been timed yet: the first round is sync
    assert not pace.waits(1, 2, [2])  # one other client cannot bring two pushes in time


def test_it_leans_towards_computing_again():
    """The step is due 0.8 after the push and the client takes 1.0: at LEAN x 1.0 = 0.7 it
    counts as in time, and computes again."""
    pace, clock = timed({1: 1.0, 2: 1.8})
    clock.now = 11.0
    assert LEAN < 0.8 and not pace.waits(1, 1, [2])


def test_a_client_computing_past_overdue_times_its_mean_is_counted_out():
    """Sent weights at 10; client 1 takes 1.0 a push, client 2 0.5: at overdue 2 they fall
    overdue at 12 and 11; an untimed client never does, nor any with overdue 0."""
    pace, clock = timed({1: 1.0, 2: 0.5})
    pace.overdue = 2.0
    pace.replied(3)
    assert (pace.deadline(1), pace.deadline(2), pace.deadline(3)) == (12.0, 11.0, None)
    clock.now = 11.5
    assert pace.counted_out([1, 2, 3]) == [2]
    assert pace.wake_at([1, 2]) == 12.0 and pace.wake_at([1, 2, 3]) is None and pace.wake_at([]) is None
    clock.now = 12.0
    assert pace.counted_out([1, 2]) == [1, 2]
    pace.overdue = 0.0
    assert pace.counted_out([1, 2]) == [] and pace.wake_at([1, 2]) is None
