"""End to end under real mpiexec: each test launches a job in a subprocess with a hard timeout."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from clients.data import load_dataset
from rundir.durable import load_arrays
from rundir.status import finished
from tests.conftest import BIN, each_logged_once, mpi_train, run_command
from tests.reference import assert_steps_close, plain_sgd
from tests.sim.test_compress import frame_bytes

pytestmark = pytest.mark.mpi
# the rule these tests were written for (a version a push) and no lr scaling, so their
# weights compare with plain SGD's at the same lr (on the CPU, as the reference is, on a
# GPU host too); tests of other rules say theirs
TINY = ["--batch-size", "32", "--lr", "0.01", "--rule", "easgd", "--lr-scaling", "none", "--device", "cpu"]


def rows(run: Path, log: str) -> list[dict]:
    return [json.loads(line) for line in (run / f"{log}.jsonl").read_text().splitlines()]


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def test_self_launched_run_on_fashion_mnist_matches_the_run_directory_contract(tmp_path):
    run = tmp_path / "run"
    # No mpiexec typed: asgd starts 1 server + 2 clients itself.
    result = run_command([str(BIN / "asgd"), "train", "--quiet", "--rule", "easgd", "--clients", "2", "--steps", "30",
                          "--n-sync", "5", "--eval-samples", "500", "--out", str(run)], timeout=180)
    assert result.returncode == 0, result.stderr
    names = {p.name for p in run.iterdir()}
    assert names >= {"config.json", "clients.jsonl", "server.jsonl", "eval.jsonl", "checkpoint", "summary.json"}
    assert not names & {"lock", "snapshots"}  # nothing stale: the lock released, the snapshots evaluated
    config = json.loads((run / "config.json").read_text())
    assert config["clients"] == 2 and config["n_sync"] == 5 and config["data"] == "fashion-mnist"
    assert {"git_commit", "packages", "mpi_library", "ranks", "hosts", "start_time"} <= set(config["provenance"])
    assert [r["role"] for r in config["provenance"]["ranks"]] == ["server", "client", "client"]
    client_rows = rows(run, "clients")
    # the run's budget: 60 minibatches shared by speed, in windows of 5 (a loaded host times them apart)
    ran = each_logged_once([(r["client"], r["step"]) for r in client_rows], 2)
    assert sum(ran) == 60 and all(n % 5 == 0 for n in ran)
    assert {"client", "step", "time", "loss", "error", "samples"} <= set(client_rows[0])
    synced = [r for r in client_rows if "staleness" in r]
    assert len(synced) == 12 and all("version_pulled" in r for r in synced)
    server_rows = rows(run, "server")
    assert [r["version"] for r in server_rows] == list(range(1, 13))
    assert {"time", "client", "version", "staleness", "apply_s"} <= set(server_rows[0])
    evals = rows(run, "eval")
    assert evals[0]["version"] == 0 and evals[-1]["version"] == 12
    s = summary(run)
    assert s["status"] == "complete" and s["pushes_sent"] == s["pushes_applied"] == 12
    # the final weights on the whole test split; the curve's last point on 500 of its samples
    # trained, well below chance (0.9): 60 minibatches end between 0.45 and 0.52 as the arrival order falls
    assert s["minibatches"] == 60 and s["final_test_error"] < 0.65 and s["final_test_samples"] == 10000
    assert abs(evals[-1]["test_error"] - s["final_test_error"]) < 0.1  # over 4 standard errors of 500 samples
    checkpoint = load_arrays(run / "checkpoint" / "latest.npz")
    assert int(checkpoint["version"]) == 12 and checkpoint["weights"].dtype == np.float32


def test_four_clients_every_push_applied_once_with_staleness_and_falling_loss(tmp_path, tiny_npz):
    run = tmp_path / "run"
    result = mpi_train(5, "--data", str(tiny_npz), *TINY, "--steps", "40", "--n-sync", "2", "--threads", "1",
                       "--out", str(run))
    assert result.returncode == 0, result.stderr
    # the default servers = auto under a typed mpiexec: the ranks are the user's, one server
    assert json.loads((run / "config.json").read_text())["servers"] == 1
    s = summary(run)
    assert s["pushes_sent"] == s["pushes_applied"] == s["version"] == 4 * 20 and s["pushes_rejected"] == 0
    server_rows = rows(run, "server")
    assert len(server_rows) == 80 and sorted(r["version"] for r in server_rows) == list(range(1, 81))
    assert sum(each_logged_once([(r["client"], r["step"]) for r in rows(run, "clients")], 4)) == 4 * 40
    assert max(r["staleness"] for r in server_rows) > 0
    assert s["staleness"]["max"] == max(r["staleness"] for r in server_rows)
    cost = s["server_push_us"]  # the server's own time a push, by phase, measured in the job
    assert set(cost) == {"receive", "check", "apply", "reply", "record", "total", "cpu"} and cost["apply"] > 0
    assert cost["total"] == pytest.approx(sum(v for k, v in cost.items() if k not in ("total", "cpu")), abs=0.1)
    assert cost["cpu"] > 0
    assert 1e6 * np.median([r["apply_s"] for r in server_rows]) == pytest.approx(cost["apply"], rel=0.01)
    assert s["server_busy"] == s["server_busy_s"] / s["time_s"] and 0 < s["server_busy"] < 1
    assert ("servers_needed" in s) == (s["server_busy"] > 0.5)  # the bound of experiments/run/sizing.py
    assert 0 < s["client_busy"] < 1  # each client waits for its replies: the span is more than its minibatches
    losses = [r["loss"] for r in sorted(rows(run, "clients"), key=lambda r: r["time"])]
    assert np.mean(losses[-20:]) < 0.5 * np.mean(losses[:20])
    # The simulator replays this real run's arrival order: with the MPI run's thread count
    # (1 per client here) it reproduces every push's staleness and every loss exactly
    # (in this process: the simulator needs no process of its own).
    from experiments.cli import main

    replay = tmp_path / "replay"
    assert main(["train", "--quiet", "--backend", "sim", "--clients", "4",
                 "--data", str(tiny_npz), *TINY, "--steps", "40", "--n-sync", "2", "--replay", str(run),
                 "--threads", "1", "--eval-samples", "50", "--out", str(replay)]) == 0
    assert [(r["client"], r["staleness"]) for r in rows(replay, "server")] == \
        [(r["client"], r["staleness"]) for r in server_rows]
    assert sorted((r["client"], r["step"], r["loss"]) for r in rows(replay, "clients")) == \
        sorted((r["client"], r["step"], r["loss"]) for r in rows(run, "clients"))


def one_client_flags(tiny_npz: Path, n_sync: int) -> list[str]:
    return ["--data", str(tiny_npz), *TINY, "--steps", "12", "--n-sync", str(n_sync), "--rule", "add",
            "--eval-samples", "50"]


@pytest.fixture(scope="module")
def one_client_runs(tmp_path_factory, tiny_npz) -> dict[int, Path]:
    """1 server + 1 client, add rule, 12 steps, n_sync 1 and 4: one job each, shared by
    the plain-SGD and the simulator checks."""
    runs = {}
    for n_sync in (1, 4):
        runs[n_sync] = tmp_path_factory.mktemp("one-client") / f"n{n_sync}"
        result = mpi_train(2, *one_client_flags(tiny_npz, n_sync), "--out", str(runs[n_sync]))
        assert result.returncode == 0, result.stderr
    return runs


@pytest.mark.parametrize("n_sync", [1, 4])
def test_one_client_under_mpi_equals_plain_sgd(one_client_runs, tiny_npz, n_sync):
    """The paper's rule (add): one client is plain SGD whatever n_sync."""
    weights = load_arrays(one_client_runs[n_sync] / "checkpoint" / "latest.npz")["weights"]
    expected = plain_sgd(load_dataset(str(tiny_npz)), 12, batch_size=32, lr=0.01)
    assert_steps_close(weights, expected, 12)


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_an_exception_on_any_rank_ends_the_job_nonzero(tmp_path, tiny_npz, rank):
    run = tmp_path / "run"
    result = mpi_train(3, "--data", str(tiny_npz), *TINY, "--steps", "40", "--n-sync", "2",
                       "--inject-fault", f"{rank}:5", "--out", str(run), timeout=120)
    assert result.returncode != 0
    role = "server" if rank == 0 else f"client {rank - 1}"
    assert f"rank {rank} ({role}) failed: InjectedFault" in result.stderr, result.stderr
    assert summary(run)["status"].startswith("failed:") and "InjectedFault" in summary(run)["status"]


