"""The sequence example (examples/char_lm.py): its causal transformer, whose output head is
tied to its embedding, trained through the Python API in the simulator with its own loss
and metric, AdamW, warmup and cosine; exported to safetensors and loaded back strict."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from clients.user.code import resolve
from experiments.api import TrainResult, train
from experiments.cli import main
from tests.conftest import ROOT

EXAMPLE = ROOT / "examples" / "char_lm.py"
QUICK = ["--backend", "sim", "--clients", "2", "--batch-size", "8", "--threads", "1", "--sim-step-time", "0.01",
         "--sim-apply-time", "0.0001", "--eval-samples", "32", "--quiet"]


def example(name: str):
    return resolve(f"{EXAMPLE}:{name}", name)


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory) -> TrainResult:
    out = tmp_path_factory.mktemp("char_lm") / "run"
    result = train(example("make_model"), example("make_data"), loss=example("token_loss"),
                   metric=example("perplexity"), optimizer="adamw", lr=3e-3, weight_decay=0.01,
                   lr_warmup=32, lr_schedule="cosine",
                   argv=[*QUICK, "--steps", "8", "--eval-every", "4", "--out", str(out)])
    assert result == 0 and result.run_dir == str(out)
    return result


def rows(run: Path, log: str) -> list[dict]:
    return [json.loads(line) for line in (run / f"{log}.jsonl").read_text().splitlines()]


def test_the_model_predicts_the_next_character_with_its_head_tied_to_its_embedding():
    model, (train_split, test_split) = example("make_model")(), example("make_data")()
    assert model.head.weight is model.embed.weight
    assert len(model.state_dict()) == len({v.data_ptr() for v in model.state_dict().values()}) + 1
    x, y = train_split[0]
    assert x.shape == y.shape == (64,) and torch.equal(x[1:], y[:-1]) and len(test_split) > 0
    logits = model(x[None])
    assert logits.shape == (1, 64, 96)
    assert example("token_loss")(logits, y[None]).item() == pytest.approx(math.log(96), rel=0.05)  # starts uniform
    changed = x.clone()
    changed[-1] = (changed[-1] + 1) % 96
    assert torch.equal(model(changed[None])[0, :-1], logits[0, :-1])  # causal: no token sees a later one


def test_the_characters_map_to_the_96_codes_and_the_source_corpus_is_fifty_times_the_docstrings():
    text = "a\nZ~ \té\x7f"
    assert example("encode")(text).tolist() == [66, 0, 59, 95, 1, 1, 1, 1]  # tab, é, DEL: a space
    assert example("decode")(example("encode")("def f(x):\n    return x")) == "def f(x):\n    return x"
    train_text, test_text = example("source_corpus")()
    assert len(train_text) > 50 * len(example("corpus")())  # each window seen about once, not tens of times
    assert 0.05 < len(test_text) / (len(train_text) + len(test_text)) < 0.2  # every tenth file


def test_the_char_lm_trains_through_the_api_with_its_loss_and_metric(lm_run):
    run = Path(lm_run.run_dir)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["minibatches"] == 16 and not summary["status"].startswith("failed")
    config = json.loads((run / "config.json").read_text())
    assert (config["loss"], config["metric"]) == (f"{EXAMPLE}:token_loss", f"{EXAMPLE}:perplexity")
    assert (config["optimizer"], config["lr_schedule"]) == ("adamw", "cosine")
    curve = rows(run, "eval")
    assert [r["version"] for r in curve] == [0, 4, 8]  # fresh: a step a push of each of the 2 clients
    # every item has 64 tokens, so the token-weighted mean is the item-weighted test_loss
    assert all(r["test_metric"] == pytest.approx(math.exp(r["test_loss"]), rel=1e-5) for r in curve)
    assert config["rule"] == "fresh"  # the default: the server takes AdamW's step
    assert curve[-1]["test_loss"] < curve[0]["test_loss"]
    assert summary["final_test_loss"] < math.log(96)
    assert [r["lr"] for r in rows(run, "clients")][:2] == pytest.approx([3e-3 * 8 / 32] * 2)  # warming up


def test_export_to_safetensors_saves_the_tied_tensor_once_and_loads_back_strict(lm_run, tmp_path):
    from safetensors import safe_open
    from safetensors.torch import load_model

    run = Path(lm_run.run_dir)
    assert main(["export", str(run), "--out", str(tmp_path / "lm.safetensors")]) == 0
    assert main(["export", str(run), "--out", str(tmp_path / "lm.pt")]) == 0
    with safe_open(tmp_path / "lm.safetensors", "pt") as f:
        assert len({"embed.weight", "head.weight"} & set(f.keys())) == 1  # one tensor, one name
    model = example("make_model")()
    load_model(model, tmp_path / "lm.safetensors")  # strict: raises on a name missing or unexpected
    assert model.head.weight is model.embed.weight
    pickled = torch.load(tmp_path / "lm.pt")
    assert all(torch.equal(pickled[k], v) for k, v in model.state_dict().items())
    flat = torch.nn.utils.parameters_to_vector(model.parameters()).detach().numpy()
    np.testing.assert_array_equal(flat, np.load(run / "checkpoint" / "latest.npz")["weights"])
