"""Your model, data and loss: imported by name, checked before launch, sharded like any data."""
from __future__ import annotations

import functools
import math
import sys
import textwrap

import numpy as np
import pytest
import torch
from torch import nn

from clients.user.check import check_user_code
from clients.client import wrong
from clients.data import load_dataset
from clients.evaluate import recalibrate
from clients.models import build_model
from clients.sampling import ShardSampler, shard_indices
from clients.user.code import resolve, spec_of
from experiments.api import settings_flags, train
from experiments.cli import main
from experiments.parent.mpiexec import refuse_torchrun
from runconfig.load import config_values
from runconfig.settings import ConfigError, RunConfig

USER = '''
import math
import torch
from torch import nn
from torch.utils.data import TensorDataset

class Points(TensorDataset):
    classes = ["a", "b", "c"]

def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(90, 5, generator=g)
    return Points(x[:60], torch.arange(60) % 3), Points(x[60:], torch.arange(30) % 3)

def model(shape, num_classes):
    return nn.Sequential(nn.Linear(shape[0], 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, num_classes))

def no_args():
    return nn.Linear(5, 3)

def sized(shape, num_classes, width=8):
    return nn.Sequential(nn.Linear(shape[0], width), nn.Linear(width, num_classes))

def keyword_only(*, width):
    return nn.Sequential(nn.Linear(5, width), nn.Linear(width, 3))

def too_wide(shape, num_classes):
    return nn.Linear(7, num_classes)

def not_a_module(shape, num_classes):
    return "a string"

def frozen(shape, num_classes):
    m = nn.Linear(shape[0], num_classes)
    m.bias.requires_grad_(False)
    return m

def vector_loss(outputs, targets):
    return (outputs - 1) ** 2

def iterable():
    return iter([]), iter([])

def narrow(shape, num_classes, outputs=6):  # outputs fixed, whatever the data's classes
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(shape), outputs))

def one_to_six():  # the first items' labels fit six outputs, label 6 does not
    x = torch.randn(90, 5, generator=torch.Generator().manual_seed(0))
    return TensorDataset(x[:60], torch.arange(60) % 6 + 1), TensorDataset(x[60:], torch.arange(30) % 6)

def six_in_test():
    x = torch.randn(90, 5, generator=torch.Generator().manual_seed(0))
    return TensorDataset(x[:60], torch.arange(60) % 6), TensorDataset(x[60:], torch.arange(30) % 7)

class Items(torch.utils.data.Dataset):
    """A map-style Dataset of the user's: its labels come only from reading items."""
    reads = 0

    def __init__(self, n, bad=-1, broken=False):
        self.n, self.bad, self.broken = n, bad, broken

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        Items.reads += 1
        if self.broken:
            raise KeyError(i)
        return torch.full((5,), i / self.n), 6 if i == self.bad else i % 6

def read_bad_at_150():
    return Items(200, bad=150), Items(40)

def many():
    return Items(20_000), Items(5_000)

def broken_test():
    return Items(60), Items(40, broken=True)

def floats():
    x = torch.randn(90, 5, generator=torch.Generator().manual_seed(0))
    return TensorDataset(x[:60], x[:60, :1] * 7), TensorDataset(x[60:], x[60:, :1] * 7)

def counts():
    x = torch.randn(90, 5, generator=torch.Generator().manual_seed(0))
    return TensorDataset(x[:60], torch.arange(60) % 9), TensorDataset(x[60:], torch.arange(30) % 9)

def one_output(shape, num_classes):
    return nn.Linear(shape[0], 1)

def mse(outputs, targets):
    return ((outputs - targets) ** 2).mean()

def poisson(outputs, targets):
    return torch.nn.functional.poisson_nll_loss(outputs[:, 0], targets.float())
'''


@pytest.fixture
def user(tmp_path, monkeypatch):
    """`usermod` importable from the working directory, as a user's module beside them."""
    (tmp_path / "usermod.py").write_text(textwrap.dedent(USER))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "usermod", raising=False)  # imported from this folder, not an earlier test's
    yield tmp_path


def cfg(**values) -> RunConfig:
    return RunConfig(**{"model": "usermod:model", "data": "usermod:data", "batch_size": 8, **values})


def test_a_module_and_a_file_spec_import_the_same_factory(user):
    by_module = resolve("usermod:model", "model")
    by_file = resolve(f"{user / 'usermod.py'}:model", "model")
    assert by_module.__name__ == by_file.__name__ == "model"
    assert spec_of(by_file, "model") == f"{user / 'usermod.py'}:model"  # named by path: importable elsewhere


