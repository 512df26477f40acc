"""The study's second task (examples/glyphs.py): its images and labels are a function of
the seed alone, shaped as the small CNN and the study expect, and its label noise
replaces the share of training labels it says."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from clients.user.code import resolve
from tests.conftest import ROOT

EXAMPLE = ROOT / "examples" / "glyphs.py"


def example(name: str):
    return resolve(f"{EXAMPLE}:{name}", name)


def test_the_images_are_the_seeds_alone():
    x, y = example("images")(300, 5)
    example("images").cache_clear()
    again, labels = example("images")(300, 5)
    other, _ = example("images")(300, 6)
    assert x.shape == (300, 28, 28) and x.dtype == np.uint8 and y.shape == (300,)
    assert np.array_equal(x, again) and np.array_equal(y, labels) and not np.array_equal(x, other)
    assert 0 <= y.min() and y.max() < 62 and len(np.unique(y)) > 50
    assert x.max() == 255 and (x > 128).mean() > 0.02  # ink on every image's noise, not blank frames
    assert all((image > 128).any() for image in x)


def test_the_label_noise_replaces_its_share_and_only_that():
    labels = torch.from_numpy(np.random.default_rng(0).integers(0, 62, 20_000))
    noisy = example("noisy")(labels, 0.1, 0)
    wrong = (noisy != labels).float().mean().item()
    assert wrong == pytest.approx(0.1 * 61 / 62, abs=0.01)
    assert torch.equal(noisy, example("noisy")(labels, 0.1, 0)) and torch.equal(example("noisy")(labels, 0.0, 0), labels)


def test_make_data_gives_the_study_its_sizes_and_62_classes(monkeypatch):
    module = example("make_data").__globals__
    monkeypatch.setitem(module, "TRAIN", 500)
    monkeypatch.setitem(module, "TEST", 100)
    train, test = example("make_data")()
    assert len(train) == 500 and len(test) == 100 and len(train.classes) == 62
    x, y = train[0]
    assert x.shape == (1, 28, 28) and x.dtype == torch.float32 and y.dtype == torch.int64
    pixels = train.tensors[0]
    assert pixels.mean().item() == pytest.approx(0.0, abs=1e-4) and pixels.std().item() == pytest.approx(1.0, abs=1e-3)
