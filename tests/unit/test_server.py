"""The server's message handler, in one process. Bad messages (rejected, logged, harmless)
are in tests/reliability/test_messages.py."""
from __future__ import annotations

import time

import pytest

from runconfig.settings import RunConfig
from paramserver.handler import ClientFailed
from paramserver.wire.protocol import Fail, Tag


def test_fail_from_a_client_ends_the_job(served):
    with pytest.raises(ClientFailed, match="failed: boom"):
        served.deliver(1, Tag.FAIL, Fail("boom"))


def test_handle_returns_replies_and_events_and_touches_no_disk():
    """The handler has no run directory to write to: what it did comes back as events."""
    import numpy as np

    from paramserver.events import Applied, ClientRows, SnapshotDue
    from paramserver.handler import handle
    from paramserver.state import ServerState
    from paramserver.rules import make_rule
    from paramserver.store import Store
    from paramserver.wire.protocol import Message, Pull, Push

    state = ServerState(Store(np.zeros(4, np.float32), make_rule("add", RunConfig())), [1], eval_every=1, apply_cost=0.5)
    [reply], events = handle(state, Message(1, Tag.PULL, Pull()))
    assert (reply.dest, reply.header.version, events) == (1, 0, [])
    row = {"client": 0, "step": 1, "loss": 1.0, "samples": 8}
    replies, events = handle(state, Message(1, Tag.PUSH, Push(1, 4, False, rows=(row,)), np.ones(4, np.float32)))
    assert replies == []
    assert events == [Applied(0, 1, 0, 0.5), ClientRows([{**row, "version_pulled": 0, "staleness": 0}], 1),
                      SnapshotDue(1)]
    assert (state.tally.minibatches, state.tally.samples) == (1, 8)


def test_recorder_writes_what_was_true_when_the_snapshot_was_due(tmp_path, monkeypatch):
    """Snapshots and checkpoints are written on a thread, from copies taken at the event:
    weights changed before the thread writes do not leak into them."""
    import threading

    import numpy as np

    import paramserver.recorder
    from rundir.checkpoint import Checkpoint
    from rundir.durable import load_arrays
    from tests.conftest import make_server, push

    changed, write = threading.Event(), paramserver.recorder.save_point
    monkeypatch.setattr(paramserver.recorder, "save_point", lambda *args: (changed.wait(10), write(*args)))
    server = make_server(tmp_path / "run", np.zeros(4, np.float32), clients=1)
    server.state.eval_every = 1
    server.deliver(1, *push(1, np.ones(4, np.float32)))  # version 1: a snapshot and a checkpoint
    server.state.store.array += 100  # the files are not written yet
    changed.set()
    server.recorder.close()
    run = server.recorder.run
    [(version, path)] = run.snapshots()
    np.testing.assert_array_equal(load_arrays(path)["weights"], np.ones(4))
    checkpoint = Checkpoint.load(run)
    assert (version, checkpoint.version, checkpoint.lines, checkpoint.counts) == (1, 1, (1, 1), (1, 0, 0))
    np.testing.assert_array_equal(checkpoint.weights, np.ones(4))


def fresh_state(clients: int, clock=time.monotonic, **settings):
    import numpy as np

    from runconfig.settings import RunConfig
    from paramserver.state import ServerState
    from paramserver.rules import make_rule
    from paramserver.store import Store

    from paramserver.reply.policy import ReplyPolicy

    cfg = RunConfig(**{"lr": 0.5, "lr_scaling": "none", **settings})
    rule = make_rule("fresh", cfg, clients)
    return ServerState(Store(np.zeros(4, np.float32), rule), list(range(1, clients + 1)), clock=clock,
                       reply=ReplyPolicy.for_run(cfg, rule, clients, clock))


def gradient(state, rank: int, step: int, fetch: bool = True):
    import numpy as np

    from paramserver.handler import handle
    from paramserver.wire.protocol import Message, Push

    return handle(state, Message(rank, Tag.PUSH, Push(step, 4, fetch), np.full(4, float(rank), np.float32)))


def test_fresh_wait_answers_a_gathered_push_at_the_step_with_the_others():
    from paramserver.handler import handle
    from paramserver.wire.protocol import Message, Pull

    state = fresh_state(3, fresh_reply="wait")
    for rank in (1, 2, 3):
        handle(state, Message(rank, Tag.PULL, Pull()))
    assert gradient(state, 2, 1)[0] == [] and gradient(state, 1, 1)[0] == []  # gathered: no reply yet
    replies, _ = gradient(state, 3, 1)  # the third completes S = K = 3
    assert [(r.dest, r.header.version) for r in replies] == [(3, 1), (2, 1), (1, 1)]  # the pusher first
    assert state.store.weights.tolist() == [-1.0] * 4  # lr 0.5 x the mean gradient, 2
    assert state.reply.deferred == [] and state.store.pulled == {0: 1, 1: 1, 2: 1}


