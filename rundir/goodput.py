"""Goodput: the share of the minibatches a run computed that entered a step, from its
clients.jsonl, so a resumed run counts the whole run.

A minibatch enters a step when the push that carried it was applied (async: every row
of the window up to its sync point, the row with `version_pulled`; a window whose push
was dropped or rejected, or that a failure lost, did not), or when the lockstep step
averaged it (sync and local-sgd: every row but those a backup worker dropped and those
a failure lost, in local-sgd its client's round before it too). Lost rows say `lost`;
a failure's last lost row says `failed`.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable


def goodput(rows: Iterable[dict[str, Any]], windows: bool) -> dict[str, Any]:
    """Counted from the clients log's `rows`; `windows`: async rows, a push's closed by its
    sync point (else each row is a step's own)."""
    computed = entered = lost = failures = 0
    pending: dict[int, int] = defaultdict(int)  # a client's rows since its last sync point
    for row in rows:
        computed += 1
        failures += bool(row.get("failed"))
        if row.get("lost"):
            lost += 1
            continue
        pending[row["client"]] += 1
        if windows and "version_pulled" not in row:
            continue
        if not (row.get("dropped") or "rejected" in row):
            entered += pending[row["client"]]
        pending[row["client"]] = 0
    return {"minibatches_in_steps": entered, "minibatches_lost": lost, "failures": failures,
            "goodput": entered / computed if computed else None}
