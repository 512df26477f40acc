"""The run's measure (error, else the user's metric, else the loss), the stop rules on it,
and a metric summed over the whole test pass (rundir/measure.py, clients/user/metric.py)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from clients.evaluate import split_scores
from clients.user.metric import MetricTally
from clients.user.code import TorchSplit
from runconfig.settings import ConfigError, RunConfig
from rundir.measure import Measure, Stop, curve_measure, stop_rules

METRIC = {"metric": "m.py:perplexity", "metric_name": "perplexity", "metric_higher_is_better": False}


def test_error_where_there_is_one_else_the_metric_else_the_loss():
    assert curve_measure(METRIC, 0.25) == Measure("test_error", "test error")
    assert curve_measure(METRIC, math.nan) == Measure("test_metric", "perplexity", False)
    assert curve_measure({"metric": ""}, math.nan) == curve_measure({}, None) == Measure("test_loss", "test loss")
    higher = curve_measure({**METRIC, "metric_higher_is_better": True}, math.nan)
    assert higher.badness(0.9) < higher.badness(0.8) and higher.reached(0.9, 0.8) and not higher.reached(0.7, 0.8)


def test_each_stop_rule_watches_its_own_column_in_its_direction():
    rules = stop_rules({**METRIC, "metric_higher_is_better": True, "stop_at_error": 0.0, "stop_at_loss": 0.5,
                        "stop_at_metric": 0.9})
    assert [(s.measure.key, s.target) for s in rules] == [("test_loss", 0.5), ("test_metric", 0.9)]
    loss, metric = rules
    row = {"version": 4, "test_error": math.nan, "test_loss": 0.6, "test_metric": 0.95}
    assert not loss.reached(row) and metric.reached(row) and not metric.reached({**row, "test_metric": 0.85})
    assert metric.describe(row) == "perplexity 0.9500 >= 0.9"
    assert not Stop(Measure("test_error", "test error"), 0.3).reached(row)  # NaN reaches nothing
    assert stop_rules(RunConfig().to_dict()) == []


def perplexity(outputs, targets):
    total = nn.functional.cross_entropy(outputs.flatten(0, 1), targets.flatten(), reduction="sum")
    return total, targets.numel()


perplexity.finish = math.exp


def test_a_summing_metric_is_exp_of_the_token_weighted_mean_loss():
    """Sequences of 1 to 6 tokens, one a call: the tally equals exp(summed token loss /
    tokens), by hand, where the mean of each call's perplexity would weigh a short
    sequence as much as a long one."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(5, 4), nn.Linear(4, 5))
    tally, total, tokens, each = MetricTally(perplexity), 0.0, 0, []
    with torch.no_grad():
        for n in (1 + i % 6 for i in range(22)):
            seq = torch.randint(0, 5, (n,))
            tally.add(model(seq[None]), seq[None])
            loss = float(nn.functional.cross_entropy(model(seq), seq, reduction="sum"))
            total, tokens = total + loss, tokens + n
            each.append(math.exp(loss / n))
    assert tally.value() == pytest.approx(math.exp(total / tokens), rel=1e-9)
    assert abs(tally.value() - np.mean(each)) > 1e-3


def test_the_whole_test_pass_sums_a_pair_over_batches_and_averages_a_number_over_items():
    torch.manual_seed(1)
    x, y = torch.randint(0, 5, (23, 3)), torch.randint(0, 5, (23, 3))
    model = nn.Sequential(nn.Embedding(5, 4), nn.Linear(4, 5))
    split = TorchSplit(TensorDataset(x, y))

    def loss(outputs, targets):
        return nn.functional.cross_entropy(outputs.flatten(0, 1), targets.flatten())

    scores = split_scores(model, split, batch_size=5, loss=loss, metric=perplexity)
    with torch.no_grad():
        mean = float(nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()))
        per_batch = [math.exp(float(loss(model(x[i:i + 5]), y[i:i + 5]))) for i in range(0, 23, 5)]
    assert scores["test_metric"] == pytest.approx(math.exp(mean), rel=1e-6)
    assert abs(scores["test_metric"] - np.mean(per_batch)) > 1e-3  # the batch mean it is not
    assert math.isnan(scores["test_error"]) and scores["test_loss"] == pytest.approx(mean, rel=1e-6)

    def batch_mean(outputs, targets):  # a number: the batch's mean, weighted by its items
        return loss(outputs, targets)

    assert split_scores(model, split, batch_size=5, loss=loss, metric=batch_mean)["test_metric"] == \
        pytest.approx(scores["test_loss"], rel=1e-6)


@pytest.mark.parametrize("settings,message", [
    ({"stop_at_metric": 2.0}, "stop_at_metric: needs a metric to stop at"),
    ({"stop_at_loss": math.inf}, "stop_at_loss: must be a finite number"),
    ({"stop_at_loss": 0.5, "eval_live": "off"}, "stop_at_loss: needs the curve while the run trains"),
    ({"stop_at_metric": 0.5, "metric": "m.py:f", "eval_live": "off"}, "stop_at_metric: needs the curve"),
])
def test_a_stop_rule_the_config_cannot_fire_is_refused(settings, message):
    with pytest.raises(ConfigError, match=message):
        RunConfig(**settings)


def test_a_metrics_name_and_direction_are_its_attributes_and_bad_ones_are_refused(tmp_path):
    from clients.user.metric import metric_traits

    code = tmp_path / "metrics.py"
    code.write_text("def accuracy(outputs, targets):\n    return 1.0\n\naccuracy.higher_is_better = True\n\n"
                    "def plain(outputs, targets):\n    return 1.0\n\n"
                    "def odd(outputs, targets):\n    return 1.0\n\nodd.higher_is_better = 'yes'\n")
    assert metric_traits(f"{code}:accuracy") == {"metric_name": "accuracy", "metric_higher_is_better": True}
    assert metric_traits(f"{code}:plain") == {"metric_name": "plain", "metric_higher_is_better": False}
    assert metric_traits("") == {}
    with pytest.raises(ConfigError, match="^metric: .*higher_is_better \\(a bool\\)"):
        metric_traits(f"{code}:odd")
