"""The client's MPI driver: `run_client` moves a `ClientLoop`'s messages over a link.

The loop itself (clients/loop.py) knows nothing of the wire; `ServerLink` is the
client's end of it, also used by server 0 to read the other servers' slices. Typed
against `paramserver.wire.protocol.Link`, so importing this starts no MPI.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import numpy as np

from clients.client import Client
from clients.loop import ClientLoop, ClientPlan, Outgoing
from paramserver.wire.protocol import Link, Pull, Push, Tag, shard_bounds


def run_client(transport: Link, client: Client, plan: ClientPlan,
               clock: Callable[[], float], start: tuple[int, int] = (0, 0)) -> int:
    """Train up to `plan.steps` minibatches over MPI, from `start` = (step, pushes so far,
    after a resume); returns the number of pushes sent in all."""
    loop = ClientLoop(client, plan, clock, *start)
    link = ServerLink(transport, plan.servers, shard_bounds(client.size, len(plan.servers)), plan.timeout)
    loop.take_weights(loop.landing, link.exchange(Outgoing(Tag.PULL, Pull()), loop.landing))
    while not loop.done:
        message, fetch = loop.advance()
        samples = link.exchange(message, loop.landing if fetch else None)
        if fetch:
            loop.take_weights(loop.landing, samples)
    return loop.pushes


class ServerLink:
    """The client's end of the wire: each message goes to every server, a push carrying
    each server its own slice (and its rows to server 0 only); weights come back as
    slices into one vector. (Server 0 reads the other servers' slices through one too.)

    The receives for the weights are posted before the message goes out, so a server's
    reply completes even while this client still waits on another server: with sharded
    servers, a server blocked on its reply to us while we wait for a server that waits
    for it would be a deadlock."""

    def __init__(self, transport: Link, servers: tuple[int, ...], bounds: list[tuple[int, int]],
                 timeout: float):
        self.transport, self.servers, self.bounds, self.timeout = transport, servers, bounds, timeout

    def exchange(self, message: Outgoing, into: np.ndarray | None) -> int | None:
        """Send `message`; with `into`, the servers' weights come back into it, and the
        progress server 0 sent with them (the lr schedule's) is returned."""
        slices = [] if into is None else [into[lo:hi] for lo, hi in self.bounds]
        replies = self.transport.expect_weights(list(self.servers), slices)
        self.transport.send_many([(server, message.tag, _sliced(message.header, i, lo, hi),
                                   None if message.payload is None else message.payload[lo:hi])
                                  for i, (server, (lo, hi)) in enumerate(zip(self.servers, self.bounds))],
                                 self.timeout)
        if into is None:
            return None
        return self.transport.complete(replies, list(self.servers), into.nbytes, self.timeout)[0].samples


def _sliced(header: Any, server: int, lo: int, hi: int) -> Any:
    """The header server number `server` gets: a push's says its slice's size, and only
    server 0 (which writes the run's logs) gets the rows."""
    if not isinstance(header, Push):
        return header
    return replace(header, size=hi - lo, rows=header.rows if server == 0 else ())
