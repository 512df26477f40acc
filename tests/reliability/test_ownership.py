"""A run directory has one writer, a job ends with its command, a resume trusts nothing,
a run that did not train says so (issue 12).

Processes are launched as a user would (`asgd train`, `asgd sweep`) in sessions of their
own; every wait is a hang guard, never a speed claim.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from experiments.parent.tree import alive, descendants, kill_tree
from rundir.durable import load_arrays
from rundir.lock import FolderLock
from rundir.status import EXIT_DIVERGED, was_interrupted
from tests.conftest import BIN, ROOT, Started, each_logged_once, run_command, start
from tests.sim.test_sim import TIMED

pytestmark = pytest.mark.slow


def asgd(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return run_command([str(BIN / "asgd"), *args], timeout)


def sim(run: Path, data: Path, *flags: str) -> list[str]:
    return ["train", "--backend", "sim", *TIMED, "--data", str(data), "--out", str(run), "--quiet",
            "--clients", "2", "--eval-every", "4", *flags]


def rows(run: Path, log: str) -> list[dict]:
    return [json.loads(line) for line in (run / f"{log}.jsonl").read_text().splitlines()]


def status(run: Path) -> str:
    return json.loads((run / "summary.json").read_text())["status"]


def job_processes(marker: str) -> list[int]:
    """Processes (asgd, the launcher, ranks) whose command line names `marker`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found


def wait_for(condition, what: str, guard: float = 60) -> None:
    deadline = time.monotonic() + guard
    while not condition():
        assert time.monotonic() < deadline, f"hang guard: {what}"
        time.sleep(0.05)


def interrupt(args: list[str], ready, what: str, how: signal.Signals,
              below: list[int] | None = None) -> tuple[int, str]:
    """`asgd ARGS` in a session of its own (so SIGINT is not ignored), sent `how` once
    `ready()`; its exit status and stderr. `below`: gets the processes under it then."""
    job = start([str(BIN / "asgd"), *args])
    try:
        wait_for(ready, what)
        if below is not None:
            below += descendants(job.pid)
        job.send_signal(how)
        _, err = job.communicate(timeout=60)
    finally:
        job.kill()
    return job.returncode, err


def redone(run: Path) -> str:
    """What the interrupt's line says a resume runs again: the rows after the checkpoint."""
    arrays = load_arrays(run / "checkpoint" / "latest.npz")
    after = len(rows(run, "clients")) - int(arrays["lines"][1])
    return f" (from its checkpoint at minibatch {int(arrays['tally.counts'][0]):,}, running again the {after:,} " \
           "recorded after it)"


def checkpointed(run: Path) -> bool:
    """A checkpoint past the starting state (version 0, written before the first minibatch)."""
    try:
        return int(load_arrays(run / "checkpoint" / "latest.npz")["version"]) > 0
    except (OSError, ValueError, KeyError):  # not there yet
        return False


@pytest.fixture(scope="module")
def failed_once(tmp_path_factory, tiny_npz) -> Path:
    """One 2-client run failed at version 10 with a checkpoint at version 8 (one process
    start for the module; each test takes a copy of it)."""
    run = tmp_path_factory.mktemp("interrupted") / "run"
    failed = asgd(*sim(run, tiny_npz, "--steps", "12", "--inject-fault", "0:10"))
    assert failed.returncode == 1 and failed.stderr.count("\n") == 1 and "error.log" in failed.stderr
    return run


@pytest.fixture
def interrupted_run(failed_once, tmp_path) -> Path:
    """A copy of the failed run, this test's own (a copy resumes as its own folder:
    tests/reliability/test_record.py)."""
    return Path(shutil.copytree(failed_once, tmp_path / "run"))


