"""The processes below one: found by walking /proc, and ended, every one, nothing else.

MPICH's launcher gives each rank a session of its own, so a process group would miss
them: the supervisor, the lifeline and the tests find a job's processes by their
parents instead.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def descendants(pid: int) -> list[int]:
    """Every process below `pid`. MPICH's launcher gives each rank a session of its own, so
    killing the process group would miss the ranks; walking the tree does not."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


GONE_S = 10.0  # how long kill_tree waits for its victims to be gone
STOPPED_S = 1.0  # how long it waits for each round of them to be stopped


def kill_tree(pid: int) -> None:
    """SIGKILL a process and everything below it, nothing else, and return once they are
    gone (or GONE_S passed). Each is stopped first, and seen stopped, until a listing
    finds none new, so none can start another between the listing and the kill (a sweep
    starts its next point as one ends): SIGSTOP takes effect only when its process
    leaves the kernel, so a fork under way when it was sent ends after it, with a child
    the listing must see (once a sweep's point, forked so and orphaned by the kill before
    it armed its parent-death signal, trained on: tests/sim/test_sweep.py). The wait
    means what they held (a run directory's lock) is free when this returns."""
    victims: list[int] = []
    new = [pid]
    while new:
        for victim in new:
            _signal(victim, signal.SIGSTOP)
        victims += new
        _wait_stopped(new)
        new = [p for p in descendants(pid) if p not in victims]
    for victim in victims:
        _signal(victim, signal.SIGKILL)
    deadline = time.monotonic() + GONE_S
    while any(alive(victim) for victim in victims) and time.monotonic() < deadline:
        time.sleep(0.01)


def _wait_stopped(pids: list[int]) -> None:
    """Until each of `pids` is stopped or gone, or STOPPED_S passed (one in an
    uninterruptible wait stops only when it leaves it)."""
    deadline = time.monotonic() + STOPPED_S
    while any(_state(p) not in ("T", "t", "Z", "X", "") for p in pids) and time.monotonic() < deadline:
        time.sleep(0.001)


def _state(pid: int) -> str:
    """Its state letter in /proc (R running, S sleeping, T stopped, Z zombie...); "" if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _signal(pid: int, number: signal.Signals) -> None:
    try:
        os.kill(pid, number)
    except ProcessLookupError:
        pass


def alive(pid: int) -> bool:
    """Running, or dying: not yet a zombie (whose files, locks included, are closed)."""
    return _state(pid) not in ("Z", "X", "")
