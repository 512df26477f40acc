"""Streamed fragments (`fragments`): a push in P slices, each applied to its slice of the
server's weights as it arrives (paramserver/handler.py's `_piece`, the Store's `piece`),
answered with that slice; a malformed fragment never reaches the weights; a client that
merges a slice's answer keeps the work done since it pushed it (clients/client.py); and
the settings where fragments have no meaning are refused in one line."""
from __future__ import annotations

import numpy as np
import pytest

from paramserver.compute.quantkernel import make_codec
from paramserver.drivers.inprocess import InProcess
from paramserver.recorder import Recorder
from paramserver.rules import make_rule
from paramserver.state import ServerState
from paramserver.store import Store
from paramserver.wire.compress import BLOCK, Codec
from paramserver.wire.protocol import Push, Tag, shard_bounds
from rundir.layout import RunDir
from runconfig.settings import ConfigError, RunConfig

SIZE = 3 * BLOCK + 7  # pieces of whole blocks, the last one ragged


def _server(tmp_path, name: str, fragments: int, codec: Codec | None = None, rule: str = "add") -> InProcess:
    run = RunDir(tmp_path / name)
    run.create()
    weights = np.linspace(-1, 1, SIZE, dtype=np.float32)
    store = Store(weights, make_rule(rule, RunConfig(rule=rule), clients=2))
    state = ServerState(store, [1, 2], codec=codec or Codec(), fragments=fragments)
    return InProcess(state, Recorder(run, state, lambda: 0.0))


@pytest.mark.parametrize("rule", ["add", "scaled", "staleness"])
@pytest.mark.parametrize("compress", ["none", "int8"])
def test_p_fragments_at_their_offsets_make_the_whole_push(tmp_path, rule, compress):
    """The P fragments of one change, each pushed at its offset, leave the weights as the
    one whole push does, bit for bit (the rules are elementwise: a slice's arithmetic is
    the whole's there); each answer is that slice of the weights, at one version more."""
    codec = make_codec(compress)
    whole, streamed = _server(tmp_path, "whole", 1, codec, rule), _server(tmp_path, "streamed", 4, codec, rule)
    d = np.random.default_rng(0).standard_normal(SIZE).astype(np.float32) * 1e-2
    try:
        whole.deliver(1, Tag.PUSH, Push(4, codec.wire_size(SIZE), True, codec.dtype), codec.encode(d))
        pieces = shard_bounds(SIZE, 4, codec.block)
        assert all(lo % codec.block == 0 for lo, _ in pieces) and pieces[-1][1] == SIZE
        for p, (lo, hi) in enumerate(pieces):
            data = codec.encode(d[lo:hi])
            (reply,) = streamed.deliver(1, Tag.PUSH, Push(p + 1, data.size, True, codec.dtype, fragment=p, offset=lo),
                                        data)
            assert (reply.header.fragment, reply.header.version) == (p, p + 1)
            np.testing.assert_array_equal(reply.payload, streamed.state.store.weights[lo:hi])
        np.testing.assert_array_equal(streamed.state.store.weights, whole.state.store.weights)
        assert streamed.state.tally.rejected == 0
    finally:
        whole.recorder.close()
        streamed.recorder.close()


