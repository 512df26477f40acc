"""Bad input that used to pass, and training that went wrong but exited 0 (issue 42, item 6).

Refused before launch, exit 2, one line, nothing written: a label outside the classes a
`.npz` declares (`num_classes`) or a Dataset declares (`classes`); a built-in model on
data without a class count, or without images; outputs and targets the default
cross-entropy would read along the wrong axis ((B, T, V) logits against (B, T) targets
with T = V trained over the time axis, exit 0). A run that diverged exits 3 and says so;
one with rejected pushes says how many.
"""
from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from clients.data import load_dataset
from experiments.api import train
from experiments.cli import main
from rundir.status import EXIT_DIVERGED
from tests.conftest import BIN, mpi_train, run_command
from tests.sim.test_sim import TIMED

OWN = '''
import torch
from torch import nn
from torch.utils.data import Dataset


class Items(Dataset):
    """Inputs x, targets y; `classes` only where given."""

    def __init__(self, x, y, classes=None):
        self.x, self.y = x, y
        if classes is not None:
            self.classes = list(range(classes))

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def images(n, classes=4, seed=0):
    """8x8 images whose class is the quadrant of a bright blob (learnable in a few steps)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    x = torch.rand(n, 1, 8, 8, generator=g)
    for i, label in enumerate(y.tolist()):
        r, c = divmod(label % 4, 2)
        x[i, 0, 4 * r:4 * r + 4, 4 * c:4 * c + 4] += 2
    return x, y


def no_classes():
    return Items(*images(256)), Items(*images(64, seed=1))


def label_4_of_4():
    x, y = images(256)
    y[7] = 4
    return Items(x, y, classes=4), Items(*images(64, seed=1), classes=4)


def one_nan_input():
    x, y = images(256)
    x[5] = float("nan")
    return Items(x, y, classes=4), Items(*images(64, seed=1), classes=4)


def sequences(T, V, classes):
    def split(n, seed):
        x = torch.randint(0, V, (n, T), generator=torch.Generator().manual_seed(seed))
        return Items(x, torch.roll(x, -1, 1), classes=V if classes else None)
    return split(256, 0), split(64, 1)


def square_no_classes():
    return sequences(16, 16, False)


def square_with_classes():
    return sequences(16, 16, True)


def longer_than_vocabulary():
    return sequences(24, 16, True)


def masks(classes=3):
    """(1, 8, 6) images against (8, 6) masks: pixel classes, axis 1 of (B, 3, 8, 6) outputs."""
    def split(n, seed):
        g = torch.Generator().manual_seed(seed)
        y = torch.randint(0, classes, (n, 8, 6), generator=g)
        return Items(y[:, None].float() + 0.1 * torch.randn(n, 1, 8, 6, generator=g), y, classes=classes)
    return split(128, 0), split(32, 1)


def masks_no_classes():
    train, test = masks()
    del train.classes
    return train, test


class LM(nn.Module):
    def __init__(self, vocabulary=16):
        super().__init__()
        self.embed, self.head = nn.Embedding(vocabulary, 16), nn.Linear(16, vocabulary)

    def forward(self, x):
        return self.head(self.embed(x))  # (B, T, V)


def lm():
    return LM()


def per_pixel(shape, num_classes):
    return nn.Conv2d(shape[0], num_classes or 3, 3, padding=1)  # (B, C, H, W)


def five_outputs(shape, num_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 5))


def token_loss(outputs, targets):
    return nn.functional.cross_entropy(outputs.flatten(0, -2), targets.flatten())
'''


