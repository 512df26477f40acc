"""Streamed fragments with sharded servers: a fragment cut at the servers' slices
(`protocol.fragment_pieces`), a piece to each server at its offset there, a header alone
where it misses a server; S servers taking the pieces end where one server taking the
fragments does, bit for bit, every server at the same version after every push."""
from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
import pytest

from paramserver.compute.quantkernel import make_codec
from paramserver.drivers.inprocess import InProcess
from paramserver.recorder import Recorder
from paramserver.rules import make_rule
from paramserver.state import ServerState
from paramserver.store import Store
from paramserver.wire.compress import BLOCK
from paramserver.wire.fanout import ServerLink
from paramserver.wire.protocol import Outgoing, Push, Tag, fragment_pieces, shard_bounds
from rundir.layout import RunDir
from runconfig.settings import RunConfig


def test_a_fragment_across_three_servers_by_hand():
    """8 elements, 4 fragments of 2, servers holding [0, 2), [2, 5), [5, 8): fragment 2,
    [4, 6), misses server 0 (an empty piece at the end of its slice), puts its first
    element at offset 2 of server 1's slice and its second at offset 0 of server 2's."""
    shards = shard_bounds(8, 3)
    assert shards == [(0, 2), (2, 5), (5, 8)]
    assert fragment_pieces((4, 6), shards) == [(2, 0, 0), (2, 0, 1), (0, 1, 2)]
    assert fragment_pieces((0, 2), shards) == [(0, 0, 2), (0, 2, 2), (0, 2, 2)]


@pytest.mark.parametrize("size,fragments,servers,block", [
    (1000, 4, 2, 1),          # P > S, each fragment on one server
    (1000, 3, 2, 1),          # P not a multiple of S: the middle fragment straddles
    (1003, 2, 3, 1),          # S > P
    (1001, 7, 3, 1),          # neither divides the other nor the size
    (5, 4, 3, 1),             # slices of one or two elements
    (3 * BLOCK + 7, 4, 3, BLOCK),  # a blockwise codec's: every cut on a block
    (9 * BLOCK + 1, 3, 2, BLOCK),
])
def test_pieces_cover_each_fragment_exactly_at_each_servers_offset(size, fragments, servers, block):
    shards = shard_bounds(size, servers, block)
    owned = {s: [] for s in range(servers)}
    for a, b in shard_bounds(size, fragments, block):
        cuts = fragment_pieces((a, b), shards)
        assert len(cuts) == servers
        assert cuts[0][1] == 0 and cuts[-1][2] == b - a  # from the fragment's start to its stop,
        assert all(cuts[s][2] == cuts[s + 1][1] for s in range(servers - 1))  # each piece where the last stopped
        for s, ((lo, hi), (offset, start, stop)) in enumerate(zip(shards, cuts)):
            assert 0 <= offset <= hi - lo and start <= stop
            assert (stop > start) == (max(a, lo) < min(b, hi))  # empty exactly where they do not meet
            if stop > start:
                assert lo + offset == a + start and offset + stop - start <= hi - lo
                assert start % block == 0 and offset % block == 0
                owned[s].append((offset, offset + stop - start))
    for s, (lo, hi) in enumerate(shards):  # and a server's pieces tile its slice, in fragment order
        edges = [e for piece in owned[s] for e in piece]
        assert edges[0] == 0 and edges[-1] == hi - lo and edges == sorted(edges)
        assert all(owned[s][i][1] == owned[s][i + 1][0] for i in range(len(owned[s]) - 1))
        weights = np.zeros(hi - lo, np.float32)
        state = ServerState(Store(weights, make_rule("add", RunConfig(rule="add"))), [servers], fragments=fragments,
                            codec=make_codec("int8" if block > 1 else "none"), shard=(lo, hi, size))
        assert [p for p in state.pieces if p[1] > p[0]] == owned[s]  # the server's own count of them


class Servers:
    """A `Link` to in-process servers by rank: a message is handled as it is sent, each
    server's replies held until the client completes their receives; `sent` counts the
    pushes each server was sent with no payload (a fragment that misses its slice)."""

    def __init__(self, servers: dict[int, InProcess]):
        self.servers, self.held = servers, {rank: deque() for rank in servers}
        self.headers_alone = 0

    def expect_weights(self, sources: list[int], intos: list[np.ndarray]) -> list:
        return list(zip(sources, intos))

    def send(self, dest: int, tag: Tag, header: Any, payload: np.ndarray | None = None, timeout: float = 0) -> None:
        self.send_many([(dest, tag, header, payload)], timeout)

    def send_many(self, messages: list, timeout: float = 0) -> None:
        for dest, tag, header, payload in messages:
            self.headers_alone += tag == Tag.PUSH and payload.size == 0
            self.held[dest].extend(self.servers[dest].deliver(len(self.servers), tag, header, payload))

    def complete(self, posted: list, peers: list[int], nbytes: int, timeout: float) -> list:
        headers = []
        for source, into in posted:
            reply = self.held[source].popleft()
            into[:] = reply.payload
            headers.append(reply.header)
        return headers


