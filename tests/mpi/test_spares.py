"""Spare ranks over MPI (`--spares N`): started with the job, a spare joins when a client
is lost under continue, or is told to end; and the simulator admits the same spare."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from experiments.cli import main
from tests.conftest import BIN, each_logged_once, mpi_train, run_command

pytestmark = [pytest.mark.mpi, pytest.mark.slow]
# client 1 (rank 2) fails at its step 5, its 4 pushed; under each client's budget every count is fixed
SPARED = ["--clients", "2", "--spares", "1", "--on-client-failure", "continue", "--steps", "100", "--budget",
          "client", "--batch-size", "32", "--eval-samples", "50", "--device", "cpu"]
FAULT = ["--inject-fault", "2:5"]


def rows(run: Path, log: str) -> list[dict]:
    return [json.loads(line) for line in (run / f"{log}.jsonl").read_text().splitlines()]


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def what_joined(run: Path) -> tuple:
    """Who was lost and who joined in its place, on which shard, and each client's minibatches."""
    s = summary(run)
    lost = [(c["client"], c["rank"], c["last_step"]) for c in s["lost_clients"]]
    joined = [(c["client"], c["rank"], c["slot"], c["spare_for"]) for c in s["joined_clients"]]
    return lost, joined, Counter(r["client"] for r in rows(run, "clients"))


@pytest.fixture(scope="module")
def spared_run(tmp_path_factory, tiny_npz) -> tuple[Path, str]:
    """`asgd train --spares 1` (self-launched: 4 ranks) with client 1 failing; its stderr."""
    run = tmp_path_factory.mktemp("spares") / "run"
    result = run_command([str(BIN / "asgd"), "train", "--quiet", "--data", str(tiny_npz), *SPARED, *FAULT,
                          "--out", str(run)], timeout=240)
    assert result.returncode == 0, result.stderr
    return run, result.stderr


@pytest.mark.long
def test_a_spare_joins_as_a_new_client_on_the_lost_clients_shard_and_the_run_completes(spared_run):
    run, err = spared_run
    s = summary(run)
    assert s["status"] == "complete" and s["spares_left"] == 0
    [lost] = s["lost_clients"]
    assert (lost["client"], lost["rank"], lost["last_step"]) == (1, 2, 4) and "InjectedFault" in lost["reason"]
    [joined] = s["joined_clients"]
    assert (joined["client"], joined["rank"], joined["slot"], joined["spare_for"]) == (2, 3, 1, 1)
    ran = each_logged_once([(r["client"], r["step"]) for r in rows(run, "clients")], 3)
    assert ran == [100, 4, 96] and s["minibatches"] == 200  # the spare ran what client 1 had left of its shard
    assert "asgd: client 1 lost; spare rank 3 joins as client 2\n" in err
    assert json.loads((run / "config.json").read_text())["spares"] == 1


@pytest.mark.long
def test_the_simulator_admits_the_same_spare_for_the_same_fault(spared_run, tiny_npz, tmp_path):
    sim = tmp_path / "sim"
    assert main(["train", "--backend", "sim", "--quiet", "--data", str(tiny_npz), *SPARED, *FAULT,
                 "--out", str(sim)]) == 0
    assert what_joined(sim) == what_joined(spared_run[0])


@pytest.mark.long
def test_a_spare_no_client_needed_is_told_to_end_and_the_run_completes(tmp_path, tiny_npz):
    """Typed as a user types it: mpiexec -n K+1+N."""
    run = tmp_path / "run"
    result = mpi_train(4, "--data", str(tiny_npz), *SPARED[:6], "--steps", "20", *SPARED[8:], "--out", str(run))
    assert result.returncode == 0, result.stderr
    s = summary(run)
    assert s["status"] == "complete" and s["spares_left"] == 1 and s["joined_clients"] == []
    assert each_logged_once([(r["client"], r["step"]) for r in rows(run, "clients")], 2) == [20, 20]


def test_with_two_servers_a_spare_joins_every_server_as_the_simulator_says(tmp_path, tiny_npz):
    """Server 0 lets the spare in and tells server 1 (its `Seated` word, in its order),
    which grows by it; the spare pulls from both and trains on: client 1 (rank 3) fails
    at its step 5, the spare runs what its shard had left, every row once, and the
    simulator with two servers admits the same spare."""
    flags = ["--data", str(tiny_npz), *SPARED[:6], "--steps", "40", *SPARED[8:], "--servers", "2",
             "--inject-fault", "3:5"]
    result = run_command([str(BIN / "asgd"), "train", "--quiet", *flags, "--out", str(tmp_path / "run")], timeout=240)
    assert result.returncode == 0, result.stderr  # self-launched: a lost client's exit status is not the run's
    s = summary(tmp_path / "run")
    assert s["status"] == "complete" and s["spares_left"] == 0 and s["minibatches"] == 80
    lost, joined, ran = what_joined(tmp_path / "run")
    assert (lost, joined) == ([(1, 3, 4)], [(2, 4, 1, 1)]) and [ran[c] for c in range(3)] == [40, 4, 36]
    each_logged_once([(r["client"], r["step"]) for r in rows(tmp_path / "run", "clients")], 3)
    assert main(["train", "--backend", "sim", "--quiet", *flags, "--out", str(tmp_path / "sim")]) == 0
    assert what_joined(tmp_path / "sim")[1:] == (joined, ran)
