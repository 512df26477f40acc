"""The run directory: its one reader (records, status, rows), its lock, its snapshots."""
from __future__ import annotations

import os

import numpy as np
import pytest

from rundir.layout import RunDir
from rundir.lock import FolderLock, LockHeld, RunDirError
from rundir.summary import write_result


def test_records_status_and_rows(tmp_path):
    run = RunDir(tmp_path / "run")
    run.create()
    assert run.summary() == {} and run.status() is None and run.rows("clients") == []
    write_result(run, "complete", {"test_error": 0.1}, 1.0, "wall", {})
    with run.writer("clients") as log:
        log.write_many([{"client": 0, "step": 1}, {"client": 0, "step": 2}])
    assert run.status() == "complete" and [r["step"] for r in run.rows("clients")] == [1, 2]


@pytest.mark.parametrize("text", ["{not json", "[1, 2]"])
def test_a_damaged_record_is_refused_in_one_line_and_has_no_status(tmp_path, text):
    run = RunDir(tmp_path)
    (tmp_path / "summary.json").write_text(text)
    with pytest.raises(RunDirError, match="summary.json"):
        run.summary()
    assert run.status() is None


def test_a_released_lock_leaves_no_file_and_a_killed_holders_file_is_taken_over(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "lock").write_text("pid 1 on a host that was killed\n")  # no flock on it any more
    lock = FolderLock(tmp_path / "run").acquire()
    with pytest.raises(LockHeld, match=f"pid {os.getpid()} "):
        FolderLock(tmp_path / "run").acquire()
    lock.release()
    assert (tmp_path / "run").is_dir() and not (tmp_path / "run" / "lock").exists()


def test_the_lock_and_its_file_stay_while_a_process_given_its_descriptor_lives(tmp_path):
    """A rank that inherited the descriptor (MPICH's) and outlives the job's end keeps the run
    protected: the file is removed only by a release that finds nobody holding it."""
    lock = FolderLock(tmp_path / "run").acquire()
    rank = os.dup(lock.fd)  # the same open file, as a child process holds it
    lock.release()
    with pytest.raises(LockHeld):
        FolderLock(tmp_path / "run").acquire()
    os.close(rank)
    FolderLock(tmp_path / "run").acquire().release()
    assert not (tmp_path / "run" / "lock").exists()


def test_the_last_snapshot_dropped_takes_its_folder_and_a_new_one_makes_it_again(tmp_path):
    run = RunDir(tmp_path / "run")
    run.create()
    for version in (1, 2):
        run.save_snapshot(np.zeros(3, np.float32), version=version, time=0.0, minibatches=version)
    first, second = (path for _, path in run.snapshots())
    run.drop_snapshot(first)
    assert run.snapshot_dir.is_dir()
    run.drop_snapshot(second)
    assert not run.snapshot_dir.exists() and run.snapshots() == []
    run.save_snapshot(np.zeros(3, np.float32), version=3, time=0.0, minibatches=3)
    assert [version for version, _ in run.snapshots()] == [3]
