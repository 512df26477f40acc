"""The run's summary (`summary.json`), written here alone: last, on failure too, atomically.

So a run directory always says whether its results are complete: the recording rank
writes the result, or the failure that ended training; the supervisor of an MPI job
that ended before any rank could say so marks it failed. Its status words are
rundir/status.py's.
"""
from __future__ import annotations

import math
import time
import traceback
from pathlib import Path
from typing import Any

from rundir import status as words
from rundir.durable import write_json_atomic
from rundir.layout import RunDir

SUMMARY = "summary.json"
# The clock of `time_s` and the throughput: the simulator's seconds are virtual. A summary
# written before the field was kept is an MPI run's or a simulated one's: read as wall.
WALL, VIRTUAL = "wall", "virtual"


def clock_of(summary: dict[str, Any]) -> str:
    return summary.get("clock", WALL)


def seconds(time_s: float, clock: str) -> str:
    """A run's time for a person to read, saying when its seconds are not real ones."""
    return f"{time_s:.1f} s" + (" (virtual)" if clock == VIRTUAL else "")


def write_result(run: RunDir, status: str, final: dict[str, Any], train_s: float, clock: str,
                 counts: dict[str, Any], **measured: Any) -> dict[str, Any]:
    """The summary of a run that trained to its end; returns it."""
    error = final.get("test_error")  # NaN where the outputs do not classify: null in the JSON, as "none"
    error = error if isinstance(error, float) and math.isfinite(error) else None
    summary = {"status": status, "final_test_error": error,
               "final_test_loss": final.get("test_loss"), "final_test_samples": final.get("samples"),
               **measured, **_timing(train_s, clock, counts), **counts}
    write_json_atomic(run.path / SUMMARY, summary)
    return summary


def write_failure(run: RunDir, train_s: float, clock: str, counts: dict[str, Any], error: BaseException) -> None:
    """The summary of a run `error` ended: what it had counted so far."""
    write_json_atomic(run.path / SUMMARY, {"status": failure_status(error), "final_test_error": None,
                                           **_timing(train_s, clock, counts), **counts})


def mark_failed(run: RunDir, reason: str | None) -> None:
    """The job ended before the run could say so (the supervisor's): `reason`, or
    interrupted; a status the run wrote stays, unless the job was interrupted and the run
    did not say so (rank 0's own word names the signal)."""
    status = run.status()
    kept = status and (reason is not None or words.was_interrupted(status))
    recorded = status if kept else words.failed(reason or words.INTERRUPTED)
    try:
        summary = run.summary()
    except ValueError:  # a damaged one is replaced
        summary = {"final_test_error": None}
    write_json_atomic(run.path / SUMMARY, {**summary, "status": recorded})


def discard(run: RunDir) -> None:
    """A resumed run is not complete until it says so again."""
    (run.path / SUMMARY).unlink(missing_ok=True)


def training_status(counts: dict[str, Any], final: dict[str, Any], classes: int | None) -> str:
    """`complete`, unless the run did not train: `diverged` when most pushes were refused
    (not finite, or malformed) or the final weights give no finite loss, `untrained` when
    a classifier's final test error cannot be told from chance (within two standard
    errors of guessing, on the samples evaluated)."""
    if mostly_rejected(counts):
        return f"{words.DIVERGED}: {rejections(counts)}"
    if not final:
        return words.COMPLETE
    if not math.isfinite(final["test_loss"]):
        return f"{words.DIVERGED}: the final weights give a test loss of {final['test_loss']}"
    if not classes or not math.isfinite(final["test_error"]):  # not a classifier (a user's loss)
        return words.COMPLETE
    chance = 1 - 1 / classes
    margin = 2 * math.sqrt(chance * (1 - chance) / final["samples"])
    if final["test_error"] >= chance - margin:
        return (f"{words.UNTRAINED}: final test error {final['test_error']:.3f} is chance level ({chance:.3f} for "
                f"{classes} classes, within {margin:.3f} on {final['samples']} test samples)")
    return words.COMPLETE


def mostly_rejected(counts: dict[str, Any]) -> bool:
    applied = counts.get("pushes_applied")
    return applied is not None and counts.get("pushes_rejected", 0) > applied


def rejections(counts: dict[str, Any]) -> str:
    """The pushes the server rejected, in words ('' for none)."""
    rejected, applied = counts.get("pushes_rejected", 0), counts.get("pushes_applied") or 0
    return f"{rejected} of {rejected + applied} pushes rejected (not finite or malformed)" if rejected else ""


def ending(status: str, counts: dict[str, Any]) -> str:
    """What the run's last console line adds to its numbers: the status unless complete,
    and the pushes rejected where the status does not count them ('' for neither)."""
    said = [] if status == words.COMPLETE else [status]
    if rejections(counts) and not mostly_rejected(counts):
        said.append(rejections(counts))
    return "".join(f"; {part}" for part in said)


def failure_status(error: BaseException) -> str:
    if isinstance(error, KeyboardInterrupt):  # Ctrl-C, or SIGTERM (cli.Interrupted)
        return words.failed(f"{words.INTERRUPTED}{f' ({error})' if str(error) else ''}")
    return words.failed(f"{type(error).__name__}: {error}")


def log_traceback(out: str, error: BaseException, who: str) -> str:
    """Append `error`'s traceback to the run directory's error.log (where that directory
    is reachable); where it went, for the one line that names the failure."""
    path = Path(out) / "error.log"
    text = "".join(traceback.format_exception(error))
    try:
        with open(path, "a", encoding="utf-8") as log:
            log.write(f"--- {who}, {time.strftime('%F %T')}\n{text}")
    except OSError:
        return "the traceback could not be saved: rerun with --debug"
    return f"traceback in {path}"


def _timing(train_s: float, clock: str, counts: dict[str, Any]) -> dict[str, Any]:
    samples = counts.get("samples", 0)
    return {"time_s": train_s, "throughput_samples_per_s": samples / train_s if train_s > 0 else None,
            "clock": clock}
