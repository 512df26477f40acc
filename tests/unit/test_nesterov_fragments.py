"""Streamed fragments under delayed Nesterov (`--rule nesterov --fragments P`, Streaming
DiLoCo's setting): the rule keeps its pushes' sum, its momentum and its round count per
slice, so a run with fragments is P delayed-Nesterov rules side by side, one a slice,
each stepping its momentum after N pushes of its own slice. Held here to that oracle (P
Stores of the slices' lengths, whole pushes) bit for bit on every apply path, through
the handler with and without int8, across a client's last whole push and a checkpoint.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from paramserver.compute import fused, hostkernel
from paramserver.compute.quantkernel import make_codec
from paramserver.drivers.inprocess import InProcess
from paramserver.recorder import Recorder
from paramserver.rules import make_rule
from paramserver.state import ServerState
from paramserver.store import Store
from paramserver.wire.compress import BLOCK
from paramserver.wire.protocol import Push, Tag, shard_bounds
from rundir.layout import RunDir
from runconfig.settings import RunConfig

SIZE = 3 * BLOCK + 7  # pieces of whole blocks, the last one ragged
P, N, K = 4, 3, 2
ALL = slice(0, SIZE)
# asynchronous DiLoCo's outer step with the look-ahead spread over the round (c > 0)
DILOCO = RunConfig(rule="nesterov", nesterov_every=N, outer_lr=0.7, nesterov_momentum=0.9, nesterov_activation=0.25)
PLAIN = RunConfig(rule="nesterov", nesterov_every=N, nesterov_momentum=0.8, outer_lr=1.0)
HOST = pytest.param("host", marks=pytest.mark.skipif(not hostkernel.available(), reason="needs g++"))


def store(part: slice, settings: RunConfig, path: str) -> Store:
    """A Store of the weights' `part` on the apply path `path`: the torch rule, the
    formulas as a GPU server's double-buffered kernel runs them (in numpy), or the host's
    compiled kernel."""
    start = np.linspace(-1, 1, SIZE, dtype=np.float32)[part]
    made = Store(start, make_rule("nesterov", settings, K), kernel="torch" if path != "host" else "auto")
    if path == "numpy":
        made.fused = fused.Fused(made.rule, fused.numpy_kernel)
    return made


def pieces(block: int = 1) -> list[slice]:
    return [slice(lo, hi) for lo, hi in shard_bounds(SIZE, P, block)]


def oracle(settings: RunConfig, path: str) -> list[Store]:
    """One Store a slice, each as long as its slice: what the P slices' rules must be."""
    return [store(s, settings, path) for s in pieces()]


def same(streamed: Store, slices: list[Store]) -> None:
    """The weights and the rule's vectors equal the slices' side by side, bit for bit."""
    np.testing.assert_array_equal(streamed.weights, np.concatenate([s.weights for s in slices]))
    for name in ("total", "momentum"):
        made = [s.rule.state().get(name) for s in slices]
        mine = streamed.rule.state()[name].numpy()
        np.testing.assert_array_equal(mine, np.concatenate([torch.zeros(s.size) if m is None else m.numpy()
                                                            for s, m in zip(slices, made)]), err_msg=name)


@pytest.mark.parametrize("settings", [PLAIN, DILOCO], ids=["plain", "diloco"])
@pytest.mark.parametrize("path", ["torch", "numpy", HOST])
def test_fragments_staggered_are_p_rules_side_by_side(settings, path):
    """Fragments sent staggered (slice p's k-th push after slice p+1's k-1-th, as clients
    stream them), with whole pushes between (a client's last): every slice takes its own
    pushes in its own order, its momentum step after its own N-th; so each apply leaves
    the weights and the state as P separate rules would, bit for bit (each element's
    arithmetic is the whole rule's there; a slice that has not stepped yet reads a
    momentum of zeros, adding +0)."""
    rng, parts = np.random.default_rng(0), pieces()
    streamed, slices = store(ALL, settings, path), oracle(settings, path)
    events = sorted([(k + p, p, k) for k in range(3 * N) for p in range(P)])
    for i, (_, p, k) in enumerate(events):
        d = (rng.standard_normal(SIZE) * 1e-2).astype(np.float32)
        client = k % K
        if i % 7 == 6:  # a whole push: a push of every slice
            assert streamed.apply(client, d, pieces=tuple(parts)).accepted
            for s, part in zip(slices, parts):
                s.apply(client, d[part])
        else:
            assert streamed.apply(client, d[parts[p]], piece=parts[p], pieces=tuple(parts)).accepted
            slices[p].apply(client, d[parts[p]])
        same(streamed, slices)
    assert streamed.version == len(events)  # a fragment, or a whole push, is one version
    assert streamed.rule.counts == {s.start: o.rule.count for s, o in zip(parts, slices)}
    assert streamed.rule.round_left == 0  # with fragments no round is held for