STUCK_ABORT = """
import mpi4py
mpi4py.rc.initialize = False  # no MPI: a communicator whose Abort never returns
import time
from paramserver.wire import transport
transport.ABORT_GRACE_S = 0.5
class Stuck:
    def Get_rank(self): return 1
    def Get_size(self): return 3
    def Abort(self, code): time.sleep(3600)
transport.Transport(Stuck()).abort(1)
"""


def test_a_rank_whose_abort_never_returns_leaves_alone():
    # as Open MPI's MPI_Abort once did under ULFM with the server dead (CI, 180 s)
    result = run_command([sys.executable, "-c", STUCK_ABORT], timeout=60)
    assert result.returncode == 1, result.stderr
    assert "Timeout" in result.stderr and "in abort" in result.stderr, result.stderr


def test_too_few_ranks_is_a_clear_error_not_a_hang(tiny_npz):
    result = mpi_train(2, "--data", str(tiny_npz), "--clients", "3", timeout=60)
    assert result.returncode == 2
    assert "3 client(s) in async mode need 4 MPI ranks" in result.stderr


def test_simulator_with_one_client_reproduces_the_mpi_losses(one_client_runs, tmp_path, tiny_npz):
    result = run_command([str(BIN / "asgd"), "train", "--quiet", "--backend", "sim", "--clients", "1",
                          *one_client_flags(tiny_npz, 4), "--out", str(tmp_path / "sim")], timeout=120)
    assert result.returncode == 0, result.stderr
    losses = {kind: [r["loss"] for r in rows(run, "clients")]
              for kind, run in (("mpi", one_client_runs[4]), ("sim", tmp_path / "sim"))}
    assert len(losses["mpi"]) == 12 and losses["mpi"] == losses["sim"]


