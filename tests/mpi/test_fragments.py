"""Streamed fragments over real mpiexec (clients/driver.py's `_stream`), to one server and
to two sharded ones: every minibatch logged once, every fragment applied once, and one
client ending where the simulator's run of the same settings ends, bit for bit (the
merge of each answer happens at the same fragment boundary in both, whatever the
timing: tests/sim/test_fragments.py)."""
from __future__ import annotations

import numpy as np
import pytest

from rundir.durable import load_arrays
from rundir.status import finished
from tests.conftest import BIN, each_logged_once, mpi_train, run_command
from tests.mpi.test_mpi import rows, summary

pytestmark = pytest.mark.mpi
FLAGS = ["--batch-size", "32", "--lr", "0.01", "--rule", "add", "--lr-scaling", "none", "--device", "cpu",
         "--n-sync", "4", "--fragments", "2", "--eval-samples", "50"]


@pytest.mark.parametrize("compress", ["none", "int8"])
def test_two_clients_stream_fragments_each_applied_once(tmp_path, tiny_npz, compress):
    """2 clients, 20 steps, a fragment every 2 minibatches: the run completes, each
    (client, step) row is logged once, the summary's minibatches are the rows, and the
    version counts the pushes applied, fragments and the last whole pushes alike."""
    run = tmp_path / "run"
    result = mpi_train(3, "--data", str(tiny_npz), *FLAGS, "--steps", "20", "--compress", compress,
                       "--out", str(run))
    assert result.returncode == 0, result.stderr
    ran = each_logged_once([(r["client"], r["step"]) for r in rows(run, "clients")], 2)
    s = summary(run)
    assert s["status"] == "complete" and s["minibatches"] == sum(ran) == 2 * 20 and s["fragments"] == 2
    applied = [r["version"] for r in rows(run, "server") if "version" in r]
    assert applied == list(range(1, s["version"] + 1))
    assert s["pushes_sent"] == s["pushes_applied"] == s["version"] and s["pushes_rejected"] == 0
    # a fragment every 2 minibatches but at a client's last, whose push goes whole (the
    # run's budget of 40 is shared by speed, its stop read at a fragment boundary)
    for client, n in enumerate(ran):
        synced = [r["step"] for r in rows(run, "clients") if "version_pulled" in r and r["client"] == client]
        assert synced == sorted({*range(2, n + 1, 2), n})


@pytest.mark.parametrize("compress", ["none", "int8"])
def test_one_client_streaming_over_mpi_ends_where_the_simulator_does(tmp_path, tiny_npz, compress):
    """One client: each answer is merged after the next fragment is taken and before the
    next minibatch, in both backends, so the arithmetic is the same, in the same order:
    the losses and the final weights are equal, not merely close."""
    flags = ["--clients", "1", "--data", str(tiny_npz), *FLAGS, "--steps", "16", "--compress", compress]
    mpi, simulated = tmp_path / "mpi", tmp_path / "sim"
    result = mpi_train(2, *flags, "--out", str(mpi))
    assert result.returncode == 0, result.stderr
    sim_run = run_command([str(BIN / "asgd"), "train", "--backend", "sim", "--quiet", *flags, "--out", str(simulated)],
                          timeout=120)
    assert sim_run.returncode == 0, sim_run.stderr
    assert [r["loss"] for r in rows(mpi, "clients")] == [r["loss"] for r in rows(simulated, "clients")]
    assert summary(mpi)["version"] == summary(simulated)["version"]
    np.testing.assert_array_equal(load_arrays(mpi / "checkpoint" / "latest.npz")["weights"],
                                  load_arrays(simulated / "checkpoint" / "latest.npz")["weights"])


SHARDED = ["--batch-size", "32", "--lr", "0.01", "--lr-scaling", "none", "--device", "cpu", "--servers", "2",
           "--n-sync", "8", "--fragments", "4", "--eval-samples", "50"]


