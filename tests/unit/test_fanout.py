"""The client's end of the wire (paramserver/wire/fanout.py): which slice each server's
message and reply are, whole or streamed, with the receives posted before the send."""
from __future__ import annotations

import numpy as np

from paramserver.wire.fanout import ServerLink
from paramserver.wire.protocol import Outgoing, Pull, Push, Tag, Weights


class Recording:
    """A `Link` that notes what was posted and sent, in order, and answers every receive."""

    def __init__(self):
        self.calls = []

    def expect_weights(self, sources, intos):
        self.calls.append(("expect", sources, [(into.base is not None, into.size) for into in intos]))
        return intos

    def send_many(self, messages, timeout):
        self.calls.append(("send", [(dest, header, None if payload is None else payload.size)
                                    for dest, _, header, payload in messages]))

    def complete(self, requests, peers, nbytes, timeout):
        self.calls.append(("complete", peers, nbytes))
        return [Weights(1, into.size) for into in requests]


def test_a_fragment_goes_as_it_is_to_one_server_and_its_answer_fills_its_own_vector():
    link = Recording()
    servers = ServerLink(link, (0,), [(0, 10)], timeout=1.0, fragments=[[(0, 0, 5)], [(5, 0, 3)]])
    push = Push(4, 3, True, fragment=1, offset=5)
    awaited = servers.start(Outgoing(Tag.PUSH, push, np.ones(3, np.float32)), [np.empty(3, np.float32)])
    assert link.calls == [("expect", [0], [(False, 3)]), ("send", [(0, push, 3)])]  # posted before it goes
    assert servers.finish(awaited) == Weights(1, 3) and link.calls[-1] == ("complete", [0], 12)


def test_a_fragment_goes_to_each_server_as_its_piece_and_a_header_alone_where_it_misses_one():
    """Servers holding [0, 4) and [4, 10): fragment [3, 7) is one element at offset 3 of
    server 0's slice and three at offset 0 of server 1's; fragment [8, 10) misses server 0,
    which gets its header with no payload (offset clamped to its slice's end). The rows go
    to server 0 alone, each answer's piece into a vector of its own."""
    link = Recording()
    rows = ({"step": 4},)
    servers = ServerLink(link, (0, 1), [(0, 4), (4, 10)], timeout=1.0,
                         fragments=[[(0, 0, 3), (0, 3, 3)], [(3, 0, 1), (0, 1, 4)], [(4, 2, 2), (4, 0, 2)]])
    for fragment, (a, b), sizes in [(1, (3, 7), (1, 3)), (2, (8, 10), (0, 2))]:
        link.calls.clear()
        push = Push(4, b - a, True, fragment=fragment, offset=a, rows=rows)
        pieces = [np.empty(n, np.float32) for n in sizes]
        servers.start(Outgoing(Tag.PUSH, push, np.arange(a, b, dtype=np.float32)), pieces)
        offsets = servers.fragments[fragment]
        assert link.calls == [("expect", [0, 1], [(False, n) for n in sizes]),
                              ("send", [(0, Push(4, sizes[0], True, fragment=fragment, offset=offsets[0][0], rows=rows),
                                         sizes[0]),
                                        (1, Push(4, sizes[1], True, fragment=fragment, offset=offsets[1][0]),
                                         sizes[1])])]


def test_one_server_of_a_slice_fills_its_slice_of_the_whole_vector():
    """Server 0 reads server 1's slice (`gatherer`) through a link of one server whose slice
    does not start at 0: its reply lands there, not at the vector's start."""
    link = Recording()
    whole = np.zeros(10, np.float32)
    assert ServerLink(link, (1,), [(4, 10)], timeout=1.0).exchange(Outgoing(Tag.PULL, Pull()), whole) == Weights(1, 6)
    assert link.calls[0] == ("expect", [1], [(True, 6)]) and link.calls[-1] == ("complete", [1], 24)  # its bytes