@pytest.mark.parametrize("mode", ["sync", "local-sgd"])
@pytest.mark.long
def test_synchronous_baselines_under_mpi(tmp_path, tiny_npz, mode):
    """sync: every rank is a client, the allreduce of 3 batches of 32 one batch of 96.
    local-sgd with DiLoCo's outer step: every rank steps its own copy of the outer
    optimizer on the allreduced mean, and the run is the float64 loop of DiLoCo's
    Algorithm 1 (3 rounds of 3 steps) within float32's few ulps, as in the simulator
    (tests/sim/test_diloco.py)."""
    from tests.reference import plain_diloco

    run, steps = tmp_path / "run", 10 if mode == "sync" else 9
    outer = ["--outer-lr", "0.7", "--nesterov-momentum", "0.9"] if mode == "local-sgd" else []
    result = mpi_train(3, "--mode", mode, "--data", str(tiny_npz), *TINY, "--steps", str(steps), "--n-sync", "3",
                       *outer, "--eval-samples", "50", "--out", str(run))
    assert result.returncode == 0, result.stderr
    assert sorted((r["client"], r["step"]) for r in rows(run, "clients")) == \
        [(c, s) for c in range(3) for s in range(1, steps + 1)]
    assert summary(run)["status"] == "complete" and rows(run, "server") == []
    dataset = load_dataset(str(tiny_npz))
    expected = plain_sgd(dataset, 10, batch_size=32, lr=0.01, clients=3) if mode == "sync" else \
        plain_diloco(dataset, 3, 3, clients=3, outer_lr=0.7, outer_momentum=0.9)
    np.testing.assert_allclose(load_arrays(run / "checkpoint" / "latest.npz")["weights"], expected, atol=1e-6, rtol=0)