@pytest.mark.parametrize("path", ["torch", HOST])
def test_per_slice_state_survives_a_checkpoint_exactly(path):
    """Saved mid-round, each slice at its own count, and loaded into a fresh Store: the
    pushes after it land as they do in the Store that went on."""
    rng, parts = np.random.default_rng(1), tuple(pieces())
    went_on = store(ALL, DILOCO, path)
    pushes = [(rng.standard_normal(SIZE) * 1e-2).astype(np.float32) for _ in range(3 * N)]
    for k, d in enumerate(pushes[:N + 1]):
        part = parts[k % P]
        went_on.apply(0, d[part], piece=part, pieces=parts)
    arrays = went_on.state()
    assert {f"rule_scalar.count.{s.start}" for s in parts} <= set(arrays)
    resumed = store(ALL, DILOCO, path)
    resumed.load_state(arrays)
    for k, d in enumerate(pushes[N + 1:]):
        part = parts[(k + 2) % P]
        for s in (went_on, resumed):
            s.apply(1, d[part], piece=part, pieces=parts)
    np.testing.assert_array_equal(resumed.weights, went_on.weights)
    assert resumed.rule.counts == went_on.rule.counts and resumed.state().keys() == arrays.keys()


def test_a_whole_push_with_a_nan_under_fragments_touches_no_slice():
    """Applied slice by slice, it is checked whole first: a NaN in its last slice
    leaves every slice's weights and state as they were."""
    parts = tuple(pieces())
    streamed = store(ALL, DILOCO, "host" if hostkernel.available() else "torch")
    streamed.apply(0, np.full(SIZE, 1e-2, np.float32), pieces=parts)
    before = {k: v.copy() for k, v in streamed.state().items()}
    bad = np.full(SIZE, 1e-2, np.float32)
    bad[-1] = np.nan
    assert not streamed.apply(0, bad, pieces=parts).accepted
    for key, value in streamed.state().items():
        np.testing.assert_array_equal(value, before[key], err_msg=key)


def _server(tmp_path, name: str, fragments: int, compress: str) -> InProcess:
    run = RunDir(tmp_path / name)
    run.create()
    weights = np.linspace(-1, 1, SIZE, dtype=np.float32)
    state = ServerState(Store(weights, make_rule("nesterov", DILOCO, K)), [1, 2], codec=make_codec(compress),
                        fragments=fragments)
    return InProcess(state, Recorder(run, state, lambda: 0.0))


@pytest.mark.parametrize("compress", ["none", "int8"])
def test_each_slice_pushed_n_times_makes_the_whole_pushes(tmp_path, compress):
    """Through the handler: N rounds of P fragments (two clients in turn), each fragment
    at its offset, leave the weights where N rounds of whole pushes do, bit for bit: every
    slice's momentum stepped at its own N-th push, as the whole's did at its N-th; each
    answer is that slice, and the fragment's round is never held for."""
    codec = make_codec(compress)
    whole, streamed = _server(tmp_path, "whole", 1, compress), _server(tmp_path, "streamed", P, compress)
    rng = np.random.default_rng(2)
    try:
        for k in range(2 * N):
            d = (rng.standard_normal(SIZE) * 1e-2).astype(np.float32)
            rank = 1 + k % K
            whole.deliver(rank, Tag.PUSH, Push(k + 1, codec.wire_size(SIZE), False, codec.dtype), codec.encode(d))
            for p, (lo, hi) in enumerate(streamed.state.pieces):
                data = codec.encode(d[lo:hi])
                (reply,) = streamed.deliver(rank, Tag.PUSH, Push(k + 1, data.size, True, codec.dtype, fragment=p,
                                                                 offset=lo), data)
                assert reply.header.fragment == p
                np.testing.assert_array_equal(reply.payload, streamed.state.store.weights[lo:hi])
        np.testing.assert_array_equal(streamed.state.store.weights, whole.state.store.weights)
        assert streamed.state.store.version == P * whole.state.store.version
        assert streamed.state.tally.rejected == 0
    finally:
        whole.recorder.close()
        streamed.recorder.close()


def test_a_malformed_fragment_leaves_the_weights_and_the_rounds_as_they_were(tmp_path):
    server = _server(tmp_path, "run", P, "none")
    state = server.state
    (lo, hi), (lo1, _) = state.pieces[0], state.pieces[1]
    good = np.full(hi - lo, 0.5, np.float32)
    try:
        server.deliver(1, Tag.PUSH, Push(1, good.size, False, fragment=0, offset=lo), good)
        before = {k: v.copy() for k, v in state.store.state().items() if k == "weights" or k.startswith("rule")}
        for header, payload in [(Push(2, good.size, True, fragment=P, offset=lo), good),
                                (Push(3, good.size, True, fragment=0, offset=lo1), good),
                                (Push(4, good.size - 1, True, fragment=0, offset=lo), good[:-1])]:
            server.deliver(1, Tag.PUSH, header, payload)
        assert state.tally.rejected == 3 and state.store.version == 1
        for key, value in before.items():  # the counts (rule_scalar.count.*) among them
            np.testing.assert_array_equal(state.store.state()[key], value, err_msg=key)
    finally:
        server.recorder.close()
