"""The words a run's summary (and a sweep's index) use for how a run ended, in one place.

A status is one of these words, with the reason after a colon where there is one
(`diverged: ...`, `failed: ...`). Code that asks how a run ended asks here, never by
matching a message's text.
"""
from __future__ import annotations

COMPLETE = "complete"
DIVERGED = "diverged"      # most pushes refused, or no finite loss at the end
UNTRAINED = "untrained"    # the final test error cannot be told from chance
FAILED = "failed"
INTERRUPTED = "interrupted"  # Ctrl-C or SIGTERM: `failed: interrupted` in a run's summary
FINISHED = (COMPLETE, DIVERGED, UNTRAINED)  # ran to its end: nothing to resume or retry
# a sweep's points, besides a run's own status:
PENDING, RUNNING, LOCKED = "pending", "running", "locked"


EXIT_DIVERGED = 3  # `asgd train`'s exit status for a run that diverged (0 complete, 1 failed, 2 bad input)


def exit_status(status: str | None) -> int:
    """The exit status of a run that ran to its end with this status: non-zero where it
    diverged, so a script does not take it for a result (`untrained`, a short run's
    ending as often as a failed one's, exits 0; its final line says it)."""
    return EXIT_DIVERGED if status is not None and word(status) == DIVERGED else 0


def finished(status: str | None) -> bool:
    """Whether a run with this status ran to its end: nothing to resume or retry."""
    return status is not None and word(status) in FINISHED


def word(status: str) -> str:
    """The status without its reason."""
    return status.split(":")[0]


def reached_target(point: dict, stop) -> str:
    """A run a stop rule ended early (`stop`: rundir/measure.py's `Stop`, of
    stop_at_error, stop_at_loss or stop_at_metric): complete, at the curve's point that reached it."""
    return f"{COMPLETE}: reached target ({stop.describe(point)} at version {point['version']})"


def failed(reason: str) -> str:
    return f"{FAILED}: {reason}"


def was_interrupted(status: str | None) -> bool:
    return (status or "").startswith(failed(INTERRUPTED))
