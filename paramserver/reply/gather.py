"""Who a step being gathered waits for, and when it is taken short (`fresh`): the server's
decisions about a gathered step that `handle()` (paramserver/handler.py) and both drivers
(the MPI loop's timed wait, the simulator's wake-up event) share.

A gathered push's sender waits for the step as the rule says, or by the clients' pace
(paramserver/reply/pace.py). The step is taken with what was gathered (`release_due`, then the
handler's `release`) once every client still running waits for it or is overdue: one
computing for longer than the pace's bound is counted out, as a lost client is, and the
step no longer needs its push; `wake_at` tells a driver when that comes about if no
message comes first.
"""
from __future__ import annotations

from typing import Protocol

from paramserver.reply.pace import Pace
from paramserver.store import Store


class ServerState(Protocol):
    """What these decisions read of paramserver/handler.py's `ServerState` (which imports them)."""

    store: Store
    pace: Pace | None
    deferred: list[int]  # client ranks whose replies wait for a step
    waiting: list[int]   # client ranks still running

    def client(self, rank: int) -> int: ...


def waits(state: ServerState, rank: int) -> bool:
    """Whether the sender of a gathered push waits for the step: as the rule says, or by
    the clients' pace (the other clients still computing at weights the step would take)."""
    rule, store = state.store.rule, state.store
    if state.pace is None:
        return rule.defers
    out = _counted_out(state, rank)
    computing = [r for r in state.waiting if r != rank and r not in state.deferred and r not in out
                 and not rule.drops(store.version - store.pulled.get(state.client(r), 0))]
    needed = -(-rule.remaining // rule.minibatches) - len(out)  # the step goes without those counted out
    return needed <= 0 or state.pace.waits(rank, needed, computing)


def _counted_out(state: ServerState, rank: int | None = None) -> list[int]:
    """The clients still computing (but `rank`, whose push is being handled) that the pace
    counts out as overdue (paramserver/reply/pace.py)."""
    if state.pace is None:
        return []
    return state.pace.counted_out([r for r in state.waiting if r not in state.deferred and r != rank])


def release_due(state: ServerState, overdue: bool = False) -> bool:
    """Whether every client still running waits for a step being gathered (or, with
    `overdue`, is overdue): then no push will complete it, and `release` takes it (a
    driver finishes replies in flight first: the step changes the weights they may be
    reading). Overdue clients count only when a driver woke for them (`wake_at`), idle
    and with no message waiting: while messages queue at a busy server, an overdue
    client's push may be among them (measured: a server-bound simulation dropped one)."""
    out = _counted_out(state) if overdue else []
    return bool(state.deferred) and all(rank in state.deferred or rank in out for rank in state.waiting)


def wake_at(state: ServerState) -> float | None:
    """When `release_due` comes true if no message comes first (None: only a message can
    make it so): a driver acts then, with the clients it waits for overdue."""
    if state.pace is None or not state.deferred:
        return None
    return state.pace.wake_at([r for r in state.waiting if r not in state.deferred])
