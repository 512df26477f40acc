"""A record that never lies (issue 25): however a resume is asked for it is checked; the
data a run trained on is fingerprinted and verified; a sweep folder is bound to its spec;
a run is resumable from its first step; damaged records are refused in one line.

Runs are simulated in process where that shows the finding, launched as a user would
where it takes a process (another folder, a signal, mpiexec); every wait is a hang guard.
"""
from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest

from experiments.cli import main
from tests.conftest import BIN, assert_logged_once, make_tiny_npz, run_command
from tests.reliability.test_ownership import interrupt, job_processes, rows, status, wait_for
from tests.reliability.test_refusals import refused
from tests.sim.test_sim import TIMED


def sim_run(run: Path, data: Path, *flags: str) -> int:
    """A 2-client simulated run into `run` (in process)."""
    return main(["train", "--backend", "sim", *TIMED, "--rule", "easgd", "--data", str(data), "--out", str(run),
                 "--clients", "2", *flags])


def failed_run(tmp_path: Path, data: Path, capsys) -> Path:
    """A 2-client run that failed at version 10, with a checkpoint at version 8 (its line
    taken from `capsys`)."""
    run = tmp_path / "run"
    assert sim_run(run, data, "--steps", "12", "--eval-every", "4", "--inject-fault", "0:10") == 1
    capsys.readouterr()
    return run


# 1. One door into a resume

def test_a_resume_key_in_a_config_file_goes_through_the_resume_checks(capsys, tmp_path, tiny_npz):
    run = failed_run(tmp_path, tiny_npz, capsys)
    config = tmp_path / "res.toml"
    config.write_text(f'resume = "{run}"\nlr = 0.5\n')
    assert "resume: lr cannot change" in refused(capsys, "train", str(config))
    config.write_text(f'resume = "{run}"\nrule = "add"\n')
    assert "resume: rule cannot change" in refused(capsys, "train", str(config))
    assert json.loads((run / "config.json").read_text())["lr"] == 0.01


def test_a_config_file_beside_resume_is_checked_key_by_key(capsys, tmp_path, tiny_npz):
    run = failed_run(tmp_path, tiny_npz, capsys)
    config = tmp_path / "chg.toml"
    config.write_text("batch_size = 16\n")
    assert "resume: batch_size cannot change" in refused(capsys, "train", str(config), "--resume", str(run))
    config.write_text("batch_size = 32\nsteps = 14\nquiet = true\n")  # the run's own value, and what may change
    assert main(["train", str(config), "--resume", str(run)]) == 0
    assert_logged_once(run, clients=2, steps=14, versions=28)


# 2. Data fingerprinted

def test_data_changed_under_the_same_path_is_refused_on_resume(capsys, tmp_path):
    data = make_tiny_npz(tmp_path / "d.npz")
    run = failed_run(tmp_path, data, capsys)
    [recorded] = json.loads((run / "config.json").read_text())["data_fingerprint"]["files"]
    assert recorded["path"] == str(data.resolve()) and recorded["size"] == data.stat().st_size
    make_tiny_npz(data, seed=1)  # other samples, the same shape and size
    err = refused(capsys, "train", "--resume", str(run))
    assert "data:" in err and str(data) in err and "differs from" in err


def test_a_relative_data_path_is_resumed_from_another_folder_on_the_runs_own_file(tmp_path):
    first, other = tmp_path / "first", tmp_path / "other"
    first.mkdir()
    other.mkdir()
    make_tiny_npz(first / "d.npz")
    make_tiny_npz(other / "d.npz", n=512, seed=1)  # another d.npz where the resume is typed
    run = tmp_path / "run"
    asgd = [str(BIN / "asgd"), "train"]
    failed = run_command([*asgd, "--backend", "sim", *TIMED, "--rule", "easgd", "--data", "d.npz", "--out", str(run),
                          "--clients", "2", "--steps", "12", "--eval-every", "4", "--inject-fault", "0:10"],
                         120, cwd=first)
    assert failed.returncode == 1, failed.stderr
    assert json.loads((run / "config.json").read_text())["data"] == str((first / "d.npz").resolve())
    resumed = run_command([*asgd, "--resume", str(run)], 120, cwd=other)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((run / "config.json").read_text())["train_size"] == 692  # 768 less the 10% held out
    assert_logged_once(run, clients=2, steps=12, versions=24)


# 3. A sweep folder bound to its spec

def sweep_spec(path: Path, data: Path, base: str, clients: str) -> Path:
    path.write_text(f'name = "s"\nbackend = "sim"\ntimeout = 120\n[base]\ndata = "{data}"\nbatch_size = 32\n'
                    f'eval_samples = 50\nsim_step_time = 0.01\nsim_apply_time = 0.0001\n{base}'
                    f'[grid]\nclients = {clients}\n')
    return path