def test_fresh_wait_takes_the_step_when_every_running_client_waits():
    """Client 2 stopped; client 1's push cannot be joined by another: a STOP releases it
    (the step with what was gathered, and the reply)."""
    from paramserver.events import SnapshotDue
    from paramserver.handler import handle
    from paramserver.wire.protocol import Message, Pull, Stop

    state = fresh_state(3, fresh_batch=3, fresh_reply="wait")
    state.eval_every = 1
    for rank in (1, 2, 3):
        handle(state, Message(rank, Tag.PULL, Pull()))
    assert gradient(state, 3, 1, fetch=False)[0] == []
    handle(state, Message(3, Tag.STOP, Stop(1, 1)))
    assert gradient(state, 1, 1)[0] == [] and state.reply.deferred == [1]
    replies, events = handle(state, Message(2, Tag.STOP, Stop(0, 0)))
    assert [(r.dest, r.header.version) for r in replies] == [(1, 1)] and events == [SnapshotDue(1)]
    assert state.store.weights.tolist() == [-1.0] * 4  # the mean of the two gathered, 2


def test_fresh_again_answers_at_once_with_the_same_weights():
    from paramserver.handler import handle
    from paramserver.wire.protocol import Message, Pull

    state = fresh_state(2, fresh_reply="again")
    for rank in (1, 2):
        handle(state, Message(rank, Tag.PULL, Pull()))
    [reply], _ = gradient(state, 1, 1)
    assert (reply.dest, reply.header.version) == (1, 0)
    [reply], _ = gradient(state, 1, 2)  # a second gradient at version 0 completes the step
    assert reply.header.version == 1
    _, events = gradient(state, 2, 1)  # client 2's, computed at version 0: dropped
    assert state.store.dropped == {1: 1} and type(events[0]).__name__ == "Dropped"


def test_fresh_auto_times_the_clients_with_one_server_or_several():
    from runconfig.settings import RunConfig
    from paramserver.reply.policy import ReplyMode, ReplyPolicy

    assert fresh_state(2, fresh_reply="auto").reply.pace is not None and fresh_state(2, fresh_reply="wait").reply.pace is None
    from paramserver.rules import FreshRule, Rule

    sharded = ReplyPolicy.for_run(RunConfig(rule="fresh", fresh_reply="auto", servers=2), FreshRule, 2)
    assert sharded.mode is ReplyMode.AUTO and sharded.pace is not None  # server 0's decides (tests/unit/test_follow.py)
    assert ReplyPolicy.for_run(RunConfig(rule="add", fresh_reply="wait"), Rule, 2).mode is ReplyMode.AGAIN


def test_fresh_auto_takes_the_step_without_an_overdue_client_and_drops_its_late_push():
    """Three clients at 1.0 a push (a timed round); then 1 and 2 push at 11 and wait, and
    3, down, never pushes: at overdue 2 the step waits for it until 12 (`wake_at`), then
    goes without it. Its late push, computed at version 1, is dropped and answered with
    the new weights."""
    from paramserver.handler import handle, release
    from paramserver.wire.protocol import Message, Pull

    now = [0.0]
    state = fresh_state(3, lambda: now[0], fresh_reply="auto", overdue=2.0, server_momentum=0.0, weight_decay=0.0)
    reply = state.reply
    for rank in (1, 2, 3):
        handle(state, Message(rank, Tag.PULL, Pull()))
    now[0] = 1.0
    for rank in (1, 2, 3):  # the first round: every one waits; the third completes it
        gradient(state, rank, 1)
    assert state.store.version == 1 and reply.pace.compute == {1: 1.0, 2: 1.0, 3: 1.0}
    now[0] = 2.0
    assert gradient(state, 1, 2)[0] == [] and gradient(state, 2, 2)[0] == [] and reply.deferred == [1, 2]
    assert reply.wake_at(state) == 3.0 and not reply.release_due(state, overdue=True)
    assert release(state, overdue=True) == ([], [])
    now[0] = 3.0
    assert not reply.release_due(state) and release(state) == ([], [])  # only a driver's wake-up counts 3 out
    replies, _ = release(state, overdue=True)
    assert [(r.dest, r.header.version) for r in replies] == [(1, 2), (2, 2)] and reply.deferred == []
    assert state.store.weights.tolist() == [-1.75] * 4  # -1 (the mean 2 of 1, 2, 3) - 0.5 x the mean 1.5 of 1, 2
    [reply], events = gradient(state, 3, 2)
    assert (reply.dest, reply.header.version) == (3, 2) and type(events[0]).__name__ == "Dropped"
    assert state.store.applied == {0: 2, 1: 2, 2: 1} and state.store.dropped == {2: 1}


