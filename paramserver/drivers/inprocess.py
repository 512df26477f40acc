"""The server in one process: `handle()` and the Recorder, with payloads moved as MPI
moves them. The simulator and the one-process tests hand it each client message.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from paramserver import membership
from paramserver.handler import handle, release
from paramserver.state import ServerState
from paramserver.recorder import Recorder
from paramserver.wire.protocol import Message, Reply, Tag, carries_payload, payload_target


class InProcess:
    """A server's state and recorder, driven one message at a time."""

    def __init__(self, state: ServerState, recorder: Recorder):
        self.state, self.recorder = state, recorder

    def deliver(self, source: int, tag: Tag | int, header: Any, payload: np.ndarray | None = None) -> list[Reply]:
        """Handle one message from `source` and record it; the replies, their payloads
        copied (a reply's payload may be the live weights, which the next push changes)."""
        landed = land(payload, self.state.landing) if carries_payload(tag, header) else None
        return self._recorded(*handle(self.state, Message(source, int(tag), header, landed)))

    def release(self) -> list[Reply]:
        """The step a driver woke for (the reply policy's `wake_at`), if it is still
        due: taken without the clients overdue, recorded; the replies, as `deliver`'s."""
        return self._recorded(*release(self.state, overdue=True))

    def lose(self, rank: int, what: str) -> list[Reply]:
        """Client rank `rank` died (the simulator's `inject_fault` under `continue`): recorded
        as the MPI loop records a lost client, and a step that waited for it taken; the
        replies, as `deliver`'s."""
        self.recorder.membership({"client": self.state.client(rank), "rank": rank, "lost": what, "kind": "ClientDied"})
        membership.lose(self.state, rank, f"ClientDied: {what}")
        return self._recorded(*release(self.state))

    def _recorded(self, replies: list[Reply], events: list) -> list[Reply]:
        self.recorder.record(events)
        return [Reply(r.dest, r.header, r.payload.copy()) for r in replies]


def land(payload: np.ndarray | None, into: np.ndarray) -> np.ndarray:
    """A push's payload as the transport lands it: its bytes copied into `into` when the
    sizes match, else into fresh bytes (`payload_target`)."""
    raw = np.empty(0, np.uint8) if payload is None else np.ascontiguousarray(payload).reshape(-1).view(np.uint8)
    landed = payload_target(raw.nbytes, into)
    landed.view(np.uint8)[:] = raw
    return landed
