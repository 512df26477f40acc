"""The byte blocks MPI transfers read or fill, and when one may be written again (MPI
allows no write to a buffer it is sending): split from paramserver/wire/transport.py,
which moves the messages, when a send's `live` flag (does it read the caller's payload
in place?) grew that module past 400 lines.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from paramserver.wire import frame

_REMEMBERED = 16  # sends from distinct blocks kept in mind before the finished ones are forgotten


class Posted(list):
    """MPI requests under way, with the buffers they read or fill (alive until done), for
    replies the check to run once they are in, and for a send whether it reads the
    caller's payload in place (`live`: the payload must not change until it is done)."""

    def __init__(self, requests: list[Any], keep: list[np.ndarray] = (),
                 verify: Callable[[], list] | None = None, live: bool = False):
        super().__init__(requests)
        self.keep, self.verify, self.live = keep, verify, live


class Blocks:
    """The reused staging blocks, by key (("to", peer) or ("from", peer)), and the sends
    under way from any block; `done(requests)` says whether MPI finished a send (given by
    the transport: only it imports MPI)."""

    def __init__(self, done: Callable[[Posted], bool]) -> None:
        self.done = done
        self._staging: dict[tuple, np.ndarray] = {}
        self._in_place: dict[int, Posted] = {}  # block address -> the send from it still under way

    def sending(self, block: np.ndarray, posted: Posted) -> None:
        """A send from `block` is under way (`posted`): not to be written until it is done."""
        self._in_place[frame.address(block)] = posted

    def reading(self, block: np.ndarray) -> bool:
        """Whether a send from `block` (one that starts where it does) is still under way:
        MPI allows no write to a buffer it is sending, not even of the same bytes. (Only
        sends under way are remembered, so the blocks of finished ones can be freed.)"""
        address = frame.address(block)
        posted = self._in_place.get(address)
        if posted is not None and self.done(posted):
            del self._in_place[address]
            posted = None
        if len(self._in_place) > _REMEMBERED:  # forget the finished, so their blocks can be freed
            self._in_place = {a: p for a, p in self._in_place.items() if not self.done(p)}
        return posted is not None

    def staged(self, key: tuple, nbytes: int) -> np.ndarray:
        """A reused block of `nbytes` for a framed message to or from a peer whose vector has
        no room around it (compressed, GPU-staged, a shard's slice): one copy, where a
        derived MPI datatype would have MPICH pack it, a copy too, and in pieces that move
        only while both sides poll. A new block while a send from the last is still
        under way."""
        block = self._staging.get(key)
        if block is None or block.nbytes < nbytes or self.reading(block):
            block = self._staging[key] = np.empty(nbytes, np.uint8)
        return block[:nbytes]
