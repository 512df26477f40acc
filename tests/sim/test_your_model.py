"""The example script's own model (ResNet-style, BatchNorm) and Dataset, trained through the
Python API in the simulator, killed and resumed."""
from __future__ import annotations

import functools
import json
import sys
import textwrap
from pathlib import Path

import pytest

from clients.user import code as usercode
from clients.user.code import load_user_data, resolve
from experiments.api import TrainResult, train
from experiments.cli import main
from tests.conftest import ROOT

EXAMPLE = ROOT / "examples" / "fashion_resnet.py"
QUICK = ["--backend", "sim", "--rule", "easgd",
         "--clients", "2", "--batch-size", "16", "--threads", "1", "--sim-step-time", "0.01",
         "--sim-apply-time", "0.0001", "--eval-samples", "64", "--quiet"]


@pytest.fixture(scope="module")
def example():
    """make_model and make_data from the example, on 256 generated images."""
    patch = pytest.MonkeyPatch()
    patch.setenv("EXAMPLE_DATA", "generated")
    patch.setenv("EXAMPLE_LIMIT", "256")
    yield resolve(f"{EXAMPLE}:make_model", "model"), resolve(f"{EXAMPLE}:make_data", "data")
    patch.undo()


@pytest.fixture(scope="module")
def example_result(example, tmp_path_factory) -> TrainResult:
    out = tmp_path_factory.mktemp("example") / "run"
    result = train(*example, argv=[*QUICK, "--steps", "6", "--eval-every", "6", "--out", str(out)])
    assert result == 0 and result.run_dir == str(out)
    return result


@pytest.fixture(scope="module")
def example_run(example_result) -> Path:
    return Path(example_result.run_dir)


def rows(run: Path, log: str) -> list[dict]:
    return [json.loads(line) for line in (run / f"{log}.jsonl").read_text().splitlines()]


