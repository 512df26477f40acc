"""Streamed fragments end to end in the simulator: what a fragmented run logs, that one
client's fragments add up to its whole pushes, and the busy share they buy where a whole
push costs half a window (experiments/sim/simulator.py, clients/loop.py)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from experiments.cli import main
from tests.conftest import each_logged_once
from tests.sim.test_sim import TIMED, rows, sim

# 1 MB a whole push or pull at 50 MB/s: 20 ms each way, half of a window of 8 minibatches of 10 ms
SLOW = ["--sim-push-bytes", "1000000", "--sim-bandwidth", "5e7"]


def weights(run) -> np.ndarray:
    return np.load(run / "checkpoint" / "latest.npz")["weights"]


def summary(run) -> dict:
    return json.loads((run / "summary.json").read_text())


def test_a_fragmented_run_applies_a_fragment_every_n_sync_over_p_minibatches(tmp_path, tiny_npz):
    """2 clients, n_sync 4, 2 fragments: a fragment goes every 2 minibatches, each applied
    as a push (one version), its rows logged with it; the run's budget holds exactly, and
    the reply that stops a client is followed by a whole push of what its other slices
    hold unpushed, so no work is lost (8 fragments and 1 whole push a client)."""
    run = sim(tmp_path / "run", tiny_npz, "--rule", "add", "--clients", "2", "--steps", "16", "--n-sync", "4",
              "--fragments", "2")
    applied = [r for r in rows(run, "server") if "version" in r]
    client_rows = rows(run, "clients")
    assert len(client_rows) == 2 * 16 and not any("rejected" in r for r in client_rows)
    synced = [r["step"] for r in client_rows if "version_pulled" in r and r["client"] == 0]
    assert synced == list(range(2, 17, 2))  # every n_sync / P minibatches
    assert len(applied) == 2 * 9 and [r["version"] for r in applied] == list(range(1, 19))
    result = summary(run)
    assert result["status"] == "complete" and result["minibatches"] == 32 and result["version"] == 18
    assert json.loads((run / "config.json").read_text())["fragments"] == 2
    assert 0 < result["client_busy"] <= 1


def test_one_clients_fragments_end_where_its_whole_pushes_do(tmp_path, tiny_npz):
    """With one client and `add` each fragment's answer is its own change on the server's
    slice, and the merge keeps what it computed since: its weights follow the same local
    steps as with whole pushes, apart from float32 rounding of w + (now - base) at each sync."""
    flags = ["--rule", "add", "--clients", "1", "--steps", "16", "--n-sync", "4"]
    whole = sim(tmp_path / "whole", tiny_npz, *flags)
    streamed = sim(tmp_path / "streamed", tiny_npz, *flags, "--fragments", "4")
    assert len([r for r in rows(streamed, "server") if "version" in r]) == 16  # one fragment a minibatch
    np.testing.assert_allclose(weights(streamed), weights(whole), rtol=0, atol=1e-5)


def test_where_a_whole_push_costs_half_a_window_fragments_keep_the_client_busy(tmp_path, tiny_npz):
    """A whole push and its pull take 40 ms (and 0.1 ms the apply) after each window of
    80 ms but the last: a client that waits computes 80 of every 120 ms. A fragment and
    its slice take 10 ms, inside the 20 ms the next fragment's minibatches take, so the
    client never waits."""
    flags = ["--rule", "add", "--clients", "1", "--steps", "32", "--n-sync", "8", *SLOW]
    whole = summary(sim(tmp_path / "whole", tiny_npz, *flags))["client_busy"]
    streamed = summary(sim(tmp_path / "streamed", tiny_npz, *flags, "--fragments", "4"))["client_busy"]
    # (`--sim-latency 0` leaves the profile's 2 us a message: a few us a wait more)
    assert whole == pytest.approx(0.32 / (0.32 + 3 * (0.02 + 0.0001 + 0.02)), rel=1e-4)
    assert streamed == pytest.approx(1.0, rel=1e-9)


def test_int8_fragments_are_whole_blocks_each_with_its_own_error_feedback(tmp_path, tiny_npz):
    """Under int8 each fragment is whole blocks of the codec (the slices start at multiples
    of 256) and carries its slice's share of the error feedback: every one is applied."""
    run = sim(tmp_path / "run", tiny_npz, "--rule", "add", "--clients", "2", "--steps", "16", "--n-sync", "4",
              "--fragments", "4", "--compress", "int8", "--compress-pulls")
    result = summary(run)
    assert result["status"] == "complete" and result["pushes_rejected"] == 0
    assert result["pushes_applied"] == result["version"] == 2 * (16 + 1)  # a fragment a minibatch, then a whole push


@pytest.mark.parametrize("flags,line", [
    (["--mode", "sync"], "fragments: needs --mode async (a server to stream to), got sync"),
    (["--rule", "add", "--n-sync", "6"],
     "fragments: n_sync (n_push) must be a multiple of the 4 fragments "
     "(each pushed every n_sync/4 minibatches), got 6"),
])
def test_fragments_where_refused_exit_2_in_one_line_before_anything_starts(tmp_path, tiny_npz, capsys, flags, line):
    args = ["train", "--backend", "sim", "--data", str(tiny_npz), "--out", str(tmp_path / "run"), "--fragments", "4",
            "--quiet", *flags]
    assert main(args) == 2
    assert capsys.readouterr().err.strip() == f"asgd: error: {line}"
    assert not (tmp_path / "run").exists()