@pytest.mark.long
def test_local_sgd_under_mpi_resumed_from_checkpoints_between_curve_points_ends_as_one_never_stopped(tmp_path,
                                                                                                 tiny_npz):
    """checkpoint_every under MPI: rank 0's clock decides, every rank agrees at the
    averaging steps and gives its AdamW state, and rank 0 DiLoCo's outer momentum; a run
    failed at step 7 goes on from step 6."""
    flags = ["--mode", "local-sgd", "--data", str(tiny_npz), *TINY, "--steps", "10", "--n-sync", "2",
             "--optimizer", "adamw", "--eval-every", "1000", "--checkpoint-every", "0.000001", "--eval-samples", "50",
             "--outer-lr", "0.7", "--nesterov-momentum", "0.9"]
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    assert mpi_train(2, *flags, "--out", str(whole)).returncode == 0
    assert mpi_train(2, *flags, "--out", str(resumed), "--inject-fault", "1:7").returncode == 1
    stopped = load_arrays(resumed / "checkpoint" / "latest.npz")
    assert int(stopped["version"]) == 6 and "client_optimizer.1.state.0.step" in stopped and "outer.momentum" in stopped
    assert mpi_train(2, "--resume", str(resumed)).returncode == 0
    np.testing.assert_array_equal(load_arrays(resumed / "checkpoint" / "latest.npz")["weights"],
                                  load_arrays(whole / "checkpoint" / "latest.npz")["weights"])


def test_warm_start_under_mpi_starts_every_client_from_the_warm_weights(tmp_path, tiny_npz):
    run = tmp_path / "run"
    result = mpi_train(3, "--data", str(tiny_npz), *TINY, "--steps", "2", "--warm-start", "40",
                       "--eval-samples", "200", "--out", str(run))
    assert result.returncode == 0, result.stderr
    assert [r["step"] for r in rows(run, "warm_start")] == list(range(1, 41))
    evals = rows(run, "eval")
    assert evals[0]["version"] == 0 and evals[0]["test_loss"] < 0.7 * np.log(4)  # untrained: ~ln 4
    first_losses = [r["loss"] for r in rows(run, "clients") if r["step"] == 1]
    assert len(first_losses) == 2 and max(first_losses) < 0.8 * np.log(4)


def test_compressed_pushes_and_pulls_under_mpi(tmp_path, tiny_npz):
    run = tmp_path / "run"
    result = mpi_train(3, "--data", str(tiny_npz), *TINY, "--steps", "20", "--compress", "bf16",
                       "--eval-samples", "50", "--out", str(run))
    assert result.returncode == 0, result.stderr
    s = summary(run)
    assert s["pushes_applied"] == s["version"] == 40 and s["pushes_rejected"] == 0
    assert (s["bytes_pushed"], s["bytes_pulled"]) == frame_bytes(run, "bf16")  # the pulls stay float32


def test_int8_pushes_and_pulls_to_two_sharded_servers_compute_what_one_simulated_does(tmp_path, tiny_npz):
    """Each server decodes its slice alone (the slices start at whole blocks), so the run
    is the simulator's, which holds the whole vector, loss for loss; the frames' bytes are
    what two headers a push and a reply and the codec's payloads make, in both."""
    flags = ["--clients", "1", "--data", str(tiny_npz), *TINY, "--rule", "add", "--steps", "12", "--n-sync", "2",
             "--compress", "int8", "--compress-pulls", "--eval-samples", "50"]
    result = mpi_train(3, "--servers", "2", *flags, "--out", str(tmp_path / "mpi"))
    assert result.returncode == 0, result.stderr
    sim_run = run_command([str(BIN / "asgd"), "train", "--backend", "sim", "--servers", "2", "--quiet", *flags,
                           "--out", str(tmp_path / "sim")], timeout=120)
    assert sim_run.returncode == 0, sim_run.stderr
    mpi, simulated = tmp_path / "mpi", tmp_path / "sim"
    assert [r["loss"] for r in rows(mpi, "clients")] == [r["loss"] for r in rows(simulated, "clients")]
    np.testing.assert_array_equal(load_arrays(mpi / "checkpoint" / "latest.npz")["weights"],
                                  load_arrays(simulated / "checkpoint" / "latest.npz")["weights"])
    s = summary(mpi)
    assert s["pushes_applied"] == 6 and s["pushes_rejected"] == 0
    assert (s["bytes_pushed"], s["bytes_pulled"]) == frame_bytes(mpi, "int8", pulls=True, servers=2)
    # the simulator counts alike (its rows' times are virtual ones: other digits, other bytes)
    assert (summary(simulated)["bytes_pushed"], summary(simulated)["bytes_pulled"]) == \
        frame_bytes(simulated, "int8", pulls=True, servers=2)


