"""Compressed pushes and pulls: 16-bit floats on the wire, float32 on the server. The
codecs and the server's check here; compressed runs in tests/sim/test_compress.py."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from paramserver.wire.compress import BFloat16, ErrorFeedback, Float16, make_codec

SPECIAL = np.array([np.nan, np.inf, -np.inf, 3.3e38, -3.3e38, -0.0, 1e-40, 65504, 70000], np.float32)


def vector(n: int = 10_000, seed: int = 0) -> np.ndarray:
    return np.concatenate([SPECIAL, np.random.default_rng(seed).standard_normal(n).astype(np.float32)])


@pytest.mark.parametrize("codec, torch_dtype", [(BFloat16(), torch.bfloat16), (Float16(), torch.float16)])
def test_round_trip_rounds_exactly_as_torch_does(codec, torch_dtype):
    x = vector()
    x[9] = np.frombuffer(np.uint32(0xFFFFFFFF).tobytes(), np.float32)[0]  # a NaN that rounding would wrap
    decoded = codec.decode(codec.encode(x), np.empty_like(x))
    expected = torch.from_numpy(x).to(torch_dtype).float().numpy()
    np.testing.assert_array_equal(decoded, expected)  # NaN where NaN, Inf where Inf, bit for bit otherwise
    assert codec.encode(x).nbytes == x.nbytes // 2


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_error_feedback_delivers_the_whole_update_late_by_one_push_at_most(name):
    codec = make_codec(name)
    feedback, rng = ErrorFeedback(codec, 1000), np.random.default_rng(1)
    pushes = [rng.standard_normal(1000).astype(np.float32) * 1e-3 for _ in range(200)]
    delivered = sum(codec.decode(feedback.encode(p), np.empty(1000, np.float32)).astype(np.float64) for p in pushes)
    sent = sum(p.astype(np.float64) for p in pushes)
    np.testing.assert_allclose(delivered + feedback.residual, sent, rtol=0, atol=1e-8)
    one_push_error = np.abs(codec.decode(codec.encode(pushes[0]), np.empty(1000, np.float32)) - pushes[0]).max()
    assert np.abs(feedback.residual).max() <= 2 * one_push_error  # what is owed stays one rounding's worth


def test_a_nan_survives_bf16_and_the_server_rejects_it(served):
    from paramserver.wire.protocol import Push, Tag

    codec = BFloat16()
    s = served.state
    s.codec, s.landing = codec, np.empty(s.store.size, codec.wire_dtype)
    push = np.array([np.nan, 0, 0, 0], np.float32)
    served.deliver(1, Tag.PUSH, Push(1, 4, False, codec.dtype), codec.encode(push))
    assert s.store.version == 0 and s.tally.rejected == 1
