"""Uneven hardware and failures in whole simulated runs: speeds and failures as the seed
draws them, an async client's lost window, the sync baseline that waits for a failed
client and the one whose backup worker does not, local SGD's failed client that loses
its round, goodput counted by hand."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from clients.client import Client, Replica
from clients.collective import Fate, Lockstep, RoundStart, collective_step, mean_in_place
from clients.data import load_dataset
from clients.models import build_model
from clients.sampling import ShardSampler, shard_indices
from clients.stragglers import Failures, Stragglers, client_speeds
from rundir.modes import Mode
from runconfig.settings import RunConfig
from tests.sim.test_resume import train
from tests.sim.test_sim import rows, sim


def summary(run) -> dict:
    return json.loads((run / "summary.json").read_text())


def failed(run) -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    for r in rows(run, "clients"):
        if r.get("failed"):
            found.setdefault(r["client"], []).append(r["step"])
    return found


def test_listed_speeds_stretch_each_client_and_a_spread_is_recorded(tmp_path, tiny_npz):
    run = sim(tmp_path / "listed", tiny_npz, "--clients", "3", "--steps", "6", "--n-sync", "6",
              "--client-speeds", "1,0.5,0.25")
    for client, speed in enumerate((1, 0.5, 0.25)):  # one window: nothing but minibatches between rows
        times = [r["time"] for r in rows(run, "clients") if r["client"] == client]
        np.testing.assert_allclose(np.diff(times), 0.01 / speed, rtol=1e-9)
    spread = sim(tmp_path / "spread", tiny_npz, "--clients", "4", "--steps", "2", "--speed-spread", "0.1",
                 "--seed", "5")
    assert json.loads((spread / "config.json").read_text())["speeds_used"] == client_speeds(5, 4, 0.1)


def test_a_run_wide_budget_lets_the_fast_clients_compute_the_slow_ones_share(tmp_path, tiny_npz):
    """Speeds 1, 1, 0.25, 0.25 and 40 steps: under the clients' budgets every client
    computes 40 and the run lasts as long as a slow client needs for them; under the
    run's the server stops everyone once 160 minibatches are in or under way (exactly
    160), most of them by the fast clients, and the run ends sooner. At equal speeds the
    run's budget is each client's 40."""
    flags = ["--clients", "4", "--client-speeds", "1,1,0.25,0.25", "--steps", "40"]
    each, shared = (sim(tmp_path / budget, tiny_npz, *flags, "--budget", budget) for budget in ("client", "run"))
    def computed(run) -> list[int]:
        return [sum(1 for r in rows(run, "clients") if r["client"] == c) for c in range(4)]
    assert computed(each) == [40] * 4
    fast, slow = computed(shared)[:2], computed(shared)[2:]
    assert sum(fast + slow) == 160 and min(fast) > 40 > max(slow)
    assert summary(shared)["minibatches"] == sum(fast + slow) and summary(shared)["status"] == "complete"
    assert summary(shared)["time_s"] < 0.5 * summary(each)["time_s"]
    assert computed(sim(tmp_path / "equal", tiny_npz, *flags[:2], "--n-sync", "2", "--steps", "40")) == [40] * 4


def test_an_async_failure_loses_the_window_and_goodput_counts_it_by_hand(tmp_path, tiny_npz):
    """Seed 2: client 0 fails after its minibatches 6 and 11, client 1 after 7 (the pure
    schedule says so). At n_sync 3 client 0 pushes 1-3, loses 4-6, pushes 7-9, loses
    10-11, pushes 12; client 1 pushes 1-3 and 4-6, loses 7, pushes 8-9 and 10-12: of 24
    minibatches 18 entered a step (the add rule applies every push), 6 were lost."""
    flags = ["--clients", "2", "--steps", "12", "--n-sync", "3", "--rule", "add", "--mtbf", "6",
             "--failure-length", "2", "--seed", "2"]
    run = sim(tmp_path / "run", tiny_npz, *flags)
    failures = Failures.for_run(RunConfig(mtbf=6, failure_length=2, seed=2), Stragglers(2, 2))
    assert failed(run) == {0: [6, 11], 1: [7]} == {c: failures.schedule(c, 12) for c in range(2)}
    lost = sorted((r["client"], r["step"]) for r in rows(run, "clients") if r.get("lost"))
    assert lost == [(0, 4), (0, 5), (0, 6), (0, 10), (0, 11), (1, 7)]
    s = summary(run)
    assert (s["minibatches"], s["minibatches_in_steps"], s["minibatches_lost"], s["failures"]) == (24, 18, 6, 3)
    assert s["goodput"] == 0.75 and s["pushes_applied"] == 7 and s["status"] == "complete"
    down = {(r["client"], r["step"]): r["down_s"] for r in rows(run, "clients") if r.get("failed")}
    assert list(down.values()) == pytest.approx([0.02] * 3)  # 2 base minibatch times of 0.01 s
    again = sim(tmp_path / "again", tiny_npz, *flags)
    assert (run / "clients.jsonl").read_bytes() == (again / "clients.jsonl").read_bytes()


SYNC = ["--mode", "sync", "--clients", "3", "--steps", "12", "--mtbf", "10", "--failure-length", "5"]


def test_sync_waits_for_a_failed_client_and_its_clock_grows_by_the_time_lost(tmp_path, tiny_npz):
    """Seed 5: client 1 fails at step 6, client 0 at step 11. Each step that waits takes
    the lost minibatch, 5 base times down and the minibatch again: 0.06 s more apiece."""
    run = sim(tmp_path / "fail", tiny_npz, *SYNC, "--seed", "5")
    plain = sim(tmp_path / "plain", tiny_npz, *SYNC[:6], "--seed", "5")
    assert failed(run) == {0: [11], 1: [6]}
    assert summary(run)["time_s"] == pytest.approx(summary(plain)["time_s"] + 2 * 0.06, rel=1e-9)
    per_step = [sum(1 for r in rows(run, "clients") if r["step"] == t and not r.get("lost")) for t in range(1, 13)]
    assert per_step == [3] * 12  # every client's gradient is in every step
    s = summary(run)
    assert (s["minibatches"], s["minibatches_in_steps"], s["minibatches_lost"]) == (38, 36, 2)
    assert s["goodput"] == pytest.approx(36 / 38)


def test_sync_with_a_backup_worker_goes_on_without_the_failed_client(tmp_path, tiny_npz):
    """Seed 2: client 0 fails at step 6 and is down for 5 base times: steps 7-11 go on
    without it (it computes nothing), at the pace of a run without failures; the other
    steps drop client 2 (equal times: the higher index). 31 minibatches computed: 24
    averaged, 6 dropped by the backup worker, 1 lost."""
    run = sim(tmp_path / "fail", tiny_npz, *SYNC, "--seed", "2", "--backup-workers", "1")
    plain = sim(tmp_path / "plain", tiny_npz, *SYNC[:6], "--seed", "2", "--backup-workers", "1")
    assert failed(run) == {0: [6]}
    assert summary(run)["time_s"] == pytest.approx(summary(plain)["time_s"], rel=1e-12)
    steps_of_0 = [r["step"] for r in rows(run, "clients") if r["client"] == 0]
    assert steps_of_0 == [1, 2, 3, 4, 5, 6, 12]
    s = summary(run)
    assert (s["minibatches"], s["minibatches_in_steps"], s["minibatches_lost"], s["gradients_dropped"]) == \
        (31, 24, 1, 6)
    assert s["goodput"] == pytest.approx(24 / 31)


def test_fresh_takes_steps_without_a_failed_client_once_it_is_overdue(tmp_path, tiny_npz):
    """Seed 5, equal speeds: client 1 fails at its minibatch 6, client 0 at 11. At overdue
    0 the server takes no step without it until it is back; at 3 it goes on with clients
    0 and 2 (steps client 1 has no push in) once 1 has computed for 3 times its mean. Every push
    is applied once or dropped as stale; goodput counts the minibatches in steps."""
    flags = ["--clients", "3", "--steps", "12", "--mtbf", "10", "--failure-length", "5", "--seed", "5"]
    runs = {overdue: sim(tmp_path / overdue, tiny_npz, *flags, "--overdue", overdue) for overdue in ("0", "3")}
    for overdue, run in runs.items():
        assert failed(run) == {0: [11], 1: [6]}
        down_at = next(r["time"] for r in rows(run, "clients") if r.get("failed") and r["client"] == 1)
        applied = [r for r in rows(run, "server") if "version" in r]
        back_at = next(r["time"] for r in applied if r["client"] == 1 and r["time"] > down_at)
        joined = {r["version"] for r in applied if r["client"] == 1}
        while_down = [r for r in applied if down_at < r["time"] < back_at and r["version"] not in joined]
        s = summary(run)
        assert s["pushes_sent"] == s["pushes_applied"] + s["pushes_dropped"] and s["minibatches"] == 36
        assert s["goodput"] == s["minibatches_in_steps"] / s["minibatches"] and s["minibatches_lost"] == 2
        if overdue == "0":
            assert while_down == []
        else:
            assert {r["client"] for r in while_down} == {0, 2} and len({r["version"] for r in while_down}) >= 3


LOCAL = ["--mode", "local-sgd", "--clients", "3", "--steps", "12", "--n-sync", "4", "--mtbf", "10",
         "--failure-length", "5"]


def test_local_sgd_loses_a_failed_clients_round_and_waits_for_it(tmp_path, tiny_npz):
    """Seed 5, as sync's: client 1 fails at step 6, client 0 at step 11. Rounds of 4: client
    1 loses step 5 and its failed try of 6, client 0 steps 9 and 10 and its try of 11; the
    steps before are not redone, so every (client, step) is kept once. Each failed step
    waits its 0.06 s as sync's does. 38 minibatches computed, 33 in averages."""
    run = sim(tmp_path / "fail", tiny_npz, *LOCAL, "--seed", "5")
    plain = sim(tmp_path / "plain", tiny_npz, *LOCAL[:8], "--seed", "5")
    assert failed(run) == {0: [11], 1: [6]}
    lost = [(r["client"], r["step"]) for r in rows(run, "clients") if r.get("lost")]
    assert sorted(lost) == [(0, 9), (0, 10), (0, 11), (1, 5), (1, 6)]
    kept = sorted((r["client"], r["step"]) for r in rows(run, "clients") if not r.get("failed"))
    assert kept == [(c, s) for c in range(3) for s in range(1, 13)]  # the round's lost rows too, once each
    assert summary(run)["time_s"] == pytest.approx(summary(plain)["time_s"] + 2 * 0.06, rel=1e-9)
    s = summary(run)
    assert (s["minibatches"], s["minibatches_in_steps"], s["minibatches_lost"], s["failures"]) == (38, 33, 5, 2)
    assert s["goodput"] == pytest.approx(33 / 38) and summary(plain)["goodput"] == 1
    before = [r for r in rows(run, "clients") if r["step"] <= 4]  # the first round is the plain run's
    assert before == [r for r in rows(plain, "clients") if r["step"] <= 4]