def test_a_sweep_folder_refuses_a_changed_spec_naming_the_key(capsys, tmp_path, tiny_npz):
    spec, out = tmp_path / "spec.toml", tmp_path / "out"
    sweep_spec(spec, tiny_npz, "steps = 4\nlr = 0.01\n", "[1]")
    assert main(["sweep", str(spec), "--out", str(out), "--quiet"]) == 0
    kept = (out / "spec.toml").read_text()
    capsys.readouterr()  # the sweep's own lines
    sweep_spec(spec, tiny_npz, "steps = 4\nlr = 0.05\n", "[1]")
    assert "adds none (lr)" in refused(capsys, "sweep", str(spec), "--out", str(out))
    sweep_spec(spec, tiny_npz, "steps = 4\nlr = 0.01\n", "[2]")  # its point dropped
    assert "grid.clients" in refused(capsys, "sweep", str(spec), "--out", str(out))
    assert (out / "spec.toml").read_text() == kept


def test_a_sweep_that_only_adds_points_keeps_each_points_own_settings(capsys, tmp_path, tiny_npz):
    spec, out = tmp_path / "spec.toml", tmp_path / "out"
    sweep_spec(spec, tiny_npz, "steps = 8\nlr = 0.01\n", "[1]")
    assert main(["sweep", str(spec), "--out", str(out), "--quiet"]) == 0
    sweep_spec(spec, tiny_npz, "steps = 4\nlr = 0.05\n", "[1, 2]")  # a new point, at other settings
    assert main(["sweep", str(spec), "--out", str(out), "--quiet"]) == 0
    points = {p["clients"]: p for p in json.loads((out / "index.json").read_text())["points"]}
    for clients, steps, lr in ((1, 8, 0.01), (2, 4, 0.05)):
        config = json.loads((out / points[clients]["run"] / "config.json").read_text())
        entry = points[clients]
        assert (entry["steps"], entry["config"]["lr"]) == (config["steps"], config["lr"]) == (steps, lr)
    capsys.readouterr()  # the sweeps' own lines
    err = refused(capsys, "report", str(out))
    assert "lr" in err and "differ" in err


def test_index_json_says_which_points_are_running(tmp_path, tiny_npz):
    spec, out = tmp_path / "spec.toml", tmp_path / "out"
    sweep_spec(spec, tiny_npz, "steps = 100000\n", "[1]")

    def running() -> bool:
        index = out / "index.json"
        return index.exists() and [p["status"] for p in json.loads(index.read_text())["points"]] == ["running"]
    returncode, _ = interrupt(["sweep", str(spec), "--out", str(out), "--quiet"], running, "a point running",
                              signal.SIGTERM)
    assert returncode == 130
    wait_for(lambda: not job_processes(str(out)), "the sweep's point gone")
    assert [p["status"] for p in json.loads((out / "index.json").read_text())["points"]] == ["interrupted"]


# 4. Resumable from the first step

@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.long
def test_ctrl_c_before_the_first_periodic_checkpoint_resumes_every_step_once(tmp_path, tiny_npz):
    run = tmp_path / "run"
    returncode, _ = interrupt(["train", "--rule", "easgd", "--clients", "2", "--steps", "300", "--data", str(tiny_npz),
                               "--batch-size", "32", "--eval-samples", "50", "--eval-every", "100000", "--quiet",
                               "--out", str(run)],
                              lambda: (run / "clients.jsonl").exists() and (run / "clients.jsonl").stat().st_size,
                              "a first minibatch logged", signal.SIGINT)
    assert returncode == 130
    wait_for(lambda: not job_processes(str(run)), "every process of the job gone")
    assert status(run).startswith("failed: interrupted")
    resumed = run_command([str(BIN / "asgd"), "train", "--quiet", "--resume", str(run)], 180)
    assert resumed.returncode == 0, resumed.stderr
    assert_logged_once(run, clients=2, steps=300, versions=600)


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_a_run_checkpoints_its_starting_state(tmp_path, tiny_npz, mode):
    from rundir.checkpoint import Checkpoint
    from rundir.layout import RunDir

    run = tmp_path / "run"
    assert sim_run(run, tiny_npz, "--mode", mode, "--steps", "12", "--eval-every", "100",
                   "--inject-fault", "0:1" if mode == "async" else "1:1") == 1
    start = Checkpoint.load(RunDir(run))
    assert start.version == 0 and list(start.client_steps) == [0, 0] and start.lines == (0, 0)
    assert main(["train", "--resume", str(run)]) == 0
    assert sorted((r["client"], r["step"]) for r in rows(run, "clients")) == \
        [(c, s) for c in range(2) for s in range(1, 13)]


# 5. Smaller

def test_a_summary_of_other_keys_is_refused_in_one_line_by_the_report(capsys, tmp_path):
    (tmp_path / "summary.json").write_text('{"x": 1}')
    (tmp_path / "config.json").write_text(json.dumps({"steps": 1}))
    assert "summary.json" in refused(capsys, "report", str(tmp_path))


def test_more_clients_than_samples_is_refused_naming_clients(capsys, tiny_npz, tmp_path):
    err = refused(capsys, "train", "--backend", "sim", "--data", str(tiny_npz), "--clients", "800",
                  "--out", str(tmp_path / "run"))
    assert err.startswith("asgd: error: clients:"), err


def test_a_resumed_copy_of_a_run_records_its_own_folder(capsys, tmp_path, tiny_npz):
    run = failed_run(tmp_path, tiny_npz, capsys)
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    assert main(["train", "--resume", str(copy), "--quiet"]) == 0
    assert json.loads((copy / "config.json").read_text())["out"] == str(copy)
