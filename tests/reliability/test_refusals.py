"""Bad input found before anything runs: exit 2 and one line, in both backends (issue 12,
finding 5). In process, except the two that need a real mpiexec."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from experiments.cli import main
from tests.conftest import BIN, MPIEXEC, run_command


def refused(capsys, *argv: str) -> str:
    """The one line of a refusal (exit 2)."""
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("asgd: error: "), err
    return err


CASES = {
    "a model too big for the images": (["--model", "convnet"], "model: a forward pass on data of shape"),
    "a GPU that is not there": pytest.param(["--device", "cuda"], "device: cuda asked for, but torch finds no CUDA GPU",
                                            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here")),
    "a device misspelt": (["--device", "cudaXYZ"], "device: expected auto, cpu or cuda[:N]"),
    "an output under a file": (["--out", "/dev/null/x"], "out: cannot create /dev/null/x"),
    "an output in /proc": (["--out", "/proc/x"], "out: cannot create /proc/x"),
    "a data_dir for other data": (["--data-dir", "/nowhere"], "data_dir: only for --data fashion-mnist"),
}


@pytest.mark.parametrize("backend", ["sim", "mpi"])
@pytest.mark.parametrize("flags, message", CASES.values(), ids=CASES.keys())
def test_bad_input_is_one_line_before_launch(capsys, tiny_npz, backend, flags, message):
    base = ["train", "--backend", backend, "--data", str(tiny_npz), "--batch-size", "32", "--steps", "2"]
    assert message in refused(capsys, *base, *flags)


def test_a_label_that_is_no_class_index_is_refused(capsys, tmp_path, tiny_npz):
    arrays = dict(np.load(tiny_npz))
    arrays["y"][0] = 10 ** 9  # a 10^9-way classifier would not fit in memory on any rank
    data = tmp_path / "huge.npz"
    np.savez(data, **arrays)
    assert "has the label 1000000000" in refused(capsys, "train", "--data", str(data), "--backend", "sim")


def test_a_fashion_mnist_folder_that_lacks_the_files_is_not_looked_past(capsys, tmp_path):
    assert f"data_dir: {tmp_path} lacks" in refused(capsys, "train", "--data-dir", str(tmp_path), "--backend", "sim")


def test_a_sweep_spec_typo_and_a_damaged_index_are_one_line(capsys, tmp_path, tiny_npz):
    spec = tmp_path / "spec.toml"
    spec.write_text(f'name = "s"\nbackend = "sim"\n[base]\nstepz = 3\ndata = "{tiny_npz}"\n[grid]\nclients = [1]\n')
    assert "[base]: unknown key 'stepz'" in refused(capsys, "sweep", str(spec), "--out", str(tmp_path / "a"))
    spec.write_text(spec.read_text().replace("stepz", "steps"))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "index.json").write_text('{"points": [1, 2')
    assert "cannot read" in refused(capsys, "sweep", str(spec), "--out", str(tmp_path / "b"))


def test_a_damaged_summary_is_one_line_in_the_report(capsys, tmp_path):
    (tmp_path / "summary.json").write_text('{"status": ')
    (tmp_path / "config.json").write_text(json.dumps({"steps": 1}))
    assert "summary.json" in refused(capsys, "report", str(tmp_path))


@pytest.mark.mpi
@pytest.mark.long
def test_too_few_ranks_say_how_many_are_needed(tiny_npz, tmp_path):
    result = run_command([MPIEXEC, "-n", "1", str(BIN / "asgd"), "train", "--data", str(tiny_npz),
                          "--batch-size", "32", "--steps", "2", "--out", str(tmp_path / "run")], 120)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        "asgd: error: clients: at least 1 client in async mode need at least 2 MPI ranks (1 server(s) and the "
        "clients), but the job has 1; use mpiexec -n 2"]


@pytest.mark.mpi
@pytest.mark.long
def test_a_rank_that_cannot_start_ends_the_job_instead_of_leaving_the_others_waiting(tiny_npz, tmp_path):
    """Only rank 0 claims the run directory: its refusal once left ranks 1..K in their
    first collective for good (a blocking MPI call, deaf to SIGTERM)."""
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("not a run")
    result = run_command([MPIEXEC, "-n", "3", str(BIN / "asgd"), "train", "--data", str(tiny_npz),
                          "--batch-size", "32", "--steps", "2", "--out", str(taken)], 120)
    assert result.returncode == 2
    assert [line for line in result.stderr.splitlines() if line.startswith("asgd:")] == [
        f"asgd: error: rank 0: out: {taken} already exists and is not an empty directory; choose another --out"]
    assert (taken / "notes.txt").read_text() == "not a run" and len(list(taken.iterdir())) == 1
