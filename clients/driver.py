"""The client's MPI driver: `run_client` moves a `ClientLoop`'s messages over a link,
`await_admission` is a spare rank's wait to become a client and `join_server` the JOIN
of any joiner.

The loop itself (clients/loop.py) knows nothing of the wire; `ServerLink`
(paramserver/wire/fanout.py) is the client's end of it. Typed against
`paramserver.wire.protocol.Link`, so importing this starts no MPI.

Streamed fragments (docs/training.md): a fragment is pushed and the client trains on; its
answer is taken at the next fragment boundary, after the next fragment is sent (waited
for there if it has not come), so at most two are in flight; a whole push or STOP takes
every answer still out first, so none is left on the wire when the client leaves.
"""
from __future__ import annotations

import math
from collections import deque
from typing import Callable

import numpy as np

from clients.client import Client
from clients.loop import ClientLoop, ClientPlan
from paramserver.wire.fanout import Awaited, ServerLink
from paramserver.wire.protocol import Admit, Bye, Fail, Join, Link, Outgoing, ProtocolError, Pull, Tag, Weights, Welcome


def run_client(transport: Link, client: Client, plan: ClientPlan, clock: Callable[[], float],
               start: tuple[int, int] = (0, 0), first: tuple[np.ndarray, Weights] | None = None) -> int:
    """Train up to `plan.steps` minibatches over MPI, from `start` = (step, pushes so far,
    after a resume); returns the number of pushes sent in all. `first`: the weights (as
    they came over the wire) and their header a joiner's Welcome brought, in place of a
    first pull."""
    loop = ClientLoop(client, plan, clock, *start)
    link = ServerLink(transport, plan.servers, loop.codec.wire_bounds(loop.shards), plan.timeout,
                      loop.pull_codec.wire_bounds(loop.shards), loop.fragment_wire())
    if first is None:
        first = loop.landing, link.exchange(Outgoing(Tag.PULL, Pull()), loop.landing)
    loop.take_weights(*first)
    streamed: deque[tuple[list[np.ndarray], Awaited]] = deque()  # fragments pushed, their slices not yet taken
    while not loop.done:
        message, fetch = loop.advance()
        state = loop.state_before(message)
        if state is not None:
            link.to_first(state)
        if message.tag == Tag.PUSH and message.header.fragment >= 0:
            _stream(loop, link, message, streamed)
            continue
        while streamed:  # a whole push or STOP: every fragment's slice taken first
            _take_oldest(loop, link, streamed)
        reply = link.exchange(message, loop.landing if fetch else None)
        if fetch:
            loop.take_weights(loop.landing, reply)
    return loop.pushes


def _stream(loop: ClientLoop, link: ServerLink, message: Outgoing,
            streamed: deque[tuple[list[np.ndarray], Awaited]]) -> None:
    """Push a streamed fragment and train on without its answer, whose pieces land in
    the fragment's own vectors (two in flight share no bytes). The previous
    fragment's answer is taken here, at the first fragment boundary after it was sent
    (waited for if it is not in yet: `ClientLoop.behind`), as the simulator does."""
    into = loop.landing_for(message.header.fragment)
    streamed.append((into, link.start(message, into)))
    if loop.behind:
        _take_oldest(loop, link, streamed)


def _take_oldest(loop: ClientLoop, link: ServerLink, streamed: deque[tuple[list[np.ndarray], Awaited]]) -> None:
    """The oldest fragment's answer, its servers' pieces put together (one server: as it landed)."""
    pieces, awaited = streamed.popleft()
    reply = link.finish(awaited)
    loop.take_weights(pieces[0] if len(pieces) == 1 else np.concatenate(pieces), reply)


def await_admission(transport: Link, host: str, landing: np.ndarray | None, timeout: float) -> Welcome | Bye:
    """A spare rank's wait for server 0 (paramserver/wire/protocol.py draws it): BYE (the
    run ended without needing it), or ADMIT, then its JOIN (`join_server`). A JOIN the
    server refuses (the run finished meanwhile) is answered by the BYE at the run's end.
    Each wait asks whether server 0 still runs (the transport's PeerWatch), so a dead
    server ends it."""
    msg = _from_server(transport, (Admit, Bye))
    if isinstance(msg, Bye):
        return msg
    return join_server(transport, msg.secret, host, landing, timeout)


def join_server(link: Link, secret: str, host: str, landing: np.ndarray | None,
                timeout: float) -> Welcome | Bye | Fail:
    """JOIN server 0 with the run's secret: its Welcome, with the weights in `landing`
    (sized as a pull's on the wire; None: sharded servers, whose Welcome brings none, the
    joiner pulling from every server once each knows it); else a BYE (the run ended) or,
    over the door of paramserver/wire/door.py, a FAIL saying why the JOIN was refused."""
    link.send(0, Tag.JOIN, Join(secret, host), timeout=timeout)
    msg = _from_server(link, (Welcome, Bye, Fail))
    if isinstance(msg, Welcome) and landing is not None:
        replies = link.expect_weights([0], [landing])
        link.complete(replies, [0], landing.nbytes, timeout)
    return msg


def _from_server(transport: Link, expected: tuple[type, ...]) -> object:
    msg = transport.recv(math.inf, source=0)
    if not isinstance(msg.header, expected) or (msg.tag == Tag.BYE) != isinstance(msg.header, Bye):
        raise ProtocolError(f"waiting for server 0, got tag {msg.tag} with {type(msg.header).__name__}")
    return msg.header