def test_a_malformed_fragment_is_refused_without_touching_the_weights(tmp_path):
    server = _server(tmp_path, "run", 4)
    state = server.state
    before = state.store.weights.copy()
    (lo, hi), (lo1, _) = state.pieces[0], state.pieces[1]
    good = np.full(hi - lo, 0.5, np.float32)
    wrong = {
        "an index past the fragments": (Push(1, good.size, True, fragment=4, offset=lo), good),
        "a negative index": (Push(2, good.size, True, fragment=-2, offset=lo), good),
        "another fragment's offset": (Push(3, good.size, True, fragment=0, offset=lo1), good),
        "one element short": (Push(4, good.size - 1, True, fragment=0, offset=lo), good[:-1]),
        "the whole vector's length": (Push(5, SIZE, True, fragment=0, offset=lo), np.ones(SIZE, np.float32)),
    }
    try:
        for why, (header, payload) in wrong.items():
            server.deliver(1, Tag.PUSH, header, payload)
            assert state.store.version == 0, why
            np.testing.assert_array_equal(state.store.weights, before, err_msg=why)
        assert state.tally.rejected == len(wrong)
        server.deliver(1, Tag.PUSH, Push(9, good.size, False, fragment=0, offset=lo), good)
        assert state.store.version == 1
        np.testing.assert_array_equal(state.store.weights[hi:], before[hi:])  # only its slice moved
    finally:
        server.recorder.close()
    whole_run = _server(tmp_path, "whole", 1)  # a fragment where the run streams none
    try:
        whole_run.deliver(1, Tag.PUSH, Push(1, good.size, True, fragment=0, offset=0), good)
        assert whole_run.state.store.version == 0 and whole_run.state.tally.rejected == 1
    finally:
        whole_run.recorder.close()


@pytest.mark.parametrize("flags,says", [
    ({"mode": "sync"}, "needs --mode async"),
    ({"mode": "local-sgd"}, "needs --mode async"),
    ({"rule": "fresh"}, "slice by slice"),
    ({"rule": "nesterov", "nesterov_reply": "round"}, "not with nesterov_reply round"),
    ({"rule": "easgd"}, "slice by slice"),
    ({"n_sync": 2}, "must be a multiple"),
    ({"n_sync": 6}, "must be a multiple"),
    ({"n_fetch": 4}, "n_fetch = n_push"),
    ({"dylu": True}, "not with dylu"),
])
def test_fragments_where_they_have_no_meaning_are_refused(flags, says):
    settings = {"backend": "sim", "rule": "add", "n_sync": 8, "fragments": 4, **flags}
    with pytest.raises(ConfigError, match=says) as refused:
        RunConfig(**settings)
    assert str(refused.value).startswith("fragments: ") and "\n" not in str(refused.value)


def test_nesterov_streams_fragments_answered_now_or_by_the_pace():
    for reply in ("now", "auto"):  # auto: no round is ever held with fragments (NesterovRule.round_left)
        assert RunConfig(backend="sim", rule="nesterov", n_sync=8, fragments=4, nesterov_reply=reply).fragments == 4


def test_fragments_below_one_are_refused_and_one_is_whole_pushes():
    with pytest.raises(ConfigError, match="fragments: must be at least 1"):
        RunConfig(fragments=0)
    assert RunConfig(fragments=1, mode="sync").fragments == 1  # whole pushes: every mode


@pytest.mark.parametrize("rule", ["add", "scaled"])
def test_fragments_on_a_gpu_servers_double_buffered_path_make_the_whole_push(rule):
    """As a GPU server's kernel runs them (`Fused`, in numpy here): a fragment's new
    values are copied back into its slice, never left in a view of the weights kept as
    the next push's spare buffer (which would write another slice's values there)."""
    from paramserver.compute import fused

    def fused_store() -> Store:
        store = Store(np.linspace(-1, 1, SIZE, dtype=np.float32), make_rule(rule, RunConfig(rule=rule), clients=2),
                      kernel="torch")
        store.fused = fused.Fused(store.rule, fused.numpy_kernel)
        return store
    whole, streamed = fused_store(), fused_store()
    rng = np.random.default_rng(3)
    for _ in range(2):
        d = rng.standard_normal(SIZE).astype(np.float32) * 1e-2
        whole.apply(0, d)
        for lo, hi in shard_bounds(SIZE, 4, 1):
            assert streamed.apply(0, d[lo:hi], piece=slice(lo, hi)).accepted
    np.testing.assert_array_equal(streamed.weights, whole.weights)


@pytest.mark.parametrize("backend", ["sim", "mpi"])
@pytest.mark.parametrize("servers", [1, 3])
def test_fragments_stream_over_either_backend_to_one_server_or_several(backend, servers):
    assert RunConfig(backend=backend, rule="add", n_sync=8, fragments=4, servers=servers).fragments == 4
