"""What a run reads (experiments/run/inputs.py, issue 25): paths made absolute, data fingerprinted."""
from __future__ import annotations

import pytest
import torch
from torch.utils.data import Dataset as TorchDataset, TensorDataset

from clients.data import Dataset
from clients.user.code import TorchSplit
from experiments.run.inputs import absolute_paths, check_fingerprint, fingerprint
from runconfig.settings import ConfigError


def test_paths_become_absolute_and_names_stay(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "images" / "train").mkdir(parents=True)
    values = absolute_paths({"data": "d.npz", "init": "w.npz", "model": "nets/mine.py:make", "loss": "pkg.mod:fn",
                             "data_dir": "", "replay": "runs/a", "lr": 0.1})
    assert values == {"data": str(tmp_path / "d.npz"), "init": str(tmp_path / "w.npz"),
                      "model": f"{tmp_path / 'nets' / 'mine.py'}:make", "loss": "pkg.mod:fn", "data_dir": "",
                      "replay": str(tmp_path / "runs" / "a"), "lr": 0.1}
    assert absolute_paths({"data": "fashion-mnist", "model": "cnn"}) == {"data": "fashion-mnist", "model": "cnn"}
    assert absolute_paths({"data": "images"})["data"] == str(tmp_path / "images")
    assert absolute_paths({"data": 5}) == {"data": 5}  # refused later, by the config's type check


def test_a_module_of_yours_is_recorded_with_the_folder_it_is_found_in(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "nets").mkdir()
    (tmp_path / "nets" / "__init__.py").write_text("")
    values = absolute_paths({"model": "nets.deep:make", "data": "sub:nets.deep:data", "loss": "torch.nn:MSELoss"})
    assert values == {"model": f"{tmp_path}:nets.deep:make", "data": f"{tmp_path / 'sub'}:nets.deep:data",
                      "loss": "torch.nn:MSELoss"}  # installed: found from any folder as it is
    assert absolute_paths({"model": "nowhere_to_be_found:make"}) == {"model": "nowhere_to_be_found:make"}


def test_every_hook_travels_as_the_model_does(tmp_path, monkeypatch):
    """The metric and the optimizer factory too: a resume or an export from another folder
    finds them; an optimizer's name stays a name."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "nets").mkdir()
    (tmp_path / "nets" / "__init__.py").write_text("")
    values = absolute_paths({"metric": "own.py:ppl", "optimizer": "nets.opt:make"})
    assert values == {"metric": f"{tmp_path / 'own.py'}:ppl", "optimizer": f"{tmp_path}:nets.opt:make"}
    assert absolute_paths({"optimizer": "adamw", "metric": ""}) == {"optimizer": "adamw", "metric": ""}


class Jittered(TorchDataset):
    """Items with a random augmentation (drawn from torch's RNG, as torchvision's are)."""

    def __init__(self, n: int, changed: int = -1):
        self.x, self.y, self.changed = torch.arange(n * 4.0).reshape(n, 4), torch.arange(n) % 3, changed

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i] + torch.rand(4) + (100.0 if i == self.changed else 0.0), self.y[i]


def user_data(train: TorchDataset, test: TorchDataset) -> Dataset:
    return Dataset("mine", TorchSplit(train), TorchSplit(test), (4,), 3)


def test_a_users_datasets_are_fingerprinted_by_lengths_and_a_sample():
    test = TensorDataset(torch.zeros(10, 4), torch.zeros(10, dtype=torch.int64))
    recorded = fingerprint(user_data(Jittered(1000), test))
    assert recorded["train"] == 1000 and recorded["test"] == 10
    check_fingerprint(recorded, user_data(Jittered(1000), test))  # the same items, augmented alike
    with pytest.raises(ConfigError, match="^data: the data differs from what the run trained on"):
        check_fingerprint(recorded, user_data(Jittered(1000, changed=999), test))  # the last item is sampled
    with pytest.raises(ConfigError, match="1001 training"):
        check_fingerprint(recorded, user_data(Jittered(1001), test))


def test_a_damaged_or_missing_fingerprint():
    test = TensorDataset(torch.zeros(10, 4), torch.zeros(10, dtype=torch.int64))
    data = user_data(Jittered(8), test)
    check_fingerprint(None, data)  # a run recorded before fingerprints were kept
    for damaged in (5, "x", [], {"files": 3}, {"train": 8}):
        with pytest.raises(ConfigError, match="a damaged fingerprint then"):
            check_fingerprint(damaged, data)