@pytest.mark.parametrize("rule", [["--rule", "add"], ["--rule", "nesterov", "--nesterov-momentum", "0.9"]])
def test_two_clients_stream_fragments_to_two_sharded_servers_each_piece_applied_once(tmp_path, tiny_npz, rule):
    """2 servers, 4 fragments (two on each server's slice: a fragment misses the other,
    which still takes its header), 2 clients: each (client, step) logged once, and every
    push sent is applied once, a version each, on server 0 as on server 1 (which follows
    server 0's order: a follower that waited for a piece never sent would time out)."""
    run = tmp_path / "run"
    result = mpi_train(4, "--data", str(tiny_npz), *SHARDED, *rule, "--steps", "24", "--out", str(run))
    assert result.returncode == 0, result.stderr
    s = summary(run)
    assert finished(s["status"]) and s["fragments"] == 4
    assert sum(each_logged_once([(r["client"], r["step"]) for r in rows(run, "clients")], 2)) == s["minibatches"] == 48
    assert [r["version"] for r in rows(run, "server") if "version" in r] == list(range(1, s["version"] + 1))
    assert s["pushes_sent"] == s["pushes_applied"] == s["version"] and s["pushes_rejected"] == 0


@pytest.mark.parametrize("compress", [[], ["--compress", "int8", "--compress-pulls"]])
def test_one_client_streaming_to_two_sharded_servers_ends_where_the_simulator_does(tmp_path, tiny_npz, compress):
    """Each fragment cut at the servers' slices, applied as pieces, answered as pieces put
    together: one client's run is the simulator's (one server holding the whole vector),
    loss for loss and bit for bit."""
    flags = ["--clients", "1", "--rule", "add", "--data", str(tiny_npz), *SHARDED, "--steps", "24", *compress]
    mpi, simulated = tmp_path / "mpi", tmp_path / "sim"
    result = mpi_train(3, *flags, "--out", str(mpi))
    assert result.returncode == 0, result.stderr
    sim_run = run_command([str(BIN / "asgd"), "train", "--backend", "sim", "--quiet", *flags, "--servers", "1",
                           "--out", str(simulated)], timeout=120)
    assert sim_run.returncode == 0, sim_run.stderr
    assert [r["loss"] for r in rows(mpi, "clients")] == [r["loss"] for r in rows(simulated, "clients")]
    assert summary(mpi)["version"] == summary(simulated)["version"] == 24 // 2  # 11 fragments, the last push whole
    np.testing.assert_array_equal(load_arrays(mpi / "checkpoint" / "latest.npz")["weights"],
                                  load_arrays(simulated / "checkpoint" / "latest.npz")["weights"])


def test_a_fragments_answer_goes_as_a_copy_and_a_whole_reply_in_place():
    """Over real MPI in this process alone: a fragment's answer is copied when posted, so
    the weights may change before its client takes it; a whole reply reads them in place
    (`Posted.live`: the server finishes it before the next apply)."""
    from mpi4py import MPI

    from paramserver.wire import frame
    from paramserver.wire.protocol import Tag, Weights
    from paramserver.wire.transport import Transport

    transport = Transport(MPI.COMM_SELF)
    weights = frame.empty(8)
    weights[:] = np.arange(8)
    whole = transport.post(0, Tag.WEIGHTS, Weights(1, 8), weights)
    assert whole.live
    into = frame.empty(8)
    assert transport.complete(transport.expect_weights([0], [into]), [0], into.nbytes, 5) == [Weights(1, 8)]
    transport.complete(whole, [0], weights.nbytes, 5)
    np.testing.assert_array_equal(into, np.arange(8))
    landing = frame.empty(4)
    replies = transport.expect_weights([0], [landing])
    answer = transport.post(0, Tag.WEIGHTS, Weights(2, 4, fragment=0), weights[:4])
    assert not answer.live
    weights[:4] = -1  # an apply before the client takes the answer
    assert transport.complete(replies, [0], landing.nbytes, 5) == [Weights(2, 4, fragment=0)]
    transport.complete(answer, [0], landing.nbytes, 5)
    np.testing.assert_array_equal(landing, np.arange(4))