def test_one_client_with_two_sharded_servers_equals_plain_sgd(tmp_path, tiny_npz):
    run = tmp_path / "run"
    result = mpi_train(3, "--servers", "2", "--clients", "1", "--data", str(tiny_npz), *TINY, "--steps", "12",
                       "--rule", "add", "--eval-every", "4", "--eval-samples", "50", "--out", str(run))
    assert result.returncode == 0, result.stderr
    weights = load_arrays(run / "checkpoint" / "latest.npz")["weights"]
    expected = plain_sgd(load_dataset(str(tiny_npz)), 12, batch_size=32, lr=0.01)
    assert_steps_close(weights, expected, 12)  # both slices, put together
    assert [r["version"] for r in rows(run, "eval")] == [0, 4, 8, 12]


def test_sharded_servers_apply_every_push_once(tmp_path, tiny_npz):
    run = tmp_path / "run"
    result = mpi_train(5, "--servers", "2", "--data", str(tiny_npz), *TINY, "--steps", "30", "--n-sync", "2",
                       "--eval-samples", "50", "--out", str(run))
    assert result.returncode == 0, result.stderr
    s = summary(run)
    assert s["pushes_sent"] == s["pushes_applied"] == s["version"] == 3 * 15 and s["pushes_rejected"] == 0
    assert sum(each_logged_once([(r["client"], r["step"]) for r in rows(run, "clients")], 3)) == 3 * 30
    assert [r["role"] for r in json.loads((run / "config.json").read_text())["provenance"]["ranks"]] == \
        ["server", "server", "client", "client", "client"]


# scaled and staleness travel and keep state as add does (a delta, no state): under MPI
# they are add's job; their arithmetic is checked in tests/unit/test_rules.py and, through
# the real handler, in tests/sim/test_client.py.
# fresh gathers both clients' pushes of 2 minibatches into each step (its replies wait for
# it); nesterov updates its momentum every 2 pushes
RULE_FLAGS = {"fresh": ["--fresh-batch", "4", "--fresh-reply", "wait"]}


@pytest.mark.parametrize("rule", ["add", "dcasgd", "easgd", "adagrad", "sgd", "fresh", "nesterov"])
def test_every_kind_of_rule_runs_under_mpiexec(tmp_path, tiny_npz, rule):
    """Two clients, the rule's own push (delta, gradient sum or weights) and state: every
    push applied once, the state in the checkpoint, the weights finite."""
    run = tmp_path / "run"
    result = mpi_train(3, "--data", str(tiny_npz), *TINY, "--steps", "6", "--n-sync", "2", "--threads", "1",
                       "--rule", rule, "--momentum", "auto", "--eval-samples", "50", "--out", str(run),
                       *RULE_FLAGS.get(rule, []))
    assert result.returncode == 0, result.stderr
    s = summary(run)
    # 6 steps may leave the error at chance (`untrained`); a rule that broke the weights is `diverged`
    assert s["status"].split(":")[0] in ("complete", "untrained") and s["pushes_sent"] == s["pushes_applied"] == 6
    checkpoint = load_arrays(run / "checkpoint" / "latest.npz")
    assert np.isfinite(checkpoint["weights"]).all()
    state = {k for k in checkpoint if k.startswith("rule.")}
    expected = {"dcasgd": {"rule.backup.0", "rule.backup.1", "rule.meansquare"}, "adagrad": {"rule.sum"},
                "sgd": {"rule.momentum_buffer"}, "fresh": {"rule.total", "rule.momentum_buffer"},
                "nesterov": {"rule.total", "rule.momentum"}}  # the server's momentum: the clients' (auto: 0.9)
    assert state == expected.get(rule, set())
    assert s["rule_state_bytes"] == 4 * checkpoint["weights"].size * len(state)
    assert json.loads((run / "config.json").read_text())["momentum_used"] == pytest.approx(0.8)
    assert s["version"] == (3 if rule == "fresh" else 6) and s.get("pushes_dropped") == 0


