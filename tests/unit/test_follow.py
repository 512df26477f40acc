"""Sharded servers follow server 0: a server > 0 that takes the clients' messages in
another order (pushes crossing in flight) handles them in server 0's order with its
reply decisions (paramserver/drivers/follow.py), so its slice takes the same steps and answers
the same clients at the same versions; the pace (`fresh_reply`, `nesterov_reply` =
`auto`) decides once."""
import numpy as np
import pytest

from paramserver.wire.protocol import Decided, Message, Pull, Push, Stop, Tag
from tests.unit.test_server import fresh_state


def _push(rank: int, step: int) -> Message:
    value = np.full(4, float(rank * 10 + step), np.float32)  # each push its own gradient
    return Message(rank, Tag.PUSH, Push(step, 4, True), value)


# server 0's arrivals, on the run's clock: three clients, a step of 2 minibatches, R = 0
LEADER = [(0.0, Message(r, Tag.PULL, Pull())) for r in (1, 2, 3)] + [
    (1.0, _push(1, 1)), (1.1, _push(2, 1)), (1.5, _push(3, 1)), (2.0, _push(1, 2)), (2.1, _push(2, 2)),
    (2.2, _push(1, 3)), (3.0, _push(3, 2)), (3.2, _push(1, 4)), (3.3, _push(2, 3)),
    (4.0, Message(1, Tag.STOP, Stop(4, 4))), (4.1, Message(3, Tag.STOP, Stop(2, 2))),
    (4.2, Message(2, Tag.STOP, Stop(3, 3)))]


class Link:
    """A server's wire: the messages it takes, in order, on a clock; what it sends."""

    def __init__(self, arrivals, now):
        self.arrivals, self.now, self.posted, self.words = list(arrivals), now, [], []

    def recv(self, timeout, **options):
        self.now[0], msg = self.arrivals.pop(0)
        return msg

    def post(self, dest, tag, header, payload):
        self.posted.append((dest, header.version))
        return []

    def complete(self, requests, peers, nbytes, timeout):
        return []

    def send(self, dest, tag, header, payload=None, timeout=0.0):
        self.words.append((dest, tag, header))


def _state(rule: str, clock):
    """Three clients: `fresh` gathering 2 minibatches a step, R = 0, or delayed Nesterov's
    rounds of 2 pushes; both replying by the pace."""
    from runconfig.settings import RunConfig
    from paramserver.reply.policy import ReplyPolicy
    from paramserver.rules import make_rule
    from paramserver.state import ServerState
    from paramserver.store import Store

    if rule == "fresh":
        return fresh_state(3, clock=clock, fresh_batch=2, fresh_reply="auto", overdue=0)
    cfg = RunConfig(rule=rule, nesterov_every=2, nesterov_momentum=0.9, nesterov_reply="auto", lr_scaling="none")
    made = make_rule(rule, cfg, 3)
    return ServerState(Store(np.zeros(4, np.float32), made), [1, 2, 3], clock=clock,
                       reply=ReplyPolicy.for_run(cfg, made, 3, clock))


def _serve(arrivals, follow: bool = False, followers=(), rule: str = "fresh"):
    from paramserver.drivers.follow import Follow
    from paramserver.drivers.server import ServerLoop

    now = [0.0]
    state = _state(rule, lambda: now[0])
    link = Link(arrivals, now)
    ServerLoop(link, state, None, lambda: now[0], stall_timeout=60.0, followers=followers,
               follow=Follow(lambda: now[0]) if follow else None).serve()
    return state, link


def _crossed(words):
    """The follower's arrivals: the clients' messages with rank 3's ahead of the others
    (each client's own in order), and server 0's words after them or before them."""
    clients = [m for _, m in LEADER]
    crossed = sorted(clients, key=lambda m: (0 if m.source == 3 else 1))
    said = [(0.0, Message(0, Tag.DECIDED, w)) for _, _, w in words]
    return crossed, said


@pytest.mark.parametrize("rule", ["fresh", "nesterov"])
@pytest.mark.parametrize("words_first", [False, True])
def test_a_follower_takes_server_0s_steps_and_answers_whatever_order_the_pushes_came_in(words_first, rule):
    leader, sent = _serve(LEADER, followers=(1,), rule=rule)
    said = [w for _, _, w in sent.words]
    assert any(True in w.said for w in said) and any(False in w.said for w in said)  # the pace deferred, and did not
    crossed, told = _crossed(sent.words)
    arrivals = told + [(0.0, m) for m in crossed] if words_first else [(0.0, m) for m in crossed] + told
    follower, link = _serve(arrivals, follow=True, rule=rule)
    assert link.posted == sent.posted  # the same clients answered in the same order at the same versions
    assert follower.store.version == leader.store.version > 2  # fresh's steps; nesterov's pushes
    assert np.array_equal(follower.store.weights, leader.store.weights)
    assert follower.store.dropped == leader.store.dropped


def test_a_server_on_its_own_in_that_order_takes_other_steps():
    """Why it follows: the same messages in the follower's order, decided there, fill the
    steps with other pushes."""
    leader, sent = _serve(LEADER, followers=(1,))
    crossed, _ = _crossed(sent.words)
    alone, _ = _serve([(t, m) for (t, _), m in zip(LEADER, crossed)])
    assert not np.array_equal(alone.store.weights, leader.store.weights)


def test_server_0s_word_is_checked_before_it_is_followed():
    from paramserver.drivers.follow import Follow
    from paramserver.wire.protocol import ProtocolError

    with pytest.raises(ProtocolError, match="malformed decision"):
        Follow(lambda: 0.0).take(Message(0, Tag.DECIDED, Decided(1, (1,))))


def test_a_word_for_a_client_this_server_lost_follows_only_the_loops_answers():
    """Its message may never come here: the answers the handler would have asked for it
    are passed over, the step server 0's loop let go after it is taken."""
    from paramserver.drivers.follow import Follow

    follow = Follow(lambda: 0.0)
    word = Decided(2, (True,), (False,))
    follow.take(Message(0, Tag.DECIDED, word))
    assert list(follow.ready(gone={2})) == [(word, None)] and not follow.words


def test_a_follower_holding_a_clients_message_names_server_0_when_it_goes_silent():
    from paramserver.wire.protocol import PeerTimeout

    with pytest.raises(PeerTimeout, match=r"server 0 \(rank 0\) silent for 100 s") as silent:
        _serve([(0.0, _push(1, 1)), (100.0, _push(2, 1))], follow=True)
    assert silent.value.peers == (0,)
