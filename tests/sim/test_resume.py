"""Resume: a run that died part-way finishes with every minibatch and push logged once."""
from __future__ import annotations

import json

import numpy as np
import pytest

from experiments.cli import main
from tests.conftest import assert_logged_once
from tests.sim.test_sim import TIMED, rows


def train(*flags: str) -> int:
    return main(["train", "--backend", "sim", *TIMED, *flags])


def test_async_run_killed_by_a_fault_resumes_then_extends(tmp_path, tiny_npz):
    run = tmp_path / "run"
    assert train("--data", str(tiny_npz), "--out", str(run), "--rule", "easgd", "--clients", "3", "--steps", "12",
                 "--n-sync", "2", "--eval-every", "4", "--inject-fault", "0:10") == 1  # one line; the trace in error.log
    assert json.loads((run / "summary.json").read_text())["status"].startswith("failed")
    assert len(rows(run, "server")) == 10  # logged past the checkpoint at version 8: cut back on resume
    assert train("--resume", str(run)) == 0
    assert_logged_once(run, clients=3, steps=12, versions=18)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["pushes_sent"] == summary["pushes_applied"] == 18
    assert sum(summary["staleness"]["histogram"].values()) == 18
    evals = [r["version"] for r in rows(run, "eval")]
    assert evals == sorted(set(evals)) and evals[0] == 0 and evals[-1] == 18
    config = json.loads((run / "config.json").read_text())
    assert len(config["resumed"]) == 1

    assert train("--resume", str(run), "--steps", "16") == 0  # extend the finished run
    assert_logged_once(run, clients=3, steps=16, versions=24)
    assert main(["train", "--resume", str(run)]) == 2  # complete, nothing to do


def test_a_run_wide_budget_resumes_to_the_runs_minibatches_each_logged_once(tmp_path, tiny_npz):
    """Under budget = run the fast client has run 11 minibatches of its 8 steps at the
    checkpoint (version 13): the resume takes that, and goes on to the run's 16 (with the
    push under way, one more)."""
    run = tmp_path / "run"
    assert train("--data", str(tiny_npz), "--out", str(run), "--rule", "easgd", "--clients", "2", "--client-speeds",
                 "1,0.25", "--steps", "8", "--budget", "run", "--eval-every", "4", "--inject-fault", "0:14") == 1
    assert train("--resume", str(run)) == 0
    steps = {c: [r["step"] for r in rows(run, "clients") if r["client"] == c] for c in range(2)}
    assert all(s == list(range(1, len(s) + 1)) for s in steps.values())
    assert 16 <= len(steps[0]) + len(steps[1]) <= 17 and len(steps[0]) > 8 > len(steps[1])
    assert json.loads((run / "summary.json").read_text())["status"] == "complete"


@pytest.mark.parametrize("mode", ["sync", "local-sgd"])
def test_collective_run_resumes_from_its_checkpoint(tmp_path, tiny_npz, mode):
    run = tmp_path / "run"
    assert train("--data", str(tiny_npz), "--out", str(run), "--mode", mode, "--clients", "2", "--steps", "10",
                 "--n-sync", "2", "--eval-every", "2", "--inject-fault", "1:7") == 1
    assert train("--resume", str(run)) == 0
    assert sorted((r["client"], r["step"]) for r in rows(run, "clients")) == \
        [(c, s) for c in range(2) for s in range(1, 11)]
    assert json.loads((run / "summary.json").read_text())["status"] == "complete"


def test_resume_refuses_changed_settings(tmp_path, tiny_npz, capsys):
    run = tmp_path / "run"
    assert train("--data", str(tiny_npz), "--out", str(run), "--clients", "2", "--steps", "2") == 0
    assert main(["train", "--resume", str(run), "--lr", "0.5"]) == 2
    assert "resume: lr cannot change" in capsys.readouterr().err
    assert main(["train", "--resume", str(tmp_path / "nowhere")]) == 2