def test_the_example_trains_in_the_simulator_through_the_api(example_run):
    summary = json.loads((example_run / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["minibatches"] == 12
    config = json.loads((example_run / "config.json").read_text())
    assert config["model"] == f"{EXAMPLE}:make_model" and config["data"] == f"{EXAMPLE}:make_data"
    assert [r["version"] for r in rows(example_run, "eval")] == [0, 6, 12]
    assert not {p.name for p in example_run.iterdir()} & {"lock", "snapshots"}  # nothing stale left
    assert all(0 <= r["error"] <= 1 for r in rows(example_run, "clients"))


def test_train_hands_back_what_the_run_recorded(example_result):
    summary = json.loads((Path(example_result.run_dir) / "summary.json").read_text())
    assert example_result.summary == summary and example_result.status == "complete"
    assert (example_result.final_test_error, example_result.final_test_loss) == \
        (summary["final_test_error"], summary["final_test_loss"])


def test_a_run_of_your_model_killed_mid_way_resumes_with_every_minibatch_once(example, tmp_path):
    run = tmp_path / "run"
    failed = train(*example, argv=[*QUICK, "--steps", "8", "--eval-every", "4", "--out", str(run),
                                   "--inject-fault", "0:6"])
    assert failed == 1 and failed.status.startswith("failed: InjectedFault") and failed.final_test_error is None
    resumed = train(*example, argv=["--resume", str(run), "--quiet"])
    assert resumed == 0 and resumed.status == "complete" and resumed.run_dir == str(run)
    assert sorted((r["client"], r["step"]) for r in rows(run, "clients")) == \
        [(c, s) for c in range(2) for s in range(1, 9)]
    assert json.loads((run / "summary.json").read_text())["status"] == "complete"
    assert not {p.name for p in run.iterdir()} & {"lock", "snapshots"}


def test_export_writes_a_state_dict_your_model_loads(example, example_run, tmp_path):
    import torch

    from clients.data import load_dataset
    from clients.evaluate import test_metrics
    from experiments.cli import main

    make_model, make_data = example
    assert main(["export", str(example_run), "--out", str(tmp_path / "model.pt")]) == 0
    model = make_model((1, 28, 28), 10)
    model.load_state_dict(torch.load(tmp_path / "model.pt"))  # strict: every parameter and buffer
    test = load_dataset(f"{EXAMPLE}:make_data").test
    error, loss = test_metrics(model, test)  # the whole test split, as the summary's final numbers
    summary = json.loads((example_run / "summary.json").read_text())
    assert (error, loss) == pytest.approx((summary["final_test_error"], summary["final_test_loss"]))


def test_export_writes_safetensors_with_the_same_weights(example_run, tmp_path):
    import torch
    from safetensors.torch import load_file  # make setup installs it

    assert main(["export", str(example_run), "--out", str(tmp_path / "model.pt")]) == 0
    assert main(["export", str(example_run), "--out", str(tmp_path / "model.safetensors")]) == 0
    pickled, safe = torch.load(tmp_path / "model.pt"), load_file(tmp_path / "model.safetensors")
    assert pickled.keys() == safe.keys() and all(torch.equal(pickled[k], safe[k]) for k in pickled)


OWN_MODEL = """
from torch import nn

def build_model(shape, num_classes, width=8):
    return nn.Sequential(nn.Linear(shape[0], width), nn.ReLU(), nn.Linear(width, num_classes))
"""
OWN_DATA = """
import torch
from torch.utils.data import TensorDataset

class Points(TensorDataset):
    num_classes = 3

def make_data():
    x = torch.randn(120, 5, generator=torch.Generator().manual_seed(0))
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    return Points(x[:96], y[:96]), Points(x[96:], y[96:])
"""
TINY = ["--backend", "sim", "--clients", "2", "--batch-size", "8", "--threads", "1", "--sim-step-time", "0.01",
        "--sim-apply-time", "0.0001", "--eval-samples", "16", "--quiet"]


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    """A folder of the user's, the working directory, with a model module and a data file."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "own_model.py").write_text(textwrap.dedent(OWN_MODEL))
    (folder / "own_data.py").write_text(textwrap.dedent(OWN_DATA))
    monkeypatch.chdir(folder)
    monkeypatch.delitem(sys.modules, "own_model", raising=False)
    return folder


def elsewhere(monkeypatch, folder: Path) -> None:
    """Another working directory, in a process that has imported none of the user's code
    and has none of its folders on sys.path, as a fresh `asgd` command there would be."""
    monkeypatch.chdir(folder)
    monkeypatch.setattr(usercode, "_REGISTERED", {})
    load_user_data.cache_clear()
    monkeypatch.delitem(sys.modules, "own_model", raising=False)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if "project" not in p])


def test_your_module_and_file_travel_to_export_and_resume_from_another_folder(project, tmp_path, monkeypatch):
    run = tmp_path / "run"
    code = ["--model", "own_model:build_model", "--data", "own_data.py:make_data"]
    assert main(["train", *TINY, *code, "--steps", "4", "--out", str(run)]) == 0
    config = json.loads((run / "config.json").read_text())
    assert config["model"] == f"{project}:own_model:build_model"  # the folder it was found in
    assert config["data"] == f"{project / 'own_data.py'}:make_data"
    (tmp_path / "other").mkdir()
    elsewhere(monkeypatch, tmp_path / "other")
    assert main(["export", str(run)]) == 0
    assert main(["train", "--resume", str(run), "--steps", "6", "--model", "own_model:build_model"]) == 0
    assert json.loads((run / "summary.json").read_text())["minibatches"] == 12
    assert main(["train", "--resume", str(run), "--steps", "8", "--model", f"{tmp_path}:own_model:build_model"]) == 2


def test_a_run_recorded_before_folders_were_still_exports_from_its_folder(project, tmp_path, monkeypatch):
    run = tmp_path / "run"
    assert main(["train", *TINY, "--model", "own_model:build_model", "--data", "own_data.py:make_data",
                 "--steps", "2", "--out", str(run)]) == 0
    config = json.loads((run / "config.json").read_text())
    old = {key: value for key, value in config.items() if key != "model_args"}  # as written then
    (run / "config.json").write_text(json.dumps({**old, "model": "own_model:build_model"}))
    elsewhere(monkeypatch, project)
    assert main(["export", str(run)]) == 0
    assert main(["train", "--resume", str(run), "--steps", "3", "--model", "own_model:build_model"]) == 0


def test_model_args_reach_your_factory_and_a_resume_keeps_them(project, tmp_path):
    run = tmp_path / "run"
    wide = functools.partial(resolve("own_model:build_model", "model"), width=16)  # its keywords: model_args
    assert train(wide, "own_data.py:make_data", argv=[*TINY, "--steps", "2", "--out", str(run)]) == 0
    config = json.loads((run / "config.json").read_text())
    assert config["model"] == f"{project}:own_model:build_model" and config["model_args"] == '{"width": 16}'
    assert config["num_params"] == (5 * 16 + 16) + (16 * 3 + 3)
    assert main(["train", "--resume", str(run), "--steps", "3", "--model-args", '{"width": 8}']) == 2
    assert main(["train", "--resume", str(run), "--steps", "3", "--model-args", '{ "width":16 }']) == 0


OWN_HOOKS = """
import torch

def accuracy(outputs, targets):
    return (outputs.argmax(1) == targets).float().mean()

def plain_sgd(params, lr):
    return torch.optim.SGD(params, lr=lr)
"""


def test_your_metric_and_optimizer_files_travel_to_a_resume_from_another_folder(project, tmp_path, monkeypatch):
    (project / "own_hooks.py").write_text(textwrap.dedent(OWN_HOOKS))
    run = tmp_path / "run"
    code = ["--model", "own_model:build_model", "--data", "own_data.py:make_data",
            "--metric", "own_hooks.py:accuracy", "--optimizer", "own_hooks:plain_sgd"]
    assert main(["train", *TINY, *code, "--steps", "4", "--out", str(run)]) == 0
    config = json.loads((run / "config.json").read_text())
    assert config["metric"] == f"{project / 'own_hooks.py'}:accuracy"
    assert config["optimizer"] == f"{project}:own_hooks:plain_sgd"
    (tmp_path / "other").mkdir()
    elsewhere(monkeypatch, tmp_path / "other")
    monkeypatch.delitem(sys.modules, "own_hooks", raising=False)
    assert main(["train", "--resume", str(run), "--steps", "6"]) == 0
    assert json.loads((run / "summary.json").read_text())["minibatches"] == 12
    assert all(0 <= r["test_metric"] <= 1 for r in rows(run, "eval"))


steps_taken: list[int] = []  # optimizer steps of sgd_counting's optimizers, in this process


def sgd_counting(params, lr):
    """A top-level factory of the test's own: its optimizers count their steps."""
    optimizer = torch_sgd(params, lr)
    optimizer.register_step_post_hook(lambda *_: steps_taken.append(1))
    return optimizer


def torch_sgd(params, lr):
    import torch
    return torch.optim.SGD(params, lr=lr)


def agreement(outputs, targets):
    """A metric of the test's own: the fraction of outputs whose top class is the target."""
    return (outputs.argmax(1) == targets).float().mean()


def test_metric_and_optimizer_callables_through_the_api_are_recorded_and_used(project, tmp_path):
    run = tmp_path / "run"
    steps_taken.clear()
    result = train("own_model:build_model", "own_data.py:make_data", metric=agreement, optimizer=sgd_counting,
                   argv=[*TINY, "--steps", "3", "--out", str(run)])
    assert result == 0 and not result.status.startswith("failed")
    config = json.loads((run / "config.json").read_text())
    assert config["metric"] == f"{ROOT}:tests.sim.test_your_model:agreement"
    assert config["optimizer"] == f"{ROOT}:tests.sim.test_your_model:sgd_counting"
    assert len(steps_taken) >= 2 * 3  # each client's 3 steps (the server's, if it steps, beside them)
    curve = rows(run, "eval")
    assert curve and all(r["test_metric"] == pytest.approx(1 - r["test_error"]) for r in curve)
    assert train("own_model:build_model", "own_data.py:make_data", metric=lambda o, t: 0.0,
                 argv=[*TINY, "--steps", "1", "--out", str(tmp_path / "refused")]) == 2
