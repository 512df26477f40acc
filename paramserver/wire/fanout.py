"""The shard fan-out: one message to every server, each its own slice; weights back as slices into one vector.

The client's end of the wire, and server 0's way to read the other servers' slices.
Typed against `Link`, so importing this starts no MPI.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from paramserver.wire.protocol import Link, Outgoing, Pull, Push, Rejoin, Tag, Weights


@dataclass(frozen=True)
class Awaited:
    """Replies under way (`ServerLink.start`): the receives posted, and the bytes they bring."""

    requests: Any
    nbytes: int


class ServerLink:
    """The client's end of the wire: each message goes to every server, a push carrying
    each server its own slice (and its rows to server 0 only); weights come back as
    slices into one vector. (Server 0 reads the other servers' slices through one too.)

    The receives for the weights are posted before the message goes out, so a server's
    reply completes even while this client still waits on another server: with sharded
    servers, a server blocked on its reply to us while we wait for a server that waits
    for it would be a deadlock."""

    def __init__(self, transport: Link, servers: tuple[int, ...], bounds: list[tuple[int, int]],
                 timeout: float, pull_bounds: list[tuple[int, int]] | None = None,
                 fragments: list[list[tuple[int, int, int]]] = ()):
        """`bounds`: each server's slice of a push as the wire carries it (a codec's
        elements: `Codec.wire_bounds`), `pull_bounds` of the weights (None: the same);
        `fragments`: each streamed fragment's piece for each server (`ClientLoop.fragment_wire`)."""
        self.transport, self.servers, self.bounds, self.timeout = transport, servers, bounds, timeout
        self.pull_bounds = bounds if pull_bounds is None else pull_bounds
        self.fragments = fragments

    def to_first(self, message: Outgoing) -> None:
        """A message for server 0 alone (which records the run): a client's STATE."""
        self.transport.send(self.servers[0], message.tag, message.header, timeout=self.timeout)

    def exchange(self, message: Outgoing, into: np.ndarray | None) -> Weights | None:
        """Send `message`; with `into`, the servers' weights come back into it, and server
        0's header is returned (its progress, the lr schedule's; whether to stop)."""
        awaited = self.start(message, into)
        return None if into is None else self.finish(awaited)

    def start(self, message: Outgoing, into: np.ndarray | list[np.ndarray] | None) -> Awaited:
        """`exchange` split in two: send `message` and return at once, its replies (with
        `into`) still to `finish`, so a client streaming fragments trains on meanwhile.
        A streamed fragment goes to each server as its piece of it, at that piece's offset
        in the server's slice (a header alone where it misses the slice: every server
        takes every push, paramserver/wire/protocol.py's `fragment_pieces`), and `into`
        is then a vector for each server's piece of the answer (`ClientLoop.landing_for`)."""
        header = message.header
        if isinstance(header, Push) and header.fragment >= 0:
            slices = into
            sends = [(server, message.tag, replace(_sliced(header, i, lo, hi), offset=offset), message.payload[lo:hi])
                     for i, (server, (offset, lo, hi)) in enumerate(zip(self.servers, self.fragments[header.fragment]))]
        else:
            slices = [] if into is None else [into[lo:hi] for lo, hi in self.pull_bounds]
            sends = [(server, message.tag, _sliced(header, i, lo, hi),
                      None if message.payload is None else message.payload[lo:hi])
                     for i, (server, (lo, hi)) in enumerate(zip(self.servers, self.bounds))]
        replies = self.transport.expect_weights(list(self.servers), slices)
        self.transport.send_many(sends, self.timeout)
        return Awaited(replies, sum(piece.nbytes for piece in slices))

    def finish(self, awaited: Awaited) -> Weights:
        """Wait for the replies `start` posted the receives of: server 0's header."""
        return self.transport.complete(awaited.requests, list(self.servers), awaited.nbytes, self.timeout)[0]


def _sliced(header: Any, server: int, lo: int, hi: int) -> Any:
    """The header server number `server` gets: a push's says its slice's size, and only
    server 0 (which writes the run's logs) gets the rows (a push's, or a rejoining client's)."""
    if isinstance(header, Rejoin):
        return header if server == 0 else replace(header, rows=())
    if not isinstance(header, Push) or (header.size, server) == (hi - lo, 0):  # one server: as it is
        return header
    return replace(header, size=hi - lo, rows=header.rows if server == 0 else ())


def gatherer(link: Link | None, bounds: list[tuple[int, int]],
             timeout: float) -> Callable[[np.ndarray], np.ndarray] | None:
    """Server 0's way to the whole vector from its own slice, the other servers' read with
    PULL; None with one server."""
    if len(bounds) == 1:
        return None
    servers = ServerLink(link, tuple(range(1, len(bounds))), bounds[1:], timeout)

    def gather(own: np.ndarray) -> np.ndarray:
        whole = np.empty(bounds[-1][1], np.float32)
        whole[:bounds[0][1]] = own
        servers.exchange(Outgoing(Tag.PULL, Pull()), whole)
        return whole
    return gather
