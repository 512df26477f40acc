"""How servers 1..S-1 of sharded servers follow server 0: each handles the clients'
messages in the order server 0 handled them, with server 0's reply decisions, so its
slice takes the same pushes into the same steps and answers the same clients at the same
versions as server 0's (the pace and DyLU decide from timings each server would measure
apart; a client waits for its slowest reply, and pushes that cross in flight would fill
a step differently on each server).

Every client sends every server its PUSH, PULL and STOP; each server takes them as they
arrive, in an order that differs between servers by the race of the transfers. After
each message server 0 handled it tells the others whose it was and what its reply policy
answered (`Decided`, paramserver/wire/protocol.py). A follower keeps a client's message
until server 0 names it (a copy, as the landing buffer takes the next message, unless
named already) and server 0's word until the message comes, then handles the two
together (paramserver/drivers/server.py's `ServerLoop`). Server 0's PULL of this slice for a snapshot waits behind the words sent
before it, so a snapshot's slices are all at server 0's version.
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Container, Iterator

from paramserver.wire.protocol import Decided, Message, ProtocolError, Seated, Tag, well_formed

LEADER = 0  # the server that decides
IN_TURN = (Tag.PUSH, Tag.PULL, Tag.STOP)  # a client's messages that every server gets and handles in server 0's order


class Follow:
    """A follower's queues: server 0's words, and the clients' messages they have not named yet."""

    def __init__(self, clock: Callable[[], float]):
        self.clock = clock
        self.words: deque[Decided | Seated | Message] = deque()  # server 0's, in its order: a word, or its PULL
        self.kept: dict[int, deque[tuple[float, Message]]] = {}  # rank -> (when it came, message) not yet named

    def take(self, msg: Message) -> bool:
        """Whether `msg` waits for its turn here (False: the loop handles it now: a FAIL, a JOIN)."""
        if msg.source == LEADER:
            if msg.tag == Tag.DECIDED and not well_formed(msg.tag, msg.header):
                raise ProtocolError(f"server 0 sent a malformed decision: {msg.header!r}")
            self.words.append(msg.header if msg.tag == Tag.DECIDED else msg)
            return True
        if msg.tag not in IN_TURN:
            return False
        kept = self.kept.setdefault(msg.source, deque())
        if msg.payload is not None and not (not kept and self._named_next(msg.source)):
            msg = Message(msg.source, msg.tag, msg.header, msg.payload.copy())  # the landing buffer takes the next
        kept.append((self.clock(), msg))
        return True

    def _named_next(self, rank: int) -> bool:
        """Whether server 0's next word names `rank`: its message is handled before the next
        receive (`ready`), so it needs no copy (a follower behind server 0 pays none)."""
        return bool(self.words) and isinstance(self.words[0], Decided) and self.words[0].rank == rank

    def ready(self, gone: Container[int]) -> Iterator[tuple[Decided | Seated | None, Message | None]]:
        """The messages whose turn came, in server 0's order, each with its word (None:
        server 0's PULL; a word without a message: a step its loop let go, a joiner it
        seated (`Seated`), or one of a client this server lost, whose message may never
        come: then only the loop's answers are followed)."""
        while self.words:
            word = self.words[0]
            if isinstance(word, (Message, Seated)):
                yield (None, self.words.popleft()) if isinstance(word, Message) else (self.words.popleft(), None)
                continue
            kept = self.kept.get(word.rank)
            if word.rank >= 0 and not kept and word.rank not in gone:
                return
            self.words.popleft()
            yield word, (kept.popleft()[1] if kept and word.rank >= 0 else None)

    def held_since(self, rank: int) -> float | None:
        """When `rank`'s oldest message not yet named came (None: none is held)."""
        kept = self.kept.get(rank)
        return kept[0][0] if kept else None