@pytest.mark.parametrize("mode", ["sync", "local-sgd"])
def test_a_lockstep_run_under_failures_resumed_from_a_checkpoint_ends_as_one_never_stopped(tmp_path, tiny_npz, mode):
    """Seed 2: client 0 fails at steps 6 and 11. Stopped at step 11, the run goes on from
    step 8 (local-sgd's average), each client's data order past its failed tries; the
    rows and the weights are those of the run that never stopped."""
    flags = ["--data", str(tiny_npz), *LOCAL, "--mode", mode, "--seed", "2", "--optimizer", "adamw",
             "--eval-every", "4"]
    assert train(*flags, "--out", str(tmp_path / "whole")) == 0
    assert train(*flags, "--out", str(tmp_path / "resumed"), "--inject-fault", "1:11") == 1
    assert train("--resume", str(tmp_path / "resumed")) == 0
    whole, resumed = (tmp_path / name for name in ("whole", "resumed"))
    assert failed(whole) == {0: [6, 11]}
    assert rows(resumed, "clients") == rows(whole, "clients")
    np.testing.assert_array_equal(np.load(resumed / "checkpoint" / "latest.npz")["weights"],
                                  np.load(whole / "checkpoint" / "latest.npz")["weights"])


def test_a_failed_local_sgd_client_computes_again_from_the_last_average_with_its_optimizer_afresh(tiny_npz):
    """Rounds of 2; client 1 fails at step 4: its minibatch again is computed at the
    weights of step 2's average, not its own of step 3, with a new optimizer; client 0
    goes on with its own."""
    data = load_dataset(str(tiny_npz))
    clients = []
    for i in range(2):
        replica = Replica(build_model("cnn", data.shape, data.num_classes, seed=0), lr=0.05, momentum=0.9,
                          weight_decay=0.0)
        clients.append(Client(replica, data.train, ShardSampler(shard_indices(len(data.train), 2, i, 0), 8, i, 0)))
    seen: list[torch.Tensor] = []  # the weights client 1 computes at
    compute = clients[1].compute
    clients[1].compute = lambda: (seen.append(clients[1].weights.clone()), compute())[1]
    lockstep, start = Lockstep(Mode.LOCAL_SGD, 4, n_sync=2, clients=2), RoundStart(clients[0].weights)
    def straggle(step, compute_s):
        return [Fate(True), Fate(True, lost=int(step == 4))]
    averaged = None
    for step in range(1, 5):
        optimizers = [client.optimizer for client in clients]
        outcomes = collective_step(clients, lockstep, step, mean_in_place, straggle, round_start=start)
        averaged = clients[0].weights.clone() if step == 2 else averaged
    assert [fate for _, fate in outcomes[1]] == ["lost", "kept"] and len(seen) == 5
    assert not torch.equal(seen[3], averaged) and torch.equal(seen[4], averaged)
    assert clients[1].optimizer is not optimizers[1] and clients[0].optimizer is optimizers[0]
    assert torch.equal(clients[0].weights, clients[1].weights) and torch.equal(start.weights, clients[0].weights)