def test_user_data_loads_behind_the_split_protocol_and_shards_disjointly(user):
    dataset = load_dataset("usermod:data")
    assert dataset.shape == (5,) and dataset.num_classes == 3 and len(dataset.train) == 60
    x, y = dataset.train.batch(np.array([3, 1]))
    assert x.shape == (2, 5) and y.tolist() == [0, 1]
    shards = [shard_indices(len(dataset.train), 3, i, seed=4) for i in range(3)]
    assert sorted(np.concatenate(shards).tolist()) == list(range(60))
    first, again = ShardSampler(shards[1], 4, 4, 1), ShardSampler(shards[1], 4, 4, 1)
    batches = [first.next() for _ in range(7)]
    again.seek(5)  # resume: the same order from step 5
    assert np.array_equal(again.next(), batches[5])


def test_model_factories_take_shape_and_classes_or_nothing(user):
    assert build_model("usermod:no_args", (5,), 3, seed=0).out_features == 3
    a, b = (build_model("usermod:model", (5,), 3, seed=1) for _ in range(2))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))  # seeded


@pytest.mark.parametrize("values, message", [
    ({"model": "usermod:nothing"}, "model: cannot import usermod:nothing"),
    ({"model": "nomodule:model"}, "model: cannot import nomodule:model (ModuleNotFoundError"),
    ({"model": "usermod:not_a_module"}, "model: usermod:not_a_module returned str, not a torch.nn.Module"),
    ({"model": "usermod:too_wide"}, "model: a forward pass on data of shape (2, 5) failed"),
    ({"model": "usermod:frozen"}, "model: parameter bias has requires_grad=False"),
    ({"loss": "usermod:vector_loss"}, "loss: usermod:vector_loss must return a scalar tensor"),
    ({"data": "usermod:iterable"}, "data: usermod:iterable's train set is a list_iterator, not a map-style"),
])
def test_what_does_not_fit_is_one_line_before_launch(user, capsys, values, message):
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        config = cfg(**values)
        check_user_code(config, load_dataset(config.data))
    flags = [f"--{k}" if v is True else f"--{k}={v}" for k, v in {**cfg(**values).to_dict()}.items()
             if k in ("model", "data", "loss") and v]
    assert main(["train", "--backend", "sim", *flags, "--batch-size", "8"]) == 2
    err = capsys.readouterr().err
    recorded = message.replace("usermod:", f"{user}:usermod:")  # asgd train names a module with its folder
    assert err.startswith("asgd: error: " + recorded) and err.count("\n") == 1


@pytest.mark.parametrize("field", ["model", "data", "loss"])
def test_a_missing_file_is_refused_naming_the_field(user, capsys, field):
    code = {"--model": "usermod:model", "--data": "usermod:data", f"--{field}": "missing.py:make"}
    assert main(["train", "--backend", "sim", "--batch-size", "8", *(t for item in code.items() for t in item)]) == 2
    assert capsys.readouterr().err == f"asgd: error: {field}: no such file {user / 'missing.py'}\n"


def test_model_args_are_keywords_of_your_factory(user):
    assert build_model("usermod:sized", (5,), 3, seed=0, model_args={"width": 16})[0].out_features == 16
    assert build_model("usermod:keyword_only", (5,), 3, seed=0, model_args={"width": 4})[0].out_features == 4


def test_model_args_from_a_flag_a_config_table_and_the_api_are_one_json_object(tmp_path):
    (tmp_path / "run.toml").write_text('[model_args]\nwidth = 16\nact = "relu"\n')
    recorded = '{"act": "relu", "width": 16}'  # keys sorted: a resume that spells them otherwise is the same
    assert config_values(str(tmp_path / "run.toml"))["model_args"] == recorded
    assert config_values(None, {"model_args": '{"width": 16,  "act": "relu"}'})["model_args"] == recorded
    assert settings_flags({"model_args": {"width": 16, "act": "relu"}}) == ["--model-args", recorded]


