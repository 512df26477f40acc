"""The server's message handler, in one process: bad messages never touch the weights."""
from __future__ import annotations

import json

import numpy as np
import pytest

from paramserver.inprocess import InProcessLink
from paramserver.protocol import Fail, Pull, Push, Stop, Tag
from paramserver.rules import AddRule
from paramserver.rundir import RunDir
from paramserver.server import ClientFailed, Serving
from paramserver.store import Store


@pytest.fixture
def served(tmp_path):
    run = RunDir(tmp_path / "run")
    run.create()
    store = Store(np.arange(4, dtype=np.float32), AddRule())
    serving = Serving(InProcessLink(), store, run, client_ranks=[1, 2], eval_every=0, stall_timeout=1.0,
                      clock=lambda: 0.0)
    return serving


def push(step: int, payload: np.ndarray, fetch: bool = True, dtype: str = "float32") -> tuple:
    return Tag.PUSH, Push(step, payload.size, fetch, dtype, rows=({"client": 0, "step": step, "loss": 1.0},)), payload


def test_bad_pushes_are_rejected_logged_and_still_answered(served):
    link = served.transport
    link.deliver(served, 1, Tag.PULL, Pull())
    for payload, dtype in [(np.ones(5, np.float32), "float32"), (np.array([1, np.nan, 0, 0], np.float32), "float32"),
                           (np.ones(2, np.float64), "float64")]:
        tag, header, data = push(1, payload, dtype=dtype)
        replies = link.deliver(served, 1, tag, header, data)
        assert len(replies) == 1 and replies[0][1].version == 0  # the client is not left waiting
    np.testing.assert_array_equal(served.store.weights, np.arange(4))
    assert served.store.version == 0 and served.tally.rejected == 3
    served.close()
    rows = [json.loads(line) for line in (served.run.path / "server.jsonl").read_text().splitlines()]
    assert [("rejected" in r) for r in rows] == [True, True, True]
    assert "20 bytes" in rows[0]["rejected"] and "NaN" in rows[1]["rejected"] and "float64" in rows[2]["rejected"]


def test_messages_from_strangers_after_stop_or_malformed_are_dropped(served):
    link = served.transport
    good = np.ones(4, np.float32)
    assert link.deliver(served, 3, *push(1, good)) == []  # rank 3 is not a client
    assert link.deliver(served, 1, Tag.PUSH, Stop(1, 1)) == []  # header does not match the tag
    link.deliver(served, 2, Tag.STOP, Stop(0, 0))
    assert link.deliver(served, 2, *push(1, good)) == []  # after its STOP
    assert link.deliver(served, 2, Tag.STOP, Stop(0, 0)) == []  # a second STOP
    np.testing.assert_array_equal(served.store.weights, np.arange(4))
    assert served.tally.rejected == 4 and not served.done
    link.deliver(served, 1, *push(1, good, fetch=False))
    assert served.store.version == 1
    with pytest.raises(ClientFailed, match="client rank 1 failed: boom"):
        link.deliver(served, 1, Tag.FAIL, Fail("boom"))