@pytest.fixture
def own(tmp_path, monkeypatch) -> Path:
    """own.py, a user's file of factories, in an empty working directory."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "own.py").write_text(textwrap.dedent(OWN))
    return tmp_path / "own.py"


def refused(capsys, *flags: str) -> str:
    """`asgd train FLAGS` in this process: exit 2, one line on stderr, nothing on stdout,
    no run directory; the line, without its prefix."""
    status = main(["train", "--backend", "sim", "--batch-size", "8", "--out", "run", "--quiet", *flags])
    out, err = capsys.readouterr()
    assert status == 2 and out == "" and err.startswith("asgd: error: ") and err.count("\n") == 1, (status, out, err)
    assert not Path("run").exists()
    return err.removeprefix("asgd: error: ").strip()


class Launched(Exception):
    """Raised where training would start: every check passed."""


@pytest.fixture
def stop_at_launch(monkeypatch):
    """`asgd train` stopped the moment its checks pass."""
    import experiments.cli

    check = experiments.cli._check_inputs

    def then_stop(cfg, *args):
        check(cfg, *args)
        raise Launched

    monkeypatch.setattr(experiments.cli, "_check_inputs", then_stop)


def accepted(*flags: str) -> None:
    with pytest.raises(Launched):
        main(["train", "--backend", "sim", "--batch-size", "8", "--out", "run", "--quiet", *flags])


# ------------------------------------------------------------------ labels and class counts
def test_a_npz_label_outside_its_declared_classes_is_refused(own, capsys):
    x = np.zeros((40, 8, 8), np.uint8)
    y = np.arange(40) % 10
    np.savez("ten.npz", x=x, y=y, num_classes=10)
    assert load_dataset("ten.npz").num_classes == 10
    np.savez("wider.npz", x=x, y=y, num_classes=12)  # a class the data does not show is still a class
    assert load_dataset("wider.npz").num_classes == 12
    y[3] = 10
    np.savez("eleven.npz", x=x, y=y, num_classes=10)
    assert refused(capsys, "--data", "eleven.npz") == (
        f"data: {own.parent / 'eleven.npz'}: field 'y' has the label 10, outside the 10 classes 'num_classes' "
        "declares (labels 0..9)")
    np.savez("test_split.npz", x=x, y=np.arange(40) % 10, x_test=x[:10], y_test=np.arange(10) + 1, num_classes=10)
    assert "field 'y_test' has the label 10, outside the 10 classes" in refused(capsys, "--data", "test_split.npz")
    np.savez("undeclared.npz", x=x, y=y)  # without num_classes the largest label says the count, as before
    assert load_dataset("undeclared.npz").num_classes == 11


@pytest.mark.parametrize("value, says", [
    (np.float32(10), "is float32 of shape (); expected one integer"),
    (np.array([10, 10]), "is int64 of shape (2,); expected one integer"),
    (np.int64(0), "is 0; expected 1 to 100,000"),
])
def test_a_npz_num_classes_that_is_not_a_count_is_refused(own, capsys, value, says):
    np.savez("odd.npz", x=np.zeros((20, 8, 8), np.uint8), y=np.arange(20) % 2, num_classes=value)
    assert f"field 'num_classes' {says}" in refused(capsys, "--data", "odd.npz")


def test_a_dataset_label_outside_its_declared_classes_is_refused(own, capsys):
    """The model has five outputs, so cross-entropy would take label 4 without a word:
    the Dataset's four `classes` refuse it (an item of the 256 drawn)."""
    assert refused(capsys, "--data", f"{own}:label_4_of_4", "--model", f"{own}:five_outputs") == \
        "data: label 4 in the train split is out of range for the data's 4 classes (labels must be 0..3)"


def test_a_built_in_model_needs_a_class_count_and_images(own, capsys):
    assert refused(capsys, "--data", f"{own}:no_classes", "--model", "cnn") == (
        "model: cnn needs the number of classes, which the data does not say: give the train Dataset a `classes` "
        "list or a `num_classes` int, or pass your own --model")
    assert refused(capsys, "--data", f"{own}:square_with_classes", "--model", "convnet") == \
        "model: convnet takes images (C, H, W), but the data's inputs have shape (16,); pass your own --model"


# ------------------------------------------------------------------ the default loss's class axis
@pytest.mark.parametrize("data, reason", [
    ("square_no_classes", "(2, 16, 16) and targets (2, 16): it would take axis 1 (16) as the classes, but the "
                          "classes could as well be on the last axis"),
    ("square_with_classes", "(2, 16, 16) and targets (2, 16): it would take axis 1 (16) as the classes, but the "
                            "classes could as well be on the last axis"),
    ("longer_than_vocabulary", "(2, 24, 16) and targets (2, 24): it would take axis 1 (24) as the classes, and "
                               "these outputs have theirs on the last axis"),
], ids=["T=V", "T=V, classes declared", "T>V"])
def test_sequence_logits_under_the_default_loss_are_refused(own, capsys, data, reason):
    """(B, T, V) against (B, T): with T = V cross-entropy trained over the time axis, exit 0."""
    assert refused(capsys, "--data", f"{own}:{data}", "--model", f"{own}:lm") == \
        f"loss: the default cross-entropy on outputs {reason}; pass --loss module:function, a loss of your own"


def test_a_class_axis_the_data_does_not_confirm_is_refused(own, capsys):
    line = refused(capsys, "--data", f"{own}:masks_no_classes", "--model", f"{own}:per_pixel")
    assert line.startswith("loss: the default cross-entropy on outputs (2, 3, 8, 6) and targets (2, 8, 6): it "
                           "would take axis 1 (3) as the classes, and the data declares no class count")


