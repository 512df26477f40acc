"""An in-process link from one client to the real server handler, for tests without MPI.

The client's `send` runs `paramserver.server.handle` at once; the server's replies
queue up until the client receives them. Both ends copy payloads, as MPI would.
"""
from __future__ import annotations

from collections import deque

import numpy as np

from paramserver.server import Serving, handle
from paramserver.transport import Message


class _ServerEnd:
    def __init__(self, link: "Loopback"):
        self.link = link

    def recv_payload(self, source: int, into: np.ndarray, timeout: float) -> np.ndarray:
        payload = self.link.pending_push
        if payload.nbytes != into.nbytes:
            return payload.view(np.uint8).copy()
        into[:] = payload.view(into.dtype)
        return into

    def send(self, dest: int, tag: int, header, payload=None) -> None:
        self.link.replies.append((header, None if payload is None else payload.copy()))


class Loopback:
    """Client end; `serving` is built with `server_end` as its transport."""

    rank = 1

    def __init__(self):
        self.server_end = _ServerEnd(self)
        self.replies: deque = deque()
        self.pending_push: np.ndarray | None = None
        self.serving: Serving | None = None

    def send(self, dest: int, tag: int, header, payload=None) -> None:
        self.pending_push = None if payload is None else payload.copy()
        handle(self.serving, Message(self.rank, tag, header))

    def recv(self, timeout: float, source: int = 0, tag: int = -1) -> Message:
        header, self._payload = self.replies.popleft()
        return Message(0, tag, header)

    def recv_payload(self, source: int, into: np.ndarray, timeout: float) -> np.ndarray:
        into[:] = self._payload
        return into
