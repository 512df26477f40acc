"""The run's curve is the run's measure: on a model without classes (a tiny token model,
logits (B, T, V), mean token cross-entropy) the curve, the stop rules, the summary, the
final line and `asgd report` speak of the loss, or of the user's metric, named."""
from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import numpy as np
import pytest

from experiments.cli import main

TOKENS = """
import math

import torch
from torch import nn
from torch.utils.data import TensorDataset

VOCAB, LENGTH = 6, 5


def make_model():
    return nn.Sequential(nn.Embedding(VOCAB, 8), nn.Linear(8, VOCAB))   # (B, T) -> logits (B, T, V)


def make_data():
    x = torch.randint(0, VOCAB, (160, LENGTH), generator=torch.Generator().manual_seed(0))
    y = (x + 1) % VOCAB                  # the next token of a cycle: learnable
    for i in range(120, 160):            # the test split's last tokens are padding, more in some sequences
        y[i, 1 + i % 4:] = -100
    return TensorDataset(x[:120], y[:120]), TensorDataset(x[120:], y[120:])


def token_loss(outputs, targets):
    return nn.functional.cross_entropy(outputs.flatten(0, 1), targets.flatten())


def perplexity(outputs, targets):
    total = nn.functional.cross_entropy(outputs.flatten(0, 1), targets.flatten(), reduction="sum")
    return total, int((targets != -100).sum())


perplexity.finish = math.exp


def accuracy(outputs, targets):
    kept = targets != -100
    return (outputs.argmax(-1)[kept] == targets[kept]).sum(), kept.sum()


accuracy.higher_is_better = True
accuracy.name = "token accuracy"
"""
QUICK = ["--backend", "sim", "--clients", "2", "--batch-size", "8", "--threads", "1", "--lr", "0.5",
         "--sim-step-time", "0.01", "--sim-apply-time", "0.0001", "--eval-every", "4", "--eval-samples", "40"]


@pytest.fixture
def code(tmp_path) -> Path:
    path = tmp_path / "tokens.py"
    path.write_text(textwrap.dedent(TOKENS))
    return path


def train(code: Path, out: Path, *flags: str) -> int:
    return main(["train", *QUICK, "--model", f"{code}:make_model", "--data", f"{code}:make_data",
                 "--loss", f"{code}:token_loss", "--out", str(out), *flags])


def rows(run: Path, log: str) -> list[dict]:
    return [json.loads(line) for line in (run / f"{log}.jsonl").read_text().splitlines()]


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def test_a_model_without_classes_has_the_loss_as_its_curve(code, tmp_path, capsys):
    run = tmp_path / "run"
    assert train(code, run, "--steps", "24") == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    result, curve = summary(run), rows(run, "eval")
    assert result["curve_measure"] == {"key": "test_loss", "name": "test loss", "higher_is_better": False}
    assert result["final_test_error"] is None and "NaN" not in (run / "summary.json").read_text()  # valid JSON
    assert line.startswith(f"run {run}: test loss {result['final_test_loss']:.4f} after 48 minibatches")
    assert "nan" not in line and curve[-1]["test_loss"] < curve[0]["test_loss"]


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_stop_at_loss_ends_a_run_without_classes_at_the_first_point_that_reaches_it(code, tmp_path, mode):
    run = tmp_path / "run"
    full = tmp_path / "full"
    assert train(code, full, "--steps", "40", "--mode", mode, "--quiet") == 0
    target = rows(full, "eval")[3]["test_loss"]  # reached at the fourth point, perhaps earlier
    first = next(p for p in rows(full, "eval") if p["test_loss"] <= target)
    assert train(code, run, "--steps", "40", "--mode", mode, "--stop-at-loss", f"{target!r}", "--quiet") == 0
    result = summary(run)
    assert result["target_reached"]["version"] == first["version"] < rows(full, "eval")[-1]["version"]
    assert result["status"] == (f"complete: reached target (test loss {first['test_loss']:.4f} <= {target:g} "
                                f"at version {first['version']})")
    assert result["minibatches"] < 80