def test_fresh_auto_steps_without_a_lost_client_and_the_others_wait_instead_of_computing_again():
    """Three clients at 1.0 a push (a timed round); client 3 is lost (`continue`). The step
    was sized for three: computing again for its share, 1 and 2 would both push again, the
    first of the two take the step and the other's push, a step late, be dropped (every
    round). They wait instead, and each round is a step of their two pushes."""
    from paramserver import membership
    from paramserver.handler import handle
    from paramserver.wire.protocol import Message, Pull

    now = [0.0]
    state = fresh_state(3, lambda: now[0], fresh_reply="auto", server_momentum=0.0, weight_decay=0.0)
    for rank in (1, 2, 3):
        handle(state, Message(rank, Tag.PULL, Pull()))
    now[0] = 1.0
    for rank in (1, 2, 3):
        gradient(state, rank, 1)
    membership.lose(state, 3, "ClientDied: test")
    for step in (2, 3, 4):
        now[0] = float(step)
        assert gradient(state, 1, step)[0] == [] and state.reply.deferred == [1]
        replies, _ = gradient(state, 2, step)  # every client running waits: the step, released
        assert [(r.dest, r.header.version) for r in replies] == [(1, step), (2, step)]
    assert state.store.dropped == {} and state.store.applied == {0: 4, 1: 4, 2: 1}


def test_overdue_is_off_at_0_and_no_factor_below_1():
    import pytest

    from runconfig.settings import ConfigError, RunConfig

    assert fresh_state(2, fresh_reply="auto", overdue=0).reply.pace.wake_at([1]) is None
    with pytest.raises(ConfigError, match=r"overdue: must be 0 \(off\) or a factor of at least 1"):
        RunConfig(overdue=0.5)
    assert RunConfig(overdue=1.5).overdue == 1.5


def test_a_checkpoint_waits_for_every_clients_optimizer_state_and_no_client_waits_for_it():
    """Where the clients' optimizer keeps state, the snapshot at the due version goes out
    at once, the replies from then on ask for the state, and the checkpoint is taken once
    each client's last push (or STOP) came after its STATE of that step; a STATE of
    another step does not count. Every push is answered at once all the while."""
    import numpy as np

    from paramserver.events import CheckpointDue, SnapshotDue
    from paramserver.handler import handle
    from paramserver.state import ServerState
    from paramserver.rules import make_rule
    from paramserver.store import Store
    from paramserver.wire.protocol import Message, Pull, Push, State, Stop

    state = ServerState(Store(np.zeros(4, np.float32), make_rule("add", RunConfig())), [1, 2], eval_every=2,
                        collects_states=True)
    moment = {rank: np.full(3, float(rank), np.float32) for rank in (1, 2)}

    def push(rank: int, step: int, with_state: int | None = None):
        if with_state is not None:
            assert handle(state, Message(rank, Tag.STATE, State(with_state, {"m": moment[rank]}))) == ([], [])
        replies, events = handle(state, Message(rank, Tag.PUSH, Push(step, 4, True), np.ones(4, np.float32)))
        [reply] = replies  # answered at once, whatever the checkpoint waits for
        return reply.header.state, [e for e in events if isinstance(e, (SnapshotDue, CheckpointDue))]

    for rank in (1, 2):
        handle(state, Message(rank, Tag.PULL, Pull()))
    assert push(1, 1) == (False, [])
    assert push(2, 1) == (True, [SnapshotDue(2, checkpoint=False)])  # due: its replies ask for the states
    assert push(1, 2, with_state=2) == (True, [])                    # client 2's is still to come
    assert push(2, 3, with_state=2) == (True, [SnapshotDue(4, checkpoint=False)])  # of step 2, with step 3's push
    assert push(2, 4, with_state=4) == (False, [CheckpointDue(5)])  # each client's last push brought its own
    assert push(1, 3) == (True, [SnapshotDue(6, checkpoint=False)])  # without one: client 1's is stale now
    handle(state, Message(1, Tag.STATE, State(3, {"m": moment[1]})))
    replies, events = handle(state, Message(1, Tag.STOP, Stop(3, 3)))  # a STOP brings the state too
    assert events == [CheckpointDue(6)] and not state.checkpoint_due
    assert {c: s.step for c, s in state.client_states.items()} == {0: 3, 1: 4}
    assert state.tally.client_steps.tolist() == [3, 4]  # the steps the checkpoint records for them