@pytest.mark.parametrize("outputs, targets, classes, says", [
    ((4, 3), (4,), None, None),                       # classification
    ((4, 3), (4, 3), None, None),                     # class probabilities
    ((4, 3, 8, 6), (4, 8, 6), 3, None),               # segmentation, C = the data's classes
    ((4, 3, 3), (4, 3), 3, "could as well be on the last axis"),  # (B, C, L) or (B, T, V), C = L = T = V
    ((4, 3, 3, 3), (4, 3, 3), 3, "could as well be on the last axis"),
    ((4, 5, 8, 6), (4, 8, 6), 3, "axis 1 (5) as the classes, but the data has 3 classes"),
    ((4, 3, 8, 6), (4, 8, 6), None, "the data declares no class count"),
    ((4, 8, 5), (4, 8), 5, "these outputs have theirs on the last axis"),
    ((4, 3, 8, 6), (4, 8, 6, 1), 3, "it takes outputs (B, C) with targets (B,)"),
    ((4,), (4,), None, "it takes outputs (B, C) with targets (B,)"),
    ((4, 3), (4, 3, 1), None, "it takes outputs (B, C) with targets (B,)"),
])
def test_the_default_loss_takes_axis_1_only_where_it_is_sure_to_be_the_classes(outputs, targets, classes, says):
    from clients.user.check import _check_class_axis
    from runconfig.settings import ConfigError

    out = torch.zeros(outputs)
    y = torch.zeros(targets) if len(targets) == len(outputs) and targets == outputs else \
        torch.zeros(targets, dtype=torch.int64)
    if says is None:
        _check_class_axis(out, y, classes)
    else:
        with pytest.raises(ConfigError, match=re.escape(says)):
            _check_class_axis(out, y, classes)


def test_the_unambiguous_layouts_and_your_own_loss_pass(own, stop_at_launch):
    accepted("--data", f"{own}:masks", "--model", f"{own}:per_pixel")  # (B, C, H, W) against (B, H, W), C = 3
    accepted("--data", f"{own}:no_classes", "--model", f"{own}:five_outputs")  # (B, C) against (B,)
    accepted("--data", f"{own}:square_no_classes", "--model", f"{own}:lm", "--loss", f"{own}:token_loss")


def test_a_segmentation_model_trains_under_the_default_loss(own):
    result = main(["train", "--backend", "sim", *TIMED, "--batch-size", "8", "--steps", "3", "--out", "run",
                   "--data", f"{own}:masks", "--model", f"{own}:per_pixel"])
    assert result == 0 and np.isfinite(result.final_test_loss), result.summary


# ------------------------------------------------------------------ training that went wrong
@pytest.mark.slow
def test_a_diverged_run_exits_non_zero_and_says_so(tmp_path, tiny_npz):
    run = tmp_path / "run"
    done = run_command([str(BIN / "asgd"), "train", "--backend", "sim", *TIMED, "--data", str(tiny_npz),
                        "--steps", "20", "--lr", "1e9", "--out", str(run)], timeout=120)
    status = json.loads((run / "summary.json").read_text())["status"]
    assert done.returncode == EXIT_DIVERGED == 3 and status.startswith("diverged: "), (done, status)
    assert done.stdout.strip().splitlines()[-1].endswith(f"; {status}")


def test_the_api_hands_back_the_diverged_exit_status(tmp_path, tiny_npz):
    result = train("cnn", str(tiny_npz), argv=[], backend="sim", sim_step_time=0.01, batch_size=32,
                   eval_samples=100, quiet=True, steps=10, lr=1e9, out=str(tmp_path / "run"))
    assert result == EXIT_DIVERGED and result.status.startswith("diverged: ")


def test_rejected_pushes_are_counted_on_the_console(own, capsys):
    """One NaN input of 256: its minibatch's push is rejected each epoch; the run goes on,
    and says how many, under --quiet too."""
    result = main(["train", "--backend", "sim", *TIMED, "--momentum", "0", "--steps", "16", "--out", "run",
                   "--data", f"{own}:one_nan_input", "--model", f"{own}:five_outputs"])
    rejected, applied = result.summary["pushes_rejected"], result.summary["pushes_applied"]
    assert result == 0 and 0 < rejected < applied, result.summary
    [line] = capsys.readouterr().out.splitlines()
    assert line.endswith(f"; {rejected} of {rejected + applied} pushes rejected (not finite or malformed)"), line


@pytest.mark.slow
@pytest.mark.long
def test_a_diverged_mpi_run_exits_non_zero_under_either_launcher(tmp_path, tiny_npz):
    """Started by asgd (the supervisor reads the summary) and under the user's own mpiexec
    (rank 0 exits with it); in both the run is `diverged`, not a failure."""
    flags = ["--batch-size", "32", "--steps", "10", "--lr", "1e9", "--eval-samples", "50", "--threads", "1",
             "--data", str(tiny_npz)]
    by_asgd = run_command([str(BIN / "asgd"), "train", "--clients", "1", "--quiet", *flags,
                           "--out", str(tmp_path / "a")], timeout=120)
    by_user = mpi_train(2, *flags, "--out", str(tmp_path / "b"))
    for done, run in ((by_asgd, "a"), (by_user, "b")):
        status = json.loads((tmp_path / run / "summary.json").read_text())["status"]
        assert done.returncode == EXIT_DIVERGED and status.startswith("diverged: "), (done, status)
        assert "lost client" not in done.stderr, done.stderr