@pytest.mark.parametrize("servers", [1, 2])
def test_fresh_with_s_k_r_0_is_the_large_batch_loop_also_on_sharded_servers(tmp_path, tiny_npz, servers):
    """Two clients whatever their arrival order: each step waits for both gradients, so
    the weights are those of one process at twice the batch; with two servers every
    slice takes its step at the same push (the steps in the headers), put together."""
    run = tmp_path / "run"
    result = mpi_train(2 + servers, "--servers", str(servers), "--clients", "2", "--data", str(tiny_npz), *TINY,
                       "--steps", "12", "--rule", "fresh", "--fresh-reply", "wait", "--server-momentum", "0.9",
                       "--threads", "1",
                       "--eval-samples", "50", "--out", str(run))
    assert result.returncode == 0, result.stderr
    weights = load_arrays(run / "checkpoint" / "latest.npz")["weights"]
    expected = plain_sgd(load_dataset(str(tiny_npz)), 12, batch_size=32, lr=0.01, clients=2)
    assert_steps_close(weights, expected, 12)
    assert summary(run)["version"] == 12 and summary(run)["pushes_dropped"] == 0


def test_delayed_nesterov_holds_each_round_under_mpi(tmp_path, tiny_npz):
    """`--nesterov-reply round` over MPI: a round's early pushers wait for its momentum
    step, so each round of K pushes holds one push of every client, all pulled after the
    round before: the i-th push of a round is i versions stale (answered at once, each
    client pulls right after its own push, and at equal speeds every push is K - 1
    stale); the run ends."""
    run = tmp_path / "run"
    result = mpi_train(4, "--data", str(tiny_npz), *TINY[:4], "--rule", "nesterov", "--nesterov-reply", "round",
                       "--outer-lr", "0.7", "--n-sync", "2", "--steps", "10", "--lr-scaling", "none", "--device", "cpu",
                       "--eval-samples", "50", "--out", str(run))
    assert result.returncode == 0, result.stderr
    pushes = rows(run, "server")
    assert len(pushes) == 15
    assert all(sorted(r["client"] for r in pushes[i:i + 3]) == [0, 1, 2] for i in range(0, 15, 3))
    assert [r["staleness"] for r in pushes[3:]] == [0, 1, 2] * 4
    assert summary(run)["status"] == "complete"


@pytest.mark.parametrize("flags", [["--rule", "fresh", "--fresh-reply", "auto", "--fresh-batch", "3"],
                                   ["--rule", "add", "--dylu", "--n-sync", "3"]], ids=["pace", "dylu"])
def test_two_sharded_servers_follow_server_0s_pace(tmp_path, tiny_npz, flags):
    """Server 0 decides when each client is answered (the pace of `fresh`, DyLU's windows)
    and server 1 follows it (paramserver/drivers/follow.py), a straggler among three clients: the
    run ends, each minibatch logged once, each push applied or dropped once, and
    every curve point (but the final one) at a multiple of eval_every, read from both slices."""
    run = tmp_path / "run"
    result = mpi_train(5, "--servers", "2", "--data", str(tiny_npz), *TINY, "--steps", "12", "--slow-clients", "1",
                       "--slow-factor", "3", "--sim-step-time", "0.01", "--eval-every", "4", "--eval-samples", "50",
                       "--out", str(run), *flags)
    assert result.returncode == 0, result.stderr
    s = summary(run)
    # 12 steps, the pace gathering 3 gradients a step: the error may end at chance (`untrained`)
    assert finished(s["status"]) and s["pushes_rejected"] == 0
    assert s["pushes_sent"] == s["pushes_applied"] + s["pushes_dropped"]
    # the run's budget (K x steps, the windows told counted) may end a window past it
    assert sum(each_logged_once([(r["client"], r["step"]) for r in rows(run, "clients")], 3)) == s["minibatches"] >= 36
    curve = rows(run, "eval")
    assert all(np.isfinite(r["test_loss"]) for r in curve) and [r["version"] % 4 for r in curve[:-1]] == [0] * (len(curve) - 1)