def sharded(path, weights: np.ndarray, servers: int, fragments: int, rule: str, compress: str) -> dict[int, InProcess]:
    """`servers` in-process servers of `weights`, each its slice, one client (rank `servers`)."""
    cfg = RunConfig(rule=rule, **({"nesterov_momentum": 0.9, "nesterov_every": 2} if rule == "nesterov" else {}))
    made = {}
    for s, (lo, hi) in enumerate(shard_bounds(weights.size, servers, make_codec(compress).block)):
        run = RunDir(path / f"server{s}")
        run.create()
        state = ServerState(Store(weights[lo:hi].copy(), make_rule(rule, cfg, clients=1)), [servers],
                            codec=make_codec(compress), fragments=fragments, shard=(lo, hi, weights.size))
        made[s] = InProcess(state, Recorder(run, state, lambda: 0.0))
    return made


@pytest.mark.parametrize("rule", ["add", "staleness", "nesterov"])
@pytest.mark.parametrize("compress", ["none", "int8"])
@pytest.mark.parametrize("servers,fragments", [(2, 4), (3, 4), (3, 2)])
def test_sharded_servers_take_a_fragments_pieces_as_one_server_takes_it(tmp_path, rule, compress, servers, fragments):
    """Three rounds of P fragments and a whole push, sent through the client's
    `ServerLink`: the servers' slices put together are one server's weights, bit for bit
    (the rules' arithmetic is elementwise, the staleness the same on every server since
    every server takes every push), every answer's pieces are one server's answer, and
    every server's version is server 0's after every push."""
    size, codec = 3 * BLOCK + 7, make_codec(compress)
    weights = np.linspace(-1, 1, size, dtype=np.float32)
    one = sharded(tmp_path / "one", weights, 1, fragments, rule, compress)
    many = sharded(tmp_path / "many", weights, servers, fragments, rule, compress)
    links, answered = {}, {}
    for name, made in (("one", one), ("many", many)):
        shards = shard_bounds(size, len(made), codec.block)
        cuts = [fragment_pieces(f, shards) for f in shard_bounds(size, fragments, codec.block)]
        answered[name] = [[stop - start for _, start, stop in cut] for cut in cuts]  # float32 elements each server
        wire = [[(offset, *codec.wire_bounds([(start, stop)])[0]) for offset, start, stop in cut] for cut in cuts]
        links[name] = ServerLink(Servers(made), tuple(made), codec.wire_bounds(shards), 1.0, shards, wire)
    rng = np.random.default_rng(1)
    try:
        for step, p in enumerate([*range(fragments)] * 3, start=1):
            a, b = shard_bounds(size, fragments, codec.block)[p]
            data = codec.encode(rng.standard_normal(b - a).astype(np.float32) * 1e-2)
            push = Outgoing(Tag.PUSH, Push(step, data.size, True, codec.dtype, fragment=p, offset=a), data)
            answers = []
            for name, link in links.items():
                pieces = [np.empty(n, np.float32) for n in answered[name][p]]
                reply = link.finish(link.start(push, pieces))
                assert (reply.fragment, reply.version) == (p, step)
                answers.append(np.concatenate(pieces))
            np.testing.assert_array_equal(*answers)
            assert {m.state.store.version for m in many.values()} == {step}
        last = codec.encode(rng.standard_normal(size).astype(np.float32) * 1e-2)
        for name, link in links.items():
            link.exchange(Outgoing(Tag.PUSH, Push(3 * fragments + 1, last.size, False, codec.dtype), last), None)
        assert {m.state.store.version for m in many.values()} == {3 * fragments + 1}
        assert all(m.state.tally.rejected == 0 for m in (*one.values(), *many.values()))
        whole = np.concatenate([many[s].state.store.weights for s in range(servers)])
        np.testing.assert_array_equal(whole, one[0].state.store.weights)
        missed = sum(not any(lo < b and a < hi for lo, hi in shard_bounds(size, servers, codec.block)[s:s + 1])
                     for a, b in shard_bounds(size, fragments, codec.block) for s in range(servers))
        assert links["many"].transport.headers_alone == 3 * missed
    finally:
        for made in (one, many):
            for server in made.values():
                server.recorder.close()