def test_resume_from_a_corrupt_checkpoint_exits_2(tmp_path, tiny_npz, capsys):
    run = tmp_path / "run"
    assert train("--data", str(tiny_npz), "--out", str(run), "--clients", "2", "--steps", "2") == 0
    checkpoint = run / "checkpoint" / "latest.npz"
    data = bytearray(checkpoint.read_bytes())
    data[len(data) // 2] ^= 0xFF
    checkpoint.write_bytes(bytes(data))
    assert main(["train", "--resume", str(run), "--steps", "4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "resume:" in err and "latest.npz" in err


@pytest.mark.parametrize("mode,optimizer", [("sync", "sgd"), ("sync", "adamw"), ("local-sgd", "adamw")])
def test_a_collective_run_resumes_with_its_clients_optimizer_state(tmp_path, tiny_npz, mode, optimizer):
    """The optimizer state in the checkpoint: one for all in sync mode (they step alike),
    each client's own in local-sgd. A run stopped at step 7 (local-sgd: back to its
    averaging step 6) and resumed ends with the very weights of one that never stopped
    (SGD's momentum buffer, AdamW's moments and step)."""
    flags = ["--data", str(tiny_npz), "--mode", mode, "--clients", "2", "--steps", "10", "--eval-every", "2",
             "--n-sync", "2", "--optimizer", optimizer]
    assert train(*flags, "--out", str(tmp_path / "whole")) == 0
    assert train(*flags, "--out", str(tmp_path / "resumed"), "--inject-fault", "1:7") == 1
    assert train("--resume", str(tmp_path / "resumed")) == 0
    whole, resumed = (np.load(tmp_path / name / "checkpoint" / "latest.npz") for name in ("whole", "resumed"))
    assert int(resumed["version"]) == 10
    np.testing.assert_array_equal(resumed["weights"], whole["weights"])
    prefix = "optimizer." if mode == "sync" else "client_optimizer.1."
    assert any(key.startswith(prefix) for key in resumed.files)


def test_an_async_run_resumes_with_each_clients_optimizer_state(tmp_path, tiny_npz):
    """Each client's AdamW state in the checkpoint, at the step it records for that
    client (Adam counts its steps: the two agree), and back on the client after a resume:
    at the end every client's optimizer has counted all its steps, not those since."""
    from rundir.checkpoint import Checkpoint
    from rundir.layout import RunDir

    run = tmp_path / "run"
    assert train("--data", str(tiny_npz), "--out", str(run), "--clients", "3", "--steps", "12", "--eval-every", "4",
                 "--rule", "add", "--optimizer", "adamw", "--inject-fault", "0:10") == 1
    stopped = Checkpoint.load(RunDir(run))
    assert 0 < stopped.version < 10 and sorted(stopped.client_optimizers) == [0, 1, 2]
    assert [int(stopped.client_optimizers[c]["state.0.step"]) for c in range(3)] == stopped.client_steps.tolist()
    assert train("--resume", str(run)) == 0
    assert_logged_once(run, clients=3, steps=12, versions=36)
    final = Checkpoint.load(RunDir(run))
    assert [int(final.client_optimizers[c]["state.0.step"]) for c in range(3)] == [12] * 3


def checkpoint_of(run) -> "Checkpoint":
    from rundir.checkpoint import Checkpoint
    from rundir.layout import RunDir
    return Checkpoint.load(RunDir(run))


@pytest.mark.parametrize("every", ["0", "0.03"])
def test_a_checkpoint_is_taken_between_curve_points_so_a_resume_redoes_little(tmp_path, tiny_npz, capsys, every):
    """Curve points far apart (none between the start and the end): without
    checkpoint_every the run failing at version 20 goes on from version 0; with it, from
    at most checkpoint_every of the run's (virtual) clock before the failure, and the
    console says how much a resume runs again."""
    run = tmp_path / "run"
    assert train("--data", str(tiny_npz), "--out", str(run), "--clients", "2", "--steps", "24", "--eval-every", "48",
                 "--rule", "add", "--checkpoint-every", every, "--inject-fault", "0:20") == 1
    stopped, server = checkpoint_of(run), [r for r in rows(run, "server") if "version" in r]
    # no curve point after version 0 (that one is measured on the live curve's thread, which
    # a loaded host may not reach before the fault): the checkpoints are all checkpoint_every's
    assert server[-1]["version"] == 20 and [r["version"] for r in rows(run, "eval")] in ([], [0])
    after = len(rows(run, "clients")) - stopped.lines[1]
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith(f"; resume with: asgd train --resume {run} (from its checkpoint at minibatch "
                        f"{stopped.counts[0]}, running again the {after} recorded after it)")
    if every == "0":
        assert stopped.version == 0 and after == 20
        return
    # a version every 0.005 s (2 clients, 0.01 s a step): 6 per checkpoint_every
    assert 20 - 7 <= stopped.version <= 20 and server[-1]["time"] - stopped.time <= 0.03 + 0.01
    assert train("--resume", str(run)) == 0
    assert_logged_once(run, clients=2, steps=24, versions=48)


@pytest.mark.parametrize("mode,optimizer", [("sync", "adamw"), ("local-sgd", "adamw"), ("sync", "sgd")])
def test_a_collective_run_resumed_from_a_checkpoint_between_curve_points_ends_as_one_never_stopped(
        tmp_path, tiny_npz, mode, optimizer):
    flags = ["--data", str(tiny_npz), "--mode", mode, "--clients", "2", "--steps", "12", "--eval-every", "100",
             "--n-sync", "2", "--optimizer", optimizer, "--checkpoint-every", "0.025"]
    assert train(*flags, "--out", str(tmp_path / "whole")) == 0
    assert train(*flags, "--out", str(tmp_path / "resumed"), "--inject-fault", "1:9") == 1
    stopped = checkpoint_of(tmp_path / "resumed")
    assert 0 < stopped.version < 9 and (mode == "sync" or stopped.version % 2 == 0)  # local-sgd: averaged steps
    assert not (tmp_path / "resumed" / "snapshots" / f"{stopped.version}.npz").exists()  # no curve point there
    assert train("--resume", str(tmp_path / "resumed")) == 0
    whole, resumed = (np.load(tmp_path / name / "checkpoint" / "latest.npz") for name in ("whole", "resumed"))
    np.testing.assert_array_equal(resumed["weights"], whole["weights"])
    assert [r["version"] for r in rows(tmp_path / "resumed", "eval")] == [0, 12]


def test_an_async_checkpoint_between_curve_points_waits_for_each_clients_optimizer_state(tmp_path, tiny_npz):
    run = tmp_path / "run"
    assert train("--data", str(tiny_npz), "--out", str(run), "--clients", "3", "--steps", "12", "--eval-every", "100",
                 "--rule", "add", "--optimizer", "adamw", "--checkpoint-every", "0.03", "--inject-fault", "0:30") == 1
    stopped = checkpoint_of(run)
    assert 0 < stopped.version <= 30 and sorted(stopped.client_optimizers) == [0, 1, 2]
    assert [int(stopped.client_optimizers[c]["state.0.step"]) for c in range(3)] == stopped.client_steps.tolist()
    assert train("--resume", str(run)) == 0
    assert_logged_once(run, clients=3, steps=12, versions=36)


def test_a_run_resumes_at_the_defaults_it_ran_though_its_rule_has_changed_them(tmp_path, tiny_npz, monkeypatch):
    """A rule's default may change between versions (adagrad's lr did): a resumed run goes
    on at the value its config.json records, not at today's."""
    from experiments.run.resume import resumed_config
    from paramserver.rules import AdagradRule

    run = tmp_path / "run"
    assert train("--data", str(tiny_npz), "--out", str(run), "--rule", "adagrad", "--clients", "2", "--steps", "4") == 0
    monkeypatch.setitem(AdagradRule.DEFAULTS, "server_lr", 0.5)
    assert resumed_config({"resume": str(run), "steps": 6}).effective_server_lr == 0.01
    assert train("--resume", str(run), "--steps", "6") == 0