@pytest.mark.parametrize("model, model_args, message", [
    ("usermod:sized", '{"width": 16', "model_args: not JSON"),
    ("usermod:sized", "[16]", "model_args: expected a JSON object of keyword arguments, got '[16]'"),
    ("usermod:sized", '{"depth": 2}', 'model_args: {user}:usermod:sized(shape, num_classes, width=8) cannot take '
                                      '{{"depth": 2}}: got an unexpected keyword argument \'depth\''),
    ("usermod:no_args", '{"width": 2}', 'model_args: {user}:usermod:no_args() cannot take {{"width": 2}}: '
                                        'got an unexpected keyword argument \'width\''),
    ("cnn", '{"width": 2}', "model_args: only for a model factory of yours (package.module:factory); the built-in "
                            "cnn takes none"),
])
def test_model_args_that_do_not_fit_are_one_line_naming_model_args(user, capsys, model, model_args, message):
    assert main(["train", "--backend", "sim", "--model", model, "--data", "usermod:data", "--batch-size", "8",
                 "--model-args", model_args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("asgd: error: " + message.format(user=user)) and err.count("\n") == 1


def test_a_partial_binding_positional_arguments_is_refused(user, capsys):
    assert train(functools.partial(resolve("usermod:sized", "model"), (5,)), "usermod:data", argv=[]) == 2
    assert capsys.readouterr().err.startswith("asgd: error: model: a functools.partial with positional arguments")


def refusal(argv: list[str], capsys) -> str:
    """What `asgd train ARGV` (simulator, batch 8) says; it must be refused before launch."""
    assert main(["train", "--backend", "sim", "--batch-size", "8", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err.removeprefix("asgd: error: ").strip()


@pytest.mark.parametrize("data, message", [
    ("usermod:one_to_six", "data: label 6 in the train split is out of range for the model's 6 outputs "
                           "(labels must be 0..5)"),
    ("usermod:six_in_test", "data: label 6 in the test split is out of range for the model's 6 outputs "
                            "(labels must be 0..5)"),
    ("usermod:read_bad_at_150", "data: label 6 in the train split is out of range"),  # read item by item
    ("usermod:broken_test", "data: reading 2 items of the test split failed: KeyError: 0"),
])
def test_labels_out_of_range_and_a_broken_test_split_are_refused_before_launch(user, capsys, data, message):
    assert refusal(["--model", "usermod:narrow", "--data", data], capsys).startswith(message)


def test_array_labels_are_checked_against_your_models_outputs(user, capsys, tiny_npz):
    narrow = ["--model", "usermod:narrow", "--model-args", '{"outputs": 3}']
    assert refusal([*narrow, "--data", str(tiny_npz)], capsys) == \
        "data: label 3 in the train split is out of range for the model's 3 outputs (labels must be 0..2)"
    x = np.zeros((30, 4, 4), np.uint8)
    np.savez(user / "test_has_3.npz", x=x, y=np.arange(30) % 3, x_test=x[:10], y_test=np.arange(10) % 4)
    assert refusal([*narrow, "--data", "test_has_3.npz"], capsys).startswith("data: label 3 in the test split")


def test_the_label_check_reads_a_bounded_sample_of_a_dataset_of_yours(user):
    config = cfg(model="usermod:narrow", data="usermod:many")
    dataset = load_dataset(config.data)
    before = resolve("usermod:Items", "data").reads
    check_user_code(config, dataset)
    assert resolve("usermod:Items", "data").reads - before <= 2 * (2 + 256)  # of 25,000 items


@pytest.mark.parametrize("model, data, loss", [("usermod:one_output", "usermod:floats", "usermod:mse"),
                                               ("usermod:one_output", "usermod:counts", "usermod:poisson")])
def test_targets_that_are_no_class_labels_are_not_range_checked(user, model, data, loss):
    config = cfg(model=model, data=data, loss=loss)
    check_user_code(config, load_dataset(config.data))


def test_a_malformed_spec_is_refused_by_the_config():
    with pytest.raises(ConfigError, match="^loss: expected package.module:name"):
        RunConfig(loss="not a spec")


def test_batchnorm_statistics_are_estimated_for_the_weights_evaluated(user):
    dataset = load_dataset("usermod:data")
    model = build_model("usermod:model", (5,), 3, seed=0)
    recalibrate(model, dataset.train, seed=0)
    bn = model[1]
    features = model[0](dataset.train.batch(np.arange(60))[0]).detach()
    assert torch.allclose(bn.running_mean, features.mean(0), atol=1e-5)  # every sample, one cumulative average
    assert torch.allclose(bn.running_var, features.var(0), atol=1e-4)


def test_error_is_nan_where_targets_are_not_labels():
    outputs = torch.tensor([[0.1, 0.9], [0.8, 0.2]])
    assert wrong(outputs, torch.tensor([1, 1])) == 1.0
    assert math.isnan(wrong(outputs, torch.zeros(2, 2)))


def test_api_settings_become_flags_and_unknown_ones_are_refused():
    assert settings_flags({"steps": 5, "quiet": True, "tensorboard": False, "lr": 0.5}) == \
        ["--steps", "5", "--quiet", "--lr", "0.5"]
    with pytest.raises(ConfigError, match="^train: unknown setting 'stepz'"):
        settings_flags({"stepz": 5})
    with pytest.raises(ConfigError, match="^model: pass a top-level function"):
        spec_of(lambda shape, n: nn.Linear(1, 1), "model")


def test_torchrun_is_refused_with_how_to_launch():
    refuse_torchrun({"PMI_RANK": "0"})
    with pytest.raises(ConfigError, match="^launch: started by torchrun .*'mpiexec -n K\\+1"):
        refuse_torchrun({"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "4"})
