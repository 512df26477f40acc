"""Compressed runs in the simulator: half the bytes on the wire, and they still learn.
The codecs themselves: tests/unit/test_compress.py."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.sim.test_sim import rows, sim


FLAGS = ["--rule", "easgd", "--clients", "2", "--steps", "60", "--n-sync", "2"]


@pytest.fixture(scope="module")
def plain(tmp_path_factory, tiny_npz):
    """The uncompressed run both codecs are held against (one run for the two)."""
    return sim(tmp_path_factory.mktemp("compress") / "plain", tiny_npz, *FLAGS)


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_a_compressed_run_halves_the_wire_and_still_learns(tmp_path, tiny_npz, plain, name):
    packed = sim(tmp_path / name, tiny_npz, *FLAGS, "--compress", name)
    plain_summary, summary = (json.loads((run / "summary.json").read_text()) for run in (plain, packed))
    assert summary["pushes_applied"] == plain_summary["pushes_applied"] == 60 and summary["pushes_rejected"] == 0
    for key in ("wire_bytes_pushed", "wire_bytes_pulled"):
        assert summary[key] * 2 == plain_summary[key]
    losses = [r["loss"] for r in rows(packed, "clients")]
    assert np.mean(losses[-20:]) < 0.5 * np.mean(losses[:20])
    assert summary["final_test_error"] <= plain_summary["final_test_error"] + 0.05


def test_easgd_pushes_its_weights_compressed_without_error_feedback(tmp_path, tiny_npz):
    """Weights are rounded afresh at every push (no residual to carry); the run learns."""
    flags = ["--clients", "2", "--steps", "40", "--n-sync", "2", "--rule", "easgd"]
    plain = sim(tmp_path / "plain", tiny_npz, *flags)
    packed = sim(tmp_path / "bf16", tiny_npz, *flags, "--compress", "bf16")
    plain_summary, summary = (json.loads((run / "summary.json").read_text()) for run in (plain, packed))
    assert summary["pushes_applied"] == 40 and summary["wire_bytes_pushed"] * 2 == plain_summary["wire_bytes_pushed"]
    assert summary["final_test_error"] <= plain_summary["final_test_error"] + 0.05
