"""Compressed runs in the simulator: fewer bytes on the wire, counted frame by frame, and
they still learn. The codecs themselves: tests/unit/test_compress.py and
tests/unit/test_blockwise.py."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from paramserver.wire.compress import make_codec
from paramserver.wire.frame import HEADER_BYTES, rows_bytes
from paramserver.wire.protocol import Push
from tests.sim.test_sim import rows, sim


FLAGS = ["--rule", "easgd", "--clients", "2", "--steps", "60", "--n-sync", "2"]
SERVER_KEYS = ("version_pulled", "staleness", "dropped", "rejected")  # what the server adds to a push's last row


def summary_of(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def frame_bytes(run: Path, codec: str, pulls: bool = False, servers: int = 1) -> tuple[int, int]:
    """(pushed, pulled): the frames' bytes a run's pushes and replies took, rebuilt from its
    logs: a push is a header to each server, the codec's payload (in slices) and the rows
    the client sent, to server 0 (its clients.jsonl rows up to the sync point, without what
    the server added); a reply a header from each server and the weights."""
    size = np.load(run / "checkpoint" / "latest.npz")["weights"].size
    clients = sorted({r["client"] for r in rows(run, "clients")})
    allowed = len(clients) * json.loads((run / "config.json").read_text())["steps"]  # a client's plan, under the budget
    pushed = replies = 0
    push = make_codec(codec)
    for client in clients:
        window, replies = [], replies + 1  # its first pull
        for row in (r for r in rows(run, "clients") if r["client"] == client):
            window.append({k: v for k, v in row.items() if k not in SERVER_KEYS})
            if "version_pulled" in row:
                pushed += servers * HEADER_BYTES + push.wire_size(size) * push.wire_dtype.itemsize
                pushed += len(rows_bytes(Push(0, 0, False, rows=tuple(window))))
                replies += row["step"] < allowed  # every push fetches but one at the end of the plan
                window = []
    pull = make_codec(codec if pulls else "none")
    return pushed, replies * (servers * HEADER_BYTES + pull.wire_size(size) * pull.wire_dtype.itemsize)


@pytest.fixture(scope="module")
def plain(tmp_path_factory, tiny_npz):
    """The uncompressed run the codecs are held against (one run for them all)."""
    return sim(tmp_path_factory.mktemp("compress") / "plain", tiny_npz, *FLAGS)


@pytest.mark.parametrize("name", ["fp16", "bf16", "int8", "int4"])
def test_a_compressed_run_counts_its_frames_and_still_learns(tmp_path, tiny_npz, plain, name):
    packed = sim(tmp_path / name, tiny_npz, *FLAGS, "--compress", name, "--compress-pulls")
    plain_summary, summary = summary_of(plain), summary_of(packed)
    assert summary["pushes_applied"] == plain_summary["pushes_applied"] == 60 and summary["pushes_rejected"] == 0
    assert (summary["bytes_pushed"], summary["bytes_pulled"]) == frame_bytes(packed, name, pulls=True)
    assert (plain_summary["bytes_pushed"], plain_summary["bytes_pulled"]) == frame_bytes(plain, "none")
    losses = [r["loss"] for r in rows(packed, "clients")]
    assert np.mean(losses[-20:]) < 0.5 * np.mean(losses[:20])
    assert summary["final_test_error"] <= plain_summary["final_test_error"] + 0.05


def test_pulls_stay_float32_unless_asked(tmp_path, tiny_npz, plain):
    packed = sim(tmp_path / "int8", tiny_npz, *FLAGS, "--compress", "int8")
    assert (summary_of(packed)["bytes_pushed"], summary_of(packed)["bytes_pulled"]) == frame_bytes(packed, "int8")
    assert summary_of(packed)["bytes_pulled"] == summary_of(plain)["bytes_pulled"]


def test_easgd_pushes_its_weights_compressed_without_error_feedback(tmp_path, tiny_npz):
    """Weights are rounded afresh at every push (no residual to carry); the run learns."""
    flags = ["--clients", "2", "--steps", "40", "--n-sync", "2", "--rule", "easgd"]
    plain = sim(tmp_path / "plain", tiny_npz, *flags)
    packed = sim(tmp_path / "bf16", tiny_npz, *flags, "--compress", "bf16")
    plain_summary, summary = summary_of(plain), summary_of(packed)
    assert summary["pushes_applied"] == 40 and summary["bytes_pushed"] == frame_bytes(packed, "bf16")[0]
    assert summary["final_test_error"] <= plain_summary["final_test_error"] + 0.05


def test_the_collective_modes_count_what_their_averages_move(tmp_path, tiny_npz):
    """sync averages every step, local-sgd every n_sync and at the last: each client's
    float32 vector in, the mean back."""
    for mode, averages in (("sync", 10), ("local-sgd", 4)):  # local-sgd: steps 3, 6, 9 and 10
        run = sim(tmp_path / mode, tiny_npz, "--mode", mode, "--clients", "2", "--steps", "10", "--n-sync", "3")
        size = np.load(run / "checkpoint" / "latest.npz")["weights"].size
        s = summary_of(run)
        assert s["bytes_pushed"] == s["bytes_pulled"] == averages * 2 * 4 * size


@pytest.mark.parametrize("clients", [1, 4])
def test_int8_trains_as_float32_does(tmp_path, tiny_npz, clients):
    """The default rule (`add`, deltas through error feedback): int8's final test error
    within 0.05 of float32's on the tiny task (4 of its 76 test samples)."""
    flags = ["--clients", str(clients), "--steps", str(240 // clients), "--n-sync", "2"]
    plain = summary_of(sim(tmp_path / "plain", tiny_npz, *flags))
    packed = summary_of(sim(tmp_path / "int8", tiny_npz, *flags, "--compress", "int8"))
    assert packed["pushes_rejected"] == 0 and packed["status"] == "complete"
    assert abs(packed["final_test_error"] - plain["final_test_error"]) <= 0.05
    assert packed["bytes_pushed"] < 0.3 * plain["bytes_pushed"]  # the rows ride along uncompressed
