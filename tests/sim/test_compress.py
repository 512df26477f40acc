"""Compressed pushes and pulls: 16-bit floats on the wire, float32 on the server."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from paramserver.compress import BFloat16, ErrorFeedback, Float16, make_codec
from tests.sim.test_sim import rows, sim

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


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_a_compressed_run_halves_the_wire_and_still_learns(tmp_path, tiny_npz, name):
    flags = ["--clients", "2", "--steps", "60", "--n-sync", "2"]
    plain = sim(tmp_path / "plain", tiny_npz, *flags)
    packed = sim(tmp_path / name, tiny_npz, *flags, "--compress", name)
    plain_summary, summary = (json.loads((run / "summary.json").read_text()) for run in (plain, packed))
    assert summary["pushes_applied"] == plain_summary["pushes_applied"] == 60 and summary["pushes_rejected"] == 0
    for key in ("wire_bytes_pushed", "wire_bytes_pulled"):
        assert summary[key] * 2 == plain_summary[key]
    losses = [r["loss"] for r in rows(packed, "clients")]
    assert np.mean(losses[-20:]) < 0.5 * np.mean(losses[:20])
    assert summary["final_test_error"] <= plain_summary["final_test_error"] + 0.05


def test_a_nan_survives_bf16_and_the_server_rejects_it(served):
    from paramserver.protocol import Push, Tag
    from paramserver.server import Serving

    codec = BFloat16()
    s: Serving = served
    s.codec, s.wire = codec, np.empty(s.store.size, codec.wire)
    push = np.array([np.nan, 0, 0, 0], np.float32)
    s.transport.deliver(s, 1, Tag.PUSH, Push(1, 4, False, codec.dtype), codec.encode(push))
    assert s.store.version == 0 and s.tally.rejected == 1


def test_easgd_pushes_its_weights_compressed_without_error_feedback(tmp_path, tiny_npz):
    """Weights are rounded afresh at every push (no residual to carry); the run learns."""
    flags = ["--clients", "2", "--steps", "40", "--n-sync", "2", "--rule", "easgd"]
    plain = sim(tmp_path / "plain", tiny_npz, *flags)
    packed = sim(tmp_path / "bf16", tiny_npz, *flags, "--compress", "bf16")
    plain_summary, summary = (json.loads((run / "summary.json").read_text()) for run in (plain, packed))
    assert summary["pushes_applied"] == 40 and summary["wire_bytes_pushed"] * 2 == plain_summary["wire_bytes_pushed"]
    assert summary["final_test_error"] <= plain_summary["final_test_error"] + 0.05
