"""The server's message handler, in one process. Bad messages (rejected, logged, harmless)
are in tests/reliability/test_messages.py."""
from __future__ import annotations

import pytest

from paramserver.protocol import Fail, Tag
from paramserver.handler import ClientFailed


def test_fail_from_a_client_ends_the_job(served):
    with pytest.raises(ClientFailed, match="failed: boom"):
        served.deliver(1, Tag.FAIL, Fail("boom"))


def test_handle_returns_replies_and_events_and_touches_no_disk():
    """The handler has no run directory to write to: what it did comes back as events."""
    import numpy as np

    from paramserver.handler import Applied, ClientRows, ServerState, SnapshotDue, handle
    from paramserver.protocol import Message, Pull, Push
    from paramserver.rules import make_rule
    from paramserver.store import Store

    state = ServerState(Store(np.zeros(4, np.float32), make_rule("add")), [1], eval_every=1, apply_cost=0.5)
    [reply], events = handle(state, Message(1, Tag.PULL, Pull()))
    assert (reply.dest, reply.header.version, events) == (1, 0, [])
    row = {"client": 0, "step": 1, "loss": 1.0, "samples": 8}
    replies, events = handle(state, Message(1, Tag.PUSH, Push(1, 4, False, rows=(row,)), np.ones(4, np.float32)))
    assert replies == []
    assert events == [Applied(0, 1, 0, 0.5), ClientRows([{**row, "version_pulled": 0, "staleness": 0}], 1),
                      SnapshotDue(1)]
    assert (state.tally.minibatches, state.tally.samples, state.wire_bytes) == (1, 8, [16, 16])


def test_recorder_writes_what_was_true_when_the_snapshot_was_due(tmp_path, monkeypatch):
    """Snapshots and checkpoints are written on a thread, from copies taken at the event:
    weights changed before the thread writes do not leak into them."""
    import threading

    import numpy as np

    import paramserver.recorder
    from paramserver.checkpoint import Checkpoint
    from paramserver.runlog import load_arrays
    from tests.conftest import make_server, push

    changed, write = threading.Event(), paramserver.recorder._write
    monkeypatch.setattr(paramserver.recorder, "_write", lambda *args: (changed.wait(10), write(*args)))
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
