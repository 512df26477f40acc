"""How a server > 0 of sharded servers lets in a joiner from outside the job (`asgd join`).

Server 0 decides every join (paramserver/membership.py); the joiner then connects to each
other server's door (paramserver/wire/door.py) and shows the ticket its Welcome carried.
That server lets it in once server 0's word (`Seated`, in server 0's order with its other
words) named the same ticket: the connection then becomes the rank server 0 knows the
joiner by, so server 0's later words about its messages name it here too, and the joiner
is told so (the word, on JOIN's tag). The joiner may knock before the word came (it races
server 0's word to this server) or after; a knock whose word has not come within the
stall timeout is refused at the next knock or word after it, a malformed one at once. A
ticket opens one door once: a second knock with it waits for a word that never comes.
"""
from __future__ import annotations

import hmac

from paramserver.wire.liveness import PeerDied
from paramserver.wire.protocol import Link, Message, PeerTimeout, Seated, Tag, well_formed

FIRST_RANK = 1 << 30  # a knocking connection's rank here, until it is let in: never one server 0 gives


class Tickets:
    """The words of server 0 not yet claimed at this server's door, and the knocks waiting for theirs."""

    def __init__(self, link: Link, timeout: float):
        """`link`: this server's, with a door (`DoorLink`); `timeout`: the longest a knock waits."""
        self.link, self.timeout = link, timeout
        self.words: list[Seated] = []                        # seated by server 0, not yet here
        self.knocks: dict[int, tuple[str, float]] = {}       # door rank -> (its ticket, when it knocked)

    def seated(self, word: Seated, now: float) -> None:
        """Server 0 seated a joiner from outside the job (a spare's word has no ticket: it
        is a rank of the job already; paramserver/handler.py's `_join`)."""
        if word.ticket:
            self.words.append(word)
            self._let_in(now)

    def knock(self, msg: Message, now: float) -> None:
        """A JOIN at this server's door: the ticket shown, or a malformed one refused."""
        if not well_formed(Tag.JOIN, msg.header):
            self.link.refuse(msg.source, f"malformed join: header {type(msg.header).__name__}")
            return
        self.knocks[msg.source] = (msg.header.secret, now)
        self._let_in(now)

    def _let_in(self, now: float) -> None:
        for rank, (ticket, since) in list(self.knocks.items()):
            word = next((w for w in self.words if hmac.compare_digest(w.ticket.encode(), ticket.encode())), None)
            if word is not None:
                self.words.remove(word)
                del self.knocks[rank]
                self.link.admit(rank, word.rank)
                try:
                    self.link.send(word.rank, Tag.JOIN, word, timeout=self.timeout)
                except (PeerDied, PeerTimeout):
                    pass  # gone as it came in: a client of this server that never speaks, lost at its stall timeout
            elif now - since > self.timeout:
                del self.knocks[rank]
                self.link.refuse(rank, f"no join of server 0's shows this ticket (waited {self.timeout:g} s)")