def test_a_nesterov_run_streams_fragments_each_slice_with_its_own_rounds(tmp_path, tiny_npz):
    """Asynchronous DiLoCo streaming (Streaming DiLoCo's setting): 2 clients, n_sync 8, 4
    fragments, a server momentum. Every (client, step) row is logged once, the budget
    holds exactly, every fragment is applied (a version each), and the checkpoint keeps
    each slice's round count (paramserver/rules/nesterov.py)."""
    run = sim(tmp_path / "run", tiny_npz, "--rule", "nesterov", "--nesterov-momentum", "0.9", "--clients", "2",
              "--steps", "32", "--n-sync", "8", "--fragments", "4")
    client_rows = rows(run, "clients")
    assert sorted((r["client"], r["step"]) for r in client_rows) == [(c, s) for c in (0, 1) for s in range(1, 33)]
    result = summary(run)
    assert result["status"] == "complete" and result["minibatches"] == 64 and result["pushes_rejected"] == 0
    assert result["pushes_applied"] == result["version"] == 2 * (32 // 2 + 1)  # a fragment every 2, then a whole push
    counts = [k for k in np.load(run / "checkpoint" / "latest.npz") if k.startswith("rule_scalar.count.")]
    assert len(counts) == 4


def test_one_clients_nesterov_fragments_end_where_its_whole_pushes_do(tmp_path, tiny_npz):
    """With one client delayed Nesterov's defaults (N = K = 1, beta = 0, eps = 1) step as
    `add` does, here through each slice's own rounds: so, as for `add` above, the weights
    follow the whole pushes' local steps apart from float32 rounding at each merge."""
    flags = ["--rule", "nesterov", "--clients", "1", "--steps", "16", "--n-sync", "4"]
    whole = sim(tmp_path / "whole", tiny_npz, *flags)
    streamed = sim(tmp_path / "streamed", tiny_npz, *flags, "--fragments", "4")
    np.testing.assert_allclose(weights(streamed), weights(whole), rtol=0, atol=1e-5)


@pytest.mark.parametrize("servers", ["1", "2"])
def test_a_fragmented_run_killed_by_a_fault_resumes_to_its_budget_every_row_once(tmp_path, tiny_npz, servers):
    """The server fails at version 30, past the checkpoint of version 24; the resume goes
    on from the checkpoint (what a client's other slices held unpushed is lost there:
    docs/training.md), to the run's 80 minibatches, each logged once; with sharded
    servers too (the simulator's one server stands for them), which the resume keeps."""
    run = tmp_path / "run"
    flags = ["--backend", "sim", "--data", str(tiny_npz), "--out", str(run), *TIMED, "--rule", "add", "--clients",
             "2", "--steps", "40", "--n-sync", "8", "--fragments", "4", "--eval-every", "8", "--servers", servers]
    assert main(["train", *flags, "--inject-fault", "0:30"]) == 1
    assert main(["train", "--resume", str(run)]) == 0
    logged = [(r["client"], r["step"]) for r in rows(run, "clients")]
    assert len(logged) == len(set(logged)) == summary(run)["minibatches"] == 80
    assert summary(run)["status"] == "complete"
    assert json.loads((run / "config.json").read_text())["servers"] == int(servers)


@pytest.mark.parametrize("fragments", ["2", "4"])
def test_one_clients_fragments_end_alike_whatever_the_servers(tmp_path, tiny_npz, fragments):
    """One client, 2 and 3 sharded servers against one: the same weights, exactly. Every
    server takes every push (a fragment's piece, or its header alone) in one order, and
    the rules are elementwise, so S servers compute what one does (tests/unit/
    test_fragment_shards.py, bit for bit); the simulator's one server stands for them,
    and its costs for S move no merge with one client (each answer is merged at the
    fragment boundary after the next fragment is sent, whenever it comes)."""
    flags = ["--rule", "add", "--clients", "1", "--steps", "16", "--n-sync", "4", "--fragments", fragments]
    one = weights(sim(tmp_path / "1", tiny_npz, *flags, "--servers", "1"))
    for servers in ("2", "3"):
        run = sim(tmp_path / servers, tiny_npz, *flags, "--servers", servers)
        np.testing.assert_array_equal(weights(run), one)
        assert summary(run)["version"] == 16 // (4 // int(fragments))


@pytest.mark.parametrize("servers", ["2", "3"])
@pytest.mark.parametrize("rule", [["--rule", "add"], ["--rule", "nesterov", "--nesterov-momentum", "0.9"]])
def test_several_clients_stream_fragments_to_sharded_servers_each_row_and_push_once(tmp_path, tiny_npz, servers,
                                                                                     rule):
    """3 clients of unequal speeds (the run's budget shared by speed): each (client, step)
    logged once, every push sent applied once, a version each, in order."""
    run = sim(tmp_path / "run", tiny_npz, *rule, "--clients", "3", "--steps", "16", "--n-sync", "8",
              "--fragments", "4", "--servers", servers, "--speed-jitter", "0.3")
    result = summary(run)
    assert sum(each_logged_once([(r["client"], r["step"]) for r in rows(run, "clients")], 3)) == \
        result["minibatches"] == 3 * 16
    assert result["status"] == "complete" and result["pushes_rejected"] == 0
    assert result["pushes_sent"] == result["pushes_applied"] == result["version"]
    assert [r["version"] for r in rows(run, "server") if "version" in r] == list(range(1, result["version"] + 1))