def test_a_second_writer_is_refused_naming_the_holder(interrupted_run, tiny_npz, tmp_path):
    with FolderLock(interrupted_run):
        refused = asgd("train", "--resume", str(interrupted_run))
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1
        assert "is being written by pid" in refused.stderr
        spec = tmp_path / "spec.toml"
        spec.write_text(f'name = "s"\nbackend = "sim"\n[base]\nsteps = 4\ndata = "{tiny_npz}"\n'
                        f'[grid]\nclients = [1]\n')
    with FolderLock(tmp_path / "sweep"):
        sweep = asgd("sweep", str(spec), "--out", str(tmp_path / "sweep"))
        assert sweep.returncode == 2 and "is being written by pid" in sweep.stderr
    assert asgd("train", "--resume", str(interrupted_run)).returncode == 0  # free again: it finishes
    assert sorted((r["client"], r["step"]) for r in rows(interrupted_run, "clients")) == \
        [(c, s) for c in range(2) for s in range(1, 13)]


def test_resume_refuses_logs_that_lost_rows_and_a_checkpoint_without_checksum(interrupted_run):
    clients = interrupted_run / "clients.jsonl"
    whole = clients.read_bytes()
    clients.write_bytes(whole[:len(whole) // 2])  # torn mid-line, before the checkpoint's count
    torn = asgd("train", "--resume", str(interrupted_run))
    assert torn.returncode == 2 and torn.stderr.count("\n") == 1 and f"{clients} line" in torn.stderr
    clients.unlink()
    gone = asgd("train", "--resume", str(interrupted_run))
    assert gone.returncode == 2 and f"{clients} is missing" in gone.stderr
    clients.write_bytes(whole)
    checkpoint = interrupted_run / "checkpoint" / "latest.npz"
    np.savez(checkpoint, **load_arrays(checkpoint))  # the same arrays, without their checksum
    unsigned = asgd("train", "--resume", str(interrupted_run))
    assert unsigned.returncode == 2 and "no checksum" in unsigned.stderr


def test_a_resume_keeps_the_earlier_ending_on_record(interrupted_run):
    assert asgd("train", "--resume", str(interrupted_run)).returncode == 0
    [entry] = json.loads((interrupted_run / "config.json").read_text())["resumed"]
    assert entry["before"]["status"].startswith("failed: InjectedFault")


@pytest.mark.parametrize("flags, reason", [
    (["--lr", "1e10"], "diverged: "),
    (["--init", "NAN"], "diverged: "),
], ids=["huge lr", "NaN init"])
def test_a_run_that_did_not_train_does_not_say_complete(tmp_path, tiny_npz, flags, reason):
    if flags[1] == "NAN":
        nan = tmp_path / "nan.npz"
        good = tmp_path / "good"
        assert asgd(*sim(good, tiny_npz, "--steps", "2")).returncode == 0
        weights = load_arrays(good / "checkpoint" / "latest.npz")["weights"]
        np.savez(nan, weights=np.full_like(weights, np.nan))
        flags = ["--init", str(nan)]
    run = tmp_path / "run"
    result = asgd(*sim(run, tiny_npz, "--steps", "20", *flags))
    assert result.returncode == EXIT_DIVERGED and status(run).startswith(reason), status(run)


@pytest.mark.parametrize("checkpoints", [["--eval-every", "20"],  # at the curve's points
                                         ["--eval-every", "1000000", "--checkpoint-every", "0.3"]])  # between them
@pytest.mark.long
def test_sigterm_ends_the_whole_mpi_job_and_it_resumes_exactly(tmp_path, tiny_npz, checkpoints):
    run = tmp_path / "run"
    returncode, err = interrupt(["train", "--clients", "2", "--steps", "100000", "--data", str(tiny_npz),
                                 "--batch-size", "32", "--eval-samples", "50", *checkpoints, "--quiet",
                                 "--out", str(run)],
                                lambda: checkpointed(run), "a first checkpoint",
                                signal.SIGTERM)
    assert returncode == 130 and err.strip().splitlines() == \
        [f"asgd: run {run} interrupted; resume with: asgd train --resume {run}{redone(run)}"]
    wait_for(lambda: not job_processes(str(run)), "every process of the job gone")
    assert status(run).startswith("failed: interrupted")
    done = int(load_arrays(run / "checkpoint" / "latest.npz")["tally.client_steps"].sum())  # the run's budget's
    fewer = asgd("train", "--resume", str(run), "--steps", str(-(-done // 2) - 1))
    assert fewer.returncode == 2 and f"fewer than the {done} minibatches" in fewer.stderr
    more = -(-done // 2) + 4
    assert asgd("train", "--resume", str(run), "--steps", str(more), timeout=180).returncode == 0
    assert sum(each_logged_once([(r["client"], r["step"]) for r in rows(run, "clients")], 2)) == 2 * more


def test_sigkill_of_the_command_takes_its_job_down(tmp_path, tiny_npz):
    run = tmp_path / "run"
    job = training_job(run, tiny_npz)
    wait_for(lambda: (run / "clients.jsonl").exists(), "the job training")
    job.kill()
    job.wait()
    wait_for(lambda: not job_processes(str(run)), "every process of the job gone after SIGKILL of asgd")
    FolderLock(run).acquire().release()  # and the run is free to resume


@pytest.mark.long
def test_sigkill_of_the_command_ends_a_job_whose_launcher_passes_nothing_on(tmp_path, tiny_npz):
    """Hydra, sent SIGTERM, has now and then not passed it on, and its ranks trained on
    after asgd was SIGKILLed. The launcher stopped here, so it cannot: the lifeline
    between asgd and it kills every process below it once the grace time is over."""
    run = tmp_path / "run"
    job = training_job(run, tiny_npz)
    try:
        wait_for(lambda: (run / "clients.jsonl").exists(), "the job training")
        os.kill(launcher(job.pid), signal.SIGSTOP)
        job.kill()
        job.wait()
        wait_for(lambda: not job_processes(str(run)), "every process of the job gone after SIGKILL of asgd")
        FolderLock(run).acquire().release()
    finally:
        kill_tree(job.pid)


@pytest.mark.long
def test_the_batch_scripts_job_records_the_interruption_when_every_process_gets_sigterm(tmp_path, tiny_npz):
    """scancel sends SIGTERM to every process of a job at once (the batch script's mpiexec
    and the ranks alike; SIGKILL after KillWait). The docs' batch script, run here as
    Slurm runs it on one node and so signalled: the run records `interrupted` (MPICH's
    launcher, without the flags asgd gives it, killed the server as soon as a client
    ended: no summary)."""
    run = tmp_path / "run"
    env = {**os.environ, "SLURM_SUBMIT_DIR": str(ROOT), "SLURM_NTASKS": "3", "VENV": str(BIN.parent)}
    job = subprocess.Popen(["bash", str(ROOT / "examples" / "slurm" / "train.sbatch"), "--steps", "100000",
                            "--data", str(tiny_npz), "--batch-size", "32", "--eval-samples", "50", "--quiet",
                            "--out", str(run)], env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (run / "clients.jsonl").exists(), "the job training")
        for pid in [job.pid, *descendants(job.pid)]:
            os.kill(pid, signal.SIGTERM)
        _, err = job.communicate(timeout=60)
        wait_for(lambda: not job_processes(str(run)), "every process of the job gone")
        assert status(run) == "failed: interrupted (SIGTERM)", err
        FolderLock(run).acquire().release()  # the lock file left is free: a resume takes it over
    finally:
        kill_tree(job.pid)


@pytest.mark.long
def test_the_lock_is_held_until_the_last_process_of_the_job_is_gone(tmp_path, tiny_npz):
    """The launcher SIGKILLed alone: its ranks (Open MPI's cannot hold the lock's descriptor,
    and outlive their launcher by a second or so) are gone before asgd lets the lock go."""
    run = tmp_path / "run"
    job = training_job(run, tiny_npz)
    try:
        wait_for(lambda: (run / "clients.jsonl").exists(), "the job training")
        os.kill(launcher(job.pid), signal.SIGKILL)
        job.wait(timeout=60)
        assert job_processes(str(run)) == []
        FolderLock(run).acquire().release()
    finally:
        kill_tree(job.pid)


def training_job(run: Path, data) -> Started:
    """A self-launched `asgd train` of two clients that trains until it is stopped."""
    return start([str(BIN / "asgd"), "train", "--clients", "2", "--steps", "100000", "--data", str(data),
                  "--batch-size", "32", "--eval-samples", "50", "--quiet", "--out", str(run)])


def launcher(asgd: int) -> int:
    """The MPI launcher `asgd train` started, under its lifeline (experiments/parent/lifeline.py)."""
    [lifeline] = [pid for pid in descendants(asgd) if _parent(pid) == asgd]
    [started] = [pid for pid in descendants(lifeline) if _parent(pid) == lifeline]
    return started


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def long_sweep(tmp_path: Path, tiny_npz: Path) -> tuple[Path, Path]:
    """A simulated sweep of two points of 400 steps each, and its folder."""
    spec = tmp_path / "spec.toml"
    spec.write_text(f'name = "s"\nbackend = "sim"\ntimeout = 300\n[base]\nsteps = 400\ndata = "{tiny_npz}"\n'
                    f'batch_size = 32\neval_samples = 50\neval_every = 10\nsim_step_time = 0.01\n'
                    f'sim_apply_time = 0.001\n[grid]\nclients = [1, 2]\n')
    return spec, tmp_path / "out"


@pytest.mark.long
def test_an_interrupted_sweep_ends_its_point_and_goes_on_when_rerun(tmp_path, tiny_npz):
    spec, out = long_sweep(tmp_path, tiny_npz)
    below: list[int] = []
    returncode, err = interrupt(["sweep", str(spec), "--out", str(out), "--quiet", "--jobs", "1"],
                                lambda: list(out.glob("runs/*/checkpoint/latest.npz")), "a point's first checkpoint",
                                signal.SIGTERM, below)
    said = [line for line in err.strip().splitlines() if not line.startswith("asgd: warning: ")]  # the step timing's
    assert returncode == 130 and said == [f"asgd: sweep {out} interrupted; run the same command again to go on"]
    assert below  # the point (and the process it was forked from) ran under the sweep
    wait_for(lambda: not job_processes(str(out)) and not any(map(alive, below)), "the sweep's point gone")
    points = json.loads((out / "index.json").read_text())["points"]
    assert [p["status"] for p in points] == ["interrupted", "pending"]
    assert asgd("sweep", str(spec), "--out", str(out), "--quiet", timeout=300).returncode == 0
    for point in json.loads((out / "index.json").read_text())["points"]:
        assert sorted((r["client"], r["step"]) for r in rows(out / point["run"], "clients")) == \
            [(c, s) for c in range(point["clients"]) for s in range(1, 401)]


@pytest.mark.long
def test_sigkill_of_a_sweep_ends_its_point_which_records_the_interruption(tmp_path, tiny_npz):
    """The points are forked from a process the sweep started (experiments/parent/forked.py):
    none outlives the sweep, killed without a chance to stop them."""
    spec, out = long_sweep(tmp_path, tiny_npz)
    job = start([str(BIN / "asgd"), "sweep", str(spec), "--out", str(out), "--quiet", "--jobs", "1"])
    try:
        wait_for(lambda: list(out.glob("runs/*/checkpoint/latest.npz")), "a point's first checkpoint")
        below = descendants(job.pid)
        job.kill()
        job.wait()
    finally:
        job.kill()
    assert below
    wait_for(lambda: not any(map(alive, below)), "every process under the sweep gone after its SIGKILL")
    (run,) = [r.parent.parent for r in out.glob("runs/*/checkpoint/latest.npz")]
    assert was_interrupted(json.loads((run / "summary.json").read_text())["status"])  # by the SIGTERM it got
    FolderLock(run).acquire().release()  # and the point is free to resume


def test_ctrl_c_in_the_simulator_is_one_line_and_resumable(tmp_path, tiny_npz):
    run = tmp_path / "run"
    returncode, err = interrupt(sim(run, tiny_npz, "--steps", "100000"),
                                lambda: checkpointed(run), "a first checkpoint",
                                signal.SIGINT)
    assert returncode == 130 and err.strip().splitlines() == \
        [f"asgd: run {run} interrupted; resume with: asgd train --resume {run}{redone(run)}"]
    assert status(run) == "failed: interrupted"
    steps = int(load_arrays(run / "checkpoint" / "latest.npz")["tally.client_steps"].max()) + 4
    assert asgd("train", "--resume", str(run), "--steps", str(steps)).returncode == 0
    assert sorted((r["client"], r["step"]) for r in rows(run, "clients")) == \
        [(c, s) for c in range(2) for s in range(1, steps + 1)]
