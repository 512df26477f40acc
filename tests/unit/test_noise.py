"""The gradient noise scale (paramserver/noise.py): a hand computation of two windows,
synthetic gradients of known variance, and fresh_batch = "auto" following it."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from runconfig.settings import RunConfig
from paramserver.noise import DECAY, NoiseScale, summarise
from paramserver.rules import make_rule
from paramserver.store import Store


def test_two_windows_by_hand():
    """Batch 4, windows of 2 pushes. Window 1: d = (1, 2) and (3, 0), one minibatch each:
    small = (5 + 9) / 2 = 7 at B 4, big = |(2, 1)|^2 = 5 at B 8, so tr = 2 / (1/4 - 1/8)
    = 16 and |G|^2 = 7 - 16/4 = 3. Window 2: (0, 2) over two minibatches, (2, 2) over one:
    small = (|(0, 1)|^2 + 8) / 2 = 4.5 at 1/B = (1/8 + 1/4) / 2, big = |(2, 4) / 3|^2 = 20/9
    at B 12."""
    noise = NoiseScale(batch_size=4, window=2)
    assert noise.estimate is None
    assert not noise.add(torch.tensor([1.0, 2.0]), 1) and noise.add(torch.tensor([3.0, 0.0]), 1)
    assert noise.estimate == pytest.approx(16 / 3) and noise.mean_norm == pytest.approx(5 ** 0.5)
    assert not noise.add(torch.tensor([0.0, 2.0]), 2) and noise.add(torch.tensor([2.0, 2.0]), 1)
    inverse = (1 / 8 + 1 / 4) / 2
    trace2 = (4.5 - 20 / 9) / (inverse - 1 / 12)
    g2 = 4.5 - trace2 * inverse
    expected = (DECAY * 0.1 * 16 + 0.1 * trace2) / (DECAY * 0.1 * 3 + 0.1 * g2)
    assert noise.estimate == pytest.approx(expected, rel=1e-12) and noise.windows == 2
    assert noise.mean_norm == pytest.approx((20 / 9) ** 0.5)


def synthetic_pushes(rng, count: int, batch: int, minibatches: int = 1):
    """Gradient sums of `minibatches` minibatches of `batch` samples: per sample, the
    gradient G = 0.1 everywhere (|G|^2 = 20 over 2,000 weights) plus noise of variance
    0.25 a weight, so B_simple = 2000 * 0.25 / 20 = 25 samples."""
    for _ in range(count):
        g = 0.1 + rng.standard_normal((minibatches, 2000)) * 0.5 / np.sqrt(batch)
        yield torch.from_numpy(g.sum(0).astype(np.float32))


@pytest.mark.parametrize("minibatches", [1, 3])
def test_known_variance_gives_its_noise_scale(minibatches):
    noise = NoiseScale(batch_size=8, window=4)
    for push in synthetic_pushes(np.random.default_rng(0), 400, 8, minibatches):
        noise.add(push, minibatches)
    assert noise.windows == 100 and noise.estimate == pytest.approx(25, rel=0.1)


def test_auto_fresh_batch_follows_the_noise_scale_within_its_bounds():
    settings = RunConfig(rule="fresh", fresh_batch="auto", batch_size=8, max_staleness=1000, lr=1e-6)
    store = Store(np.zeros(2000, np.float32), make_rule("fresh", settings, 4))
    store.pull(0)
    assert store.rule.step_batch == 4  # K until measured
    for push in synthetic_pushes(np.random.default_rng(1), 200, 8):
        store.apply(0, push.numpy())
    assert store.rule.step_batch == round(store.rule.noise.estimate / 8) == 3  # B_simple 25 over batch 8
    store.rule.noise.g2 = -1.0  # no signal above the noise: the largest step allowed
    assert store.rule.step_batch == 16


def test_summary_of_the_rows():
    rows = [{"samples": 64 * i, "noise_scale": None if i == 0 else float(i)} for i in range(5)]
    summary = summarise(rows + [{"version": 3}])
    assert summary["windows"] == 5 and summary["first"] == 1.0 and summary["last"] == 4.0
    assert summary["median"] == 3.0 and summary["trace"][0] == [64, 1.0]
    assert summarise([]) == {"windows": 0}
