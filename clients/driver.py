"""The client's MPI driver: `run_client` moves a `ClientLoop`'s messages over a link.

The loop itself (clients/loop.py) knows nothing of the wire; `ServerLink`
(paramserver/wire/fanout.py) is the client's end of it. Typed against
`paramserver.wire.protocol.Link`, so importing this starts no MPI.
"""
from __future__ import annotations

from typing import Callable

from clients.client import Client
from clients.loop import ClientLoop, ClientPlan
from paramserver.wire.fanout import ServerLink
from paramserver.wire.protocol import Link, Outgoing, Pull, Tag, shard_bounds


def run_client(transport: Link, client: Client, plan: ClientPlan,
               clock: Callable[[], float], start: tuple[int, int] = (0, 0)) -> int:
    """Train up to `plan.steps` minibatches over MPI, from `start` = (step, pushes so far,
    after a resume); returns the number of pushes sent in all."""
    loop = ClientLoop(client, plan, clock, *start)
    bounds = shard_bounds(client.size, len(plan.servers), loop.codec.block)
    link = ServerLink(transport, plan.servers, loop.codec.wire_bounds(bounds), plan.timeout,
                      loop.pull_codec.wire_bounds(bounds))
    loop.take_weights(loop.landing, link.exchange(Outgoing(Tag.PULL, Pull()), loop.landing))
    while not loop.done:
        message, fetch = loop.advance()
        state = loop.state_before(message)
        if state is not None:
            link.to_first(state)
        reply = link.exchange(message, loop.landing if fetch else None)
        if fetch:
            loop.take_weights(loop.landing, reply)
    return loop.pushes