def test_a_malformed_state_is_rejected_and_never_reaches_a_checkpoint():
    import numpy as np

    from paramserver.events import Rejected
    from paramserver.handler import handle
    from paramserver.state import ServerState
    from paramserver.rules import make_rule
    from paramserver.store import Store
    from paramserver.wire.protocol import Message, State

    state = ServerState(Store(np.zeros(4, np.float32), make_rule("add", RunConfig())), [1], collects_states=True)
    for bad in (State(1, {"m": np.array([object()])}), State("1", {}), State(1, [np.zeros(2)]), State(1, {3: np.zeros(2)})):
        [], [event] = handle(state, Message(1, Tag.STATE, bad))
        assert isinstance(event, Rejected) and "malformed" in event.reason
    assert state.arrived_states == {} and state.tally.rejected == 4


@pytest.mark.parametrize("spin", [True, False])
def test_a_server_that_shares_its_cores_waits_without_spinning(tmp_path, spin):
    """With a core of its own the server polls closely for the next message and the
    reply in flight; sharing the cores with clients it goes straight to sleeping polls."""
    import numpy as np

    from paramserver.drivers.server import ServerLoop
    from paramserver.wire.protocol import Message, Pull, Stop
    from tests.conftest import make_server

    server = make_server(tmp_path / "run", np.zeros(4, np.float32), clients=1)
    busy, messages = [], [Message(1, Tag.PULL, Pull()), Message(1, Tag.STOP, Stop(0, 0))]

    class Link:
        def recv(self, timeout, **options):
            busy.append(options["busy"])
            return messages.pop(0)

        def post(self, dest, tag, header, payload):
            return []

        def complete(self, requests, peers, nbytes, timeout):
            return []

    ServerLoop(Link(), server.state, server.recorder, clock=lambda: 0.0, stall_timeout=60.0, spin=spin).serve()
    server.recorder.close()
    assert busy == ([1e-3, 1e-3 + 16 / 1e9] if spin else [0.0, 0.0])  # the PULL's reply, 16 bytes, in flight


def test_a_reply_stuck_for_the_stall_timeout_loses_only_its_client(tmp_path):
    """A reply to a client whose host's link was cut holds the server for the whole stall
    timeout; that wait is not the other clients' silence, so under `continue` only the
    stuck client is lost (each other one was written off at once before)."""
    import numpy as np

    from paramserver.drivers.server import ServerLoop
    from paramserver.wire.protocol import Message, PeerTimeout, Pull, Stop
    from tests.conftest import make_server, push

    now = [0.0]
    server = make_server(tmp_path / "run", np.zeros(4, np.float32), clients=3, clock=lambda: now[0])
    messages = [Message(r, Tag.PULL, Pull()) for r in (1, 2, 3)]
    tag, header, payload = push(1, np.ones(4, np.float32))
    messages += [Message(2, tag, header, payload), Message(3, Tag.STOP, Stop(0, 0)), Message(2, Tag.STOP, Stop(1, 1))]

    class Link:
        def recv(self, timeout, **options):
            assert timeout > 0
            return messages.pop(0)

        def post(self, dest, tag, header, payload):
            return [dest]

        def complete(self, requests, peers, nbytes, timeout):
            if requests == [1]:  # rank 1's reply never goes out: the server waits it out
                now[0] += timeout
                raise PeerTimeout("no transfer with rank 1", (1,))
            return []

    loop = ServerLoop(Link(), server.state, server.recorder, clock=lambda: now[0], stall_timeout=5.0,
                      on_client_failure="continue")
    tally = loop.serve()
    server.recorder.close()
    assert not messages
    assert list(tally.lost) == [1] and tally.stops == {3: Stop(0, 0), 2: Stop(1, 1)}


def test_before_a_push_the_server_finishes_only_the_replies_that_read_the_weights_in_place(tmp_path):
    """A copied reply (a streamed fragment's answer, which its client takes only at its next
    fragment boundary) goes on while the next push is applied, forgotten once out; one that
    reads the weights in place (or whose link does not say) is finished first; at the end,
    every one."""
    import numpy as np

    from paramserver.drivers.server import ServerLoop
    from tests.conftest import make_server

    server = make_server(tmp_path / "run", np.zeros(4, np.float32), clients=3)
    completed = []

    class Sent(list):
        def __init__(self, name, live):
            super().__init__([name])
            self.live = live

    class Link:
        def done(self, requests):
            return requests[0] == "copy, out"

        def complete(self, requests, peers, nbytes, timeout):
            completed.append(requests[0])
            return []

    loop = ServerLoop(Link(), server.state, server.recorder, clock=lambda: 0.0, stall_timeout=5.0)
    loop.in_flight = [(1, Sent("in place", True), 16), (2, Sent("copy, out", False), 16),
                      (3, Sent("copy, on its way", False), 16), (1, ["said nothing"], 16)]
    loop.finish_replies(live=True)
    assert completed == ["in place", "said nothing"] and [r[1][0] for r in loop.in_flight] == ["copy, on its way"]
    loop.finish_replies()
    server.recorder.close()
    assert completed[2:] == ["copy, on its way"] and loop.in_flight == []
