"""Your own model and data under asgd: a small ResNet-style CNN on Fashion-MNIST.

    mpiexec -n 5 .venv/bin/python examples/fashion_resnet.py            1 server + 4 clients
    .venv/bin/python examples/fashion_resnet.py --clients 4             asgd starts mpiexec itself
    .venv/bin/python examples/fashion_resnet.py --backend sim --clients 8
    .venv/bin/python examples/fashion_resnet.py --steps 50 --tensorboard  any `asgd train` flag

No torchvision: the data are Debian's `dataset-fashion-mnist` files read with numpy, or,
where they are absent (or EXAMPLE_DATA=generated), 28x28 images generated from a seed.
EXAMPLE_LIMIT=N keeps the first N training images (a quick try). The model has
BatchNorm layers: their running statistics are re-estimated from training batches
whenever the server's weights are evaluated or exported (docs/your-model.md).
"""
from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

FASHION = Path("/usr/share/datasets/fashion-mnist")


class Block(nn.Module):
    """Two 3x3 convolutions with BatchNorm and a shortcut (He et al. 2016)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
            nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
        self.shortcut = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


def make_model(shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """asgd calls this with one input's shape (C, H, W) and the class count."""
    return nn.Sequential(
        nn.Conv2d(shape[0], 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
        Block(8, 8, 1), Block(8, 16, 2), Block(16, 32, 2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, num_classes))


def make_data() -> tuple[TensorDataset, TensorDataset]:
    """(train, test) map-style Datasets of (image, label); asgd shards train over the clients."""
    if FASHION.is_dir() and os.environ.get("EXAMPLE_DATA") != "generated":
        x, y = _idx("train-images-idx3-ubyte.gz", 16).reshape(-1, 28, 28), _idx("train-labels-idx1-ubyte.gz", 8)
        x_test, y_test = _idx("t10k-images-idx3-ubyte.gz", 16).reshape(-1, 28, 28), _idx("t10k-labels-idx1-ubyte.gz", 8)
    else:
        x, y, x_test, y_test = _generated(6000, 1000)
    limit = int(os.environ.get("EXAMPLE_LIMIT", 0)) or len(y)
    return _images(x[:limit], y[:limit]), _images(x_test[:max(limit // 5, 1)], y_test[:max(limit // 5, 1)])


class Images(TensorDataset):
    classes = [str(c) for c in range(10)]  # the class count asgd passes to make_model


def _images(x: np.ndarray, y: np.ndarray) -> Images:
    pixels = torch.from_numpy(x.reshape(-1, 1, 28, 28).astype(np.float32) / 255.0)
    return Images((pixels - 0.286) / 0.353, torch.from_numpy(y.astype(np.int64)))  # Fashion-MNIST's mean, std


def _idx(name: str, header: int) -> np.ndarray:
    with gzip.open(FASHION / name, "rb") as f:
        return np.frombuffer(f.read(), np.uint8, offset=header)


def _generated(n: int, n_test: int) -> tuple[np.ndarray, ...]:
    """Ten classes, each a bright bar at its own place on noise: learnable in a few steps."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 10, n + n_test)
    x = rng.integers(0, 80, (n + n_test, 28, 28)).astype(np.uint8)
    for i, label in enumerate(y):
        x[i, 2 + 2 * label:5 + 2 * label, 4:24] += 150
    return x[:n], y[:n], x[n:], y[n:]


if __name__ == "__main__":
    from asgd import train

    result = train(make_model, make_data, batch_size=32, lr=0.05, steps=200, eval_samples=2000)
    if result.summary is not None:  # the process that recorded the run (under mpiexec: rank 0)
        print(f"{result.run_dir}: {result.status}; final test error {result.final_test_error}")
    raise SystemExit(result)  # an int: the exit status
