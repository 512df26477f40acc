"""The server's end of an in-process link: the real `handle()` without MPI.

The simulator and the one-process tests hand each client message to `deliver`, which
runs the server's reaction at once and returns the replies it would have sent. Payloads
are copied both ways, as MPI would.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from paramserver.protocol import Message, Tag
from paramserver.server import Serving, handle


class InProcessLink:
    """Stands in for the server's Transport inside a `Serving`."""

    def __init__(self) -> None:
        self._payload: np.ndarray | None = None
        self._replies: list[tuple[int, Any, np.ndarray | None]] = []

    def deliver(self, serving: Serving, source: int, tag: Tag, header: Any,
                payload: np.ndarray | None = None) -> list[tuple[int, Any, np.ndarray | None]]:
        """Handle one message from `source`; the (dest, header, payload) replies."""
        self._payload, self._replies = payload, []
        handle(serving, Message(source, int(tag), header))
        return self._replies

    # The Transport methods that handle() uses.
    def recv_payload(self, source: int, into: np.ndarray, timeout: float) -> np.ndarray:
        payload = self._payload
        if payload.nbytes != into.nbytes:
            return payload.view(np.uint8).copy()
        into[:] = payload.view(into.dtype)
        return into

    def send(self, dest: int, tag: Tag, header: Any, payload: np.ndarray | None = None,
             timeout: float = 0.0) -> None:
        self._replies.append((dest, header, None if payload is None else payload.copy()))

    def post(self, dest: int, tag: Tag, header: Any, payload: np.ndarray | None = None) -> list:
        """Delivered at once: nothing is left in flight."""
        self.send(dest, tag, header, payload)
        return []

    def complete(self, requests: list, peers: list[int], nbytes: int, timeout: float) -> None:
        pass
