"""The example script's own model (ResNet-style, BatchNorm) and Dataset, trained through the
Python API in the simulator, killed and resumed."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from clients.usercode import resolve
from experiments.api import TrainResult, train
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

    from experiments.cli import main

    assert main(["export", str(example_run), "--out", str(tmp_path / "model.pt")]) == 0
    assert main(["export", str(example_run), "--out", str(tmp_path / "model.safetensors")]) == 0
    pickled, safe = torch.load(tmp_path / "model.pt"), load_file(tmp_path / "model.safetensors")
    assert pickled.keys() == safe.keys() and all(torch.equal(pickled[k], safe[k]) for k in pickled)
