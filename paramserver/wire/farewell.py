"""The end of a run on the wire: FAIL from a failing rank, BYE from server 0 once the run is recorded.

A failing client tells the recorders (the servers; rank 0 in the sync modes) why, and
gives them a moment to record it before the job ends. A rank that finished stays until
server 0 says BYE, the run recorded (an evaluation may take minutes): had it ended
first while a client was lost, MPICH's launcher would end every rank, the server
included. BYE counts the lost clients (and dead spare ranks); with any lost, every rank leaves without
MPI_Finalize, which would wait for the dead forever (the caller's to do).
"""
from __future__ import annotations

import math
import time

from paramserver.wire.liveness import PeerDied
from paramserver.wire.protocol import Bye, Fail, Link, PeerTimeout, Tag

FAIL_GRACE_S = 5.0  # a failed client waits this long for the server to record why


def tell_recorders(link: Link, rank: int, servers: int, reason: str, wait: bool) -> None:
    """FAIL to the servers (sync modes: rank 0), then wait `FAIL_GRACE_S` for them to end
    the job, or (`wait` false: they go on without us) just until the message is out."""
    recorders = [r for r in (range(servers) if servers else [0]) if r != rank]
    posted = [link.post(r, Tag.FAIL, Fail(reason)) for r in recorders]
    deadline = time.monotonic() + FAIL_GRACE_S
    while time.monotonic() < deadline and (not all(link.done(p) for p in posted) or wait):
        time.sleep(0.05)


def say_bye(link: Link, ranks: list[int], gone: set[int]) -> bool:
    """BYE to each of `ranks` (every rank but server 0: spares never admitted and joiners
    too) not `gone` (lost clients, dead spares); whether any were gone."""
    for rank in ranks:
        if rank not in gone:
            try:
                link.send(rank, Tag.BYE, Bye(len(gone)), timeout=10)
            except (PeerDied, PeerTimeout):  # it died since (a joiner's stream closed): the others still get theirs
                pass
    return bool(gone)


def wait_for_bye(link: Link) -> bool:
    """Wait for server 0's BYE; whether clients were lost."""
    return bool(link.recv(math.inf, source=0, tag=Tag.BYE).header.lost)