def test_an_aggregating_metric_is_the_curve_with_its_name_and_direction(code, tmp_path, capsys):
    """Perplexity returns (summed token loss, tokens) a batch and exp as its finish: the
    final number is exp of the token-weighted mean loss, computed here by hand; and
    stop_at_metric on a higher-is-better metric stops at or above its target."""
    import torch

    from clients.models import load_flat
    from clients.user.code import load_user_data, resolve

    run = tmp_path / "run"
    assert train(code, run, "--steps", "4", "--lr", "0.05", "--metric", f"{code}:perplexity", "--keep-best") == 0
    result = summary(run)
    assert result["curve_measure"] == {"key": "test_metric", "name": "perplexity", "higher_is_better": False}
    model = resolve(f"{code}:make_model", "model")()
    from rundir.durable import load_arrays
    load_flat(model, load_arrays(run / "checkpoint" / "latest.npz")["weights"])
    _, test, _, _ = load_user_data(f"{code}:make_data")
    x, y = test.batch(np.arange(len(test)))
    with torch.no_grad():
        losses = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="none")
    kept = y.flatten() != -100
    by_hand = math.exp(float(losses[kept].sum()) / int(kept.sum()))
    assert result["final_test_metric"] == pytest.approx(by_hand, rel=1e-6)
    batch_mean = math.exp(float(np.mean([float(losses.view(len(y), -1)[i][kept.view(len(y), -1)[i]].mean())
                                         for i in range(len(y))])))
    assert abs(by_hand - batch_mean) > 0.01  # a mean over sequences, not tokens, would differ
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith(f"run {run}: perplexity {by_hand:.4f}")
    best = min(rows(run, "eval"), key=lambda r: (r["test_metric"], r["version"]))
    assert (result["best_version"], result["best_test_metric"]) == (best["version"], best["test_metric"])

    stopped = tmp_path / "stopped"
    assert train(code, stopped, "--steps", "40", "--metric", f"{code}:accuracy", "--stop-at-metric", "0.5",
                 "--quiet") == 0
    result = summary(stopped)
    assert result["curve_measure"]["name"] == "token accuracy" and result["target_reached"]["test_metric"] >= 0.5
    assert "token accuracy" in result["status"] and ">= 0.5" in result["status"]


@pytest.mark.parametrize("flags,refusal", [
    (["--stop-at-error", "0.5"], "asgd: error: stop_at_error: outputs (2, 5, 6) against targets (2, 5) are no "
                                 "classification"),
    (["--stop-at-metric", "2"], "asgd: error: stop_at_metric: needs a metric to stop at"),
])
def test_a_stop_rule_that_cannot_fire_is_refused_before_launch(code, tmp_path, capsys, flags, refusal):
    assert train(code, tmp_path / "run", "--steps", "4", *flags) == 2
    err = capsys.readouterr().err
    assert err.startswith(refusal) and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_report_on_a_loss_only_run_draws_the_loss(code, tmp_path, capsys):
    from plots import analysis
    from plots.curves import run_series
    from rundir.smoothing import smoothed

    run = tmp_path / "run"
    assert train(code, run, "--steps", "12", "--quiet") == 0
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    assert f"test loss {summary(run)['final_test_loss']:.4f}" in out and "nan" not in out
    series = run_series(run, 4)
    assert series.ylabel == "loss" and series.test_label == "test loss"
    assert series.test_y == [r["test_loss"] for r in rows(run, "eval")]
    clients = sorted(rows(run, "clients"), key=lambda r: r["time"])
    np.testing.assert_allclose(series.train_y, smoothed(np.array([r["loss"] for r in clients]), 4))
    assert np.isfinite(series.train_y).all()
    point = analysis.SweepRun("p", "async", 2, 1, "cold", 0, run, "complete", train_size=120)
    c = analysis.curve(point, 4)  # a sweep's tables and figures: the training loss too
    assert (c.column, c.label) == ("loss", "training loss")
    np.testing.assert_allclose(c.error, series.train_y)


def test_tensorboard_names_the_metric_and_takes_the_runs_measure_as_its_hparam(code, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    assert train(code, run, "--steps", "8", "--metric", f"{code}:perplexity", "--tensorboard", "--quiet") == 0
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"test/perplexity", "test/loss", "hparam/final_test_metric"} <= tags
    assert not {"test/error", "test/metric", "hparam/final_test_error"} & tags
    [final] = events.Scalars("hparam/final_test_metric")
    assert final.value == pytest.approx(summary(run)["final_test_metric"], rel=1e-6)


def test_a_resume_may_add_a_metric_and_the_run_is_then_read_in_it(code, tmp_path):
    run = tmp_path / "run"
    assert train(code, run, "--steps", "8", "--quiet") == 0
    assert main(["train", "--resume", str(run), "--steps", "12", "--metric", f"{code}:accuracy", "--quiet"]) == 0
    config = json.loads((run / "config.json").read_text())
    assert (config["metric"], config["metric_name"], config["metric_higher_is_better"]) == \
        (f"{code}:accuracy", "token accuracy", True)
    assert summary(run)["curve_measure"]["name"] == "token accuracy"
    from plots.curves import run_series
    series = run_series(run, 4)
    assert series.measure.name == "token accuracy" and len(series.test_y) == 1  # the resumed run's last point
