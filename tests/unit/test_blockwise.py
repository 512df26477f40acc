"""The blockwise codecs (`--compress int8`, `int4`): each block's rounding bounded by its
scale, error feedback owing one rounding at most however many pushes went, slices of a
sharded push decoded alone, and malformed compressed pushes refused before the weights.
The 16-bit codecs: tests/unit/test_compress.py; runs: tests/sim/test_compress.py."""
from __future__ import annotations

import numpy as np
import pytest

from paramserver.compute import hostkernel
from paramserver.compute.quantkernel import make_codec as compiled
from paramserver.wire.compress import BLOCK, Blockwise, ErrorFeedback, make_codec
from paramserver.wire.protocol import Push, Tag, shard_bounds

LEVELS = {"int8": 127, "int4": 7}
SIZES = [1, 7, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 77, 206_922]  # the last: the default CNN's


def ragged(n: int, seed: int = 0) -> np.ndarray:
    """Normal values whose blocks differ in magnitude by up to 1e8, one block all zeros."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32)
    blocks = -(-n // BLOCK)
    x *= np.repeat(10.0 ** rng.integers(-6, 3, blocks), BLOCK)[:n].astype(np.float32)
    if blocks > 2:
        x[BLOCK:2 * BLOCK] = 0
    return x


def bound(x: np.ndarray, levels: int) -> np.ndarray:
    """|x - decoded| allowed to each element: half its block's scale (absmax / levels),
    plus float32's part: x * (levels / absmax) is off by 2 roundings (L * 2^-23 of a
    code), the scale by one (L * 2^-24 of a code), and code * scale by one of absmax."""
    pad = (-x.size) % BLOCK
    absmax = np.abs(np.concatenate([x, np.zeros(pad, np.float32)])).reshape(-1, BLOCK).max(axis=1).astype(np.float64)
    scale = absmax / levels
    per_block = scale * (0.5 + levels * 2.0 ** -22) + absmax * 2.0 ** -23
    return np.repeat(per_block, BLOCK)[:x.size]


@pytest.mark.parametrize("name", ["int8", "int4"])
@pytest.mark.parametrize("n", SIZES)
def test_each_element_is_within_half_its_blocks_scale(name, n):
    codec = make_codec(name)
    x = ragged(n, seed=n)
    data = codec.encode(x)
    decoded = codec.decode(data, np.empty(n, np.float32))
    assert data.dtype == np.uint8 and data.size == codec.wire_size(n)
    error = np.abs(x.astype(np.float64) - decoded)
    assert np.all(error <= bound(x, LEVELS[name]))
    # the scale each block carries is its absmax / levels, as float32 divides
    first = x[:min(n, BLOCK)]
    assert data[:4].view(np.float32)[0] == np.float32(np.abs(first).max()) / np.float32(LEVELS[name])
    if n > 2 * BLOCK:
        assert np.all(decoded[BLOCK:2 * BLOCK] == 0)  # a zero block decodes to zeros exactly


@pytest.mark.skipif(not hostkernel.available(), reason="no g++: numpy's codec runs")
@pytest.mark.parametrize("name", ["int8", "int4"])
def test_the_compiled_codec_gives_numpys_bytes(name):
    """The same arithmetic in the same order: the same records, decodes and residuals."""
    fast, slow = compiled(name), make_codec(name)
    assert fast.kernel is not None and slow.kernel is None
    for n in SIZES:
        x = ragged(n, seed=n + 1)
        data = fast.encode(x)
        np.testing.assert_array_equal(data, slow.encode(x))
        np.testing.assert_array_equal(fast.decode(data, np.empty(n, np.float32)),
                                      slow.decode(data, np.empty(n, np.float32)))
        fed = [ErrorFeedback(codec, n) for codec in (fast, slow)]
        for f in fed:
            f.residual[:] = ragged(n, seed=n + 2) * 1e-2
        for k in range(3):
            np.testing.assert_array_equal(*(f.encode(x * (k + 1)) for f in fed))
            np.testing.assert_array_equal(fed[0].residual, fed[1].residual)
    x = ragged(3 * BLOCK)
    x[[5, BLOCK + 7]] = np.nan, np.inf  # the scales say so alike; the codes of those blocks do not matter
    for codec in (fast, slow):
        decoded = codec.decode(codec.encode(x), np.empty_like(x))
        assert not np.isfinite(decoded[:2 * BLOCK]).any() and np.isfinite(decoded[2 * BLOCK:]).all()


def test_the_codes_reach_both_ends_and_int4_packs_two_a_byte():
    # a whole block from -1 to 1 and an odd partial one
    x = np.concatenate([np.linspace(-1, 1, BLOCK), [0.5, -0.25, 1]]).astype(np.float32)
    int8, int4 = Blockwise(8), Blockwise(4)
    assert int8.wire_size(x.size) == 4 + BLOCK + 4 + 3 and int4.wire_size(x.size) == 4 + BLOCK // 2 + 4 + 2
    codes8 = int8.encode(x)[4:4 + BLOCK].view(np.int8)
    assert (codes8.min(), codes8.max()) == (-127, 127)
    nibbles = int4.encode(x)[4:4 + BLOCK // 2]
    assert (nibbles & 15).min() == 1 and (nibbles >> 4).max() == 15  # -7 and 7, stored + 8
    np.testing.assert_array_equal(int4.decode(int4.encode(x), np.empty_like(x))[[0, BLOCK - 1, -1]], [-1, 1, 1])


@pytest.mark.parametrize("name, most", [("int8", 0.27), ("int4", 0.15)])
def test_the_wire_carries_the_targets_share_of_float32s_bytes(name, most):
    codec, n = make_codec(name), 206_922
    ratio = codec.wire_size(n) / (4 * n)
    assert ratio <= most
    assert ratio == pytest.approx((1 if name == "int8" else 0.5) / 4 + 1 / BLOCK, abs=1e-4)  # the scale: 4 / B bytes


@pytest.mark.parametrize("name", ["int8", "int4"])
def test_a_nan_or_inf_makes_its_block_not_finite_and_leaves_the_others(name):
    codec = make_codec(name)
    for bad in (np.nan, np.inf, -np.inf):
        x = ragged(3 * BLOCK, seed=1)
        x[BLOCK + 5] = bad
        decoded = codec.decode(codec.encode(x), np.empty_like(x))
        assert not np.isfinite(decoded[BLOCK:2 * BLOCK]).all()  # the server rejects the push
        assert np.isfinite(decoded[:BLOCK]).all() and np.isfinite(decoded[2 * BLOCK:]).all()


@pytest.mark.parametrize("name", ["int8", "int4"])
@pytest.mark.parametrize("servers", [1, 2, 3, 5])
def test_each_servers_slice_decodes_alone_to_the_whole_pushs_part(name, servers):
    codec, n = make_codec(name), 5 * BLOCK + 99
    x = ragged(n, seed=servers)
    data, whole = codec.encode(x), codec.decode(codec.encode(x), np.empty(n, np.float32))
    bounds = shard_bounds(n, servers, codec.block)
    assert bounds[0][0] == 0 and bounds[-1][1] == n and all(lo % BLOCK == 0 for lo, _ in bounds)
    for (lo, hi), (wlo, whi) in zip(bounds, codec.wire_bounds(bounds)):
        assert whi - wlo == codec.wire_size(hi - lo)  # what the slice's server expects
        np.testing.assert_array_equal(codec.decode(data[wlo:whi], np.empty(hi - lo, np.float32)), whole[lo:hi])


def test_shard_bounds_without_a_block_are_as_before():
    for size, servers in [(10, 3), (206_922, 4), (5, 5), (7, 2)]:
        edges = [size * s // servers for s in range(servers + 1)]
        assert shard_bounds(size, servers) == list(zip(edges[:-1], edges[1:]))


@pytest.mark.parametrize("name", ["int8", "int4"])
def test_error_feedback_owes_one_rounding_however_many_pushes_went(name):
    """The sum of what arrives tracks the sum meant: after every push they differ by the
    residual, one push's rounding (half a block's scale an element), not a sum of them;
    without feedback the difference grows with the pushes."""
    codec, n, count = make_codec(name), 3 * BLOCK + 10, 1000
    rng = np.random.default_rng(2)
    pushes = [(rng.standard_normal(n) * 1e-3 + 2e-4).astype(np.float32) for _ in range(count)]  # a drift too
    # float32's part: each push + residual is rounded once, |.| <= 2 * largest, 2^-24 of it a push
    arithmetic = count * 2 * max(float(np.abs(p).max()) for p in pushes) * 2.0 ** -24
    feedback, out = ErrorFeedback(codec, n), np.empty(n, np.float32)
    sent, delivered, plain = (np.zeros(n, np.float64) for _ in range(3))
    for p in pushes:
        total = p + feedback.residual
        delivered += codec.decode(feedback.encode(p), out)
        plain += codec.decode(codec.encode(p), out)
        sent += p
        assert np.all(np.abs(sent - delivered) <= bound(total, LEVELS[name]) + arithmetic)
    np.testing.assert_allclose(delivered + feedback.residual, sent, rtol=0, atol=arithmetic)
    assert np.abs(sent - plain).max() > 10 * np.abs(sent - delivered).max()  # the test can tell


def _server(tmp_path, codec):
    from runconfig.settings import RunConfig
    from paramserver.state import ServerState
    from paramserver.drivers.inprocess import InProcess
    from paramserver.recorder import Recorder
    from paramserver.rules import make_rule
    from paramserver.store import Store
    from rundir.layout import RunDir

    run = RunDir(tmp_path / "run")
    run.create()
    weights = np.arange(2 * BLOCK + 10, dtype=np.float32)
    state = ServerState(Store(weights, make_rule("add", RunConfig())), [1], codec=codec)
    return InProcess(state, Recorder(run, state, lambda: 0.0))


@pytest.mark.parametrize("make", [make_codec, compiled], ids=["numpy", "compiled"])
@pytest.mark.parametrize("name", ["int8", "int4"])
def test_a_malformed_compressed_push_is_refused_before_the_weights(tmp_path, name, make):
    codec = make(name)
    server = _server(tmp_path, codec)
    state, size = server.state, 2 * BLOCK + 10
    before = state.store.weights.copy()
    good = codec.encode(np.full(size, 0.5, np.float32))
    record = codec.record
    nan_scale, inf_scale = good.copy(), good.copy()
    nan_scale[record:record + 4].view(np.float32)[0] = np.nan  # the second block's scale
    inf_scale[:4].view(np.float32)[0] = np.inf
    wrong = {
        "one byte short": (good[:-1], codec.dtype, good.size - 1),
        "truncated to a block": (good[:record], codec.dtype, record),
        "one byte long": (np.append(good, np.uint8(0)), codec.dtype, good.size + 1),
        "header says more than came": (good[:-1], codec.dtype, good.size),
        "the other codec's name": (good, "int4" if name == "int8" else "int8", good.size),
        "float32 as said": (np.ones(size, np.float32), "float32", size),
        "a NaN scale": (nan_scale, codec.dtype, good.size),
        "an Inf scale": (inf_scale, codec.dtype, good.size),
    }
    try:
        for step, (why, (payload, dtype, length)) in enumerate(wrong.items(), start=1):
            server.deliver(1, Tag.PUSH, Push(step, length, False, dtype), payload)
            assert state.store.version == 0, why
            np.testing.assert_array_equal(state.store.weights, before, err_msg=why)  # untouched
        assert state.tally.rejected == len(wrong)
        server.deliver(1, Tag.PUSH, Push(len(wrong) + 1, good.size, False, codec.dtype), good)
        assert state.store.version == 1
        np.testing.assert_allclose(state.store.weights, before + 0.5, rtol=1e-6)  # 0.5 is a code exactly
    finally:
        server.recorder.close()


@pytest.mark.skipif(not hostkernel.available(), reason="no g++: nothing compiled to compare")
def test_the_codec_study_times_both_sides():
    """bench/studies/codecs.py, small: both sides timed, a ratio each codec (a measurement,
    printed, never asserted on)."""
    from bench.studies import codecs

    results = codecs.measure(size=1000, trials=2, repeats=1)
    assert set(results) == {"int8", "int4"}
    assert all(len(r["ours"]) == len(r["other"]) == 2 and r["ratio"] > 0 for r in results.values())
