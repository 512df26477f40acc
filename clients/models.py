"""Models, and the flat parameter vector that clients exchange with the server.

- `cnn`: a small CNN sized for 28x28 images (the demo and the proxy-scale figures).
- `convnet`: the single-GPU ImageNet network of cuda-convnet (Krizhevsky et al. 2012),
  the network the paper trained, for paper-scale runs on 224x224 images.

Clients and the server exchange the parameters as one flat float32 vector, in the
order of `model.parameters()`. Buffers (BatchNorm's running statistics) are not in it:
training uses batch statistics, and every evaluation or export of the server's weights
estimates them afresh (`clients.evaluate.recalibrate`); docs/your-model.md says why.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch
from torch import nn

from clients.buffers import host_copy
from runconfig.settings import ConfigError, RunConfig, is_user_code, model_arguments

if TYPE_CHECKING:
    from clients.data import Dataset


def small_cnn(shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    channels, height, width = shape
    return nn.Sequential(
        nn.Conv2d(channels, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * (height // 4) * (width // 4), 128), nn.ReLU(),
        nn.Linear(128, num_classes),
    )


def cuda_convnet(shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """Five conv layers with local response normalisation, two dropout FC layers."""
    lrn = lambda: nn.LocalResponseNorm(5, alpha=1e-4, beta=0.75, k=2.0)  # noqa: E731
    return nn.Sequential(
        nn.Conv2d(shape[0], 96, 11, stride=4, padding=2), nn.ReLU(), lrn(), nn.MaxPool2d(3, 2),
        nn.Conv2d(96, 256, 5, padding=2), nn.ReLU(), lrn(), nn.MaxPool2d(3, 2),
        nn.Conv2d(256, 384, 3, padding=1), nn.ReLU(),
        nn.Conv2d(384, 384, 3, padding=1), nn.ReLU(),
        nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(), nn.MaxPool2d(3, 2),
        nn.AdaptiveAvgPool2d(6), nn.Flatten(),
        nn.Dropout(), nn.Linear(256 * 6 * 6, 4096), nn.ReLU(),
        nn.Dropout(), nn.Linear(4096, 4096), nn.ReLU(),
        nn.Linear(4096, num_classes),
    )


MODELS = {"cnn": small_cnn, "convnet": cuda_convnet}


def run_model(cfg: RunConfig, dataset: Dataset) -> nn.Module:
    """The run's model with its initial weights, built alike by every rank, the checks
    before launch and export."""
    return build_model(cfg.model, dataset.shape, dataset.num_classes, cfg.seed, model_arguments(cfg))


def build_model(name: str, shape: tuple[int, ...], num_classes: int | None, seed: int,
                model_args: dict[str, Any] | None = None) -> nn.Module:
    """The model `name` (or a user's `module:factory`, called with `model_args` as keywords,
    clients/user/code.py) with its initial weights drawn from `seed` (same seed, same weights)."""
    if is_user_code(name):
        from clients.user.code import call_model_factory
        torch.manual_seed(seed)
        return call_model_factory(name, shape, num_classes, model_args or {})
    factory = model_factory(name)
    _check_fits(name, shape, num_classes)
    torch.manual_seed(seed)
    return factory(shape, num_classes)


def _check_fits(name: str, shape: tuple[int, ...], num_classes: int | None) -> None:
    """Our models classify images: their last layer is sized from the data's class count,
    their first from its (C, H, W)."""
    if num_classes is None:
        raise ConfigError(f"model: {name} needs the number of classes, which the data does not say: give the train "
                          "Dataset a `classes` list or a `num_classes` int, or pass your own --model")
    if len(shape) != 3:
        raise ConfigError(f"model: {name} takes images (C, H, W), but the data's inputs have shape {tuple(shape)}; "
                          "pass your own --model")


def model_factory(name: str) -> Callable[..., nn.Module]:
    """One of our models by name; ValueError (one line) for any other name."""
    if name not in MODELS:
        raise ValueError(f"model: unknown model {name!r} (choose from {', '.join(MODELS)})")
    return MODELS[name]


def flat_weights(model: nn.Module) -> np.ndarray:
    """The model's parameters as one float32 host vector (a copy)."""
    return host_copy(torch.nn.utils.parameters_to_vector(model.parameters()))


@torch.no_grad()
def load_flat(model: nn.Module, weights: np.ndarray) -> None:
    """Copied into each parameter, which keeps a storage of its own (torch's
    `vector_to_parameters` makes each a view of the one vector, which safetensors refuses
    to save where a tied tensor covers only part of it)."""
    vector = torch.from_numpy(weights)
    offset = 0
    for param in model.parameters():
        param.copy_(vector[offset:offset + param.numel()].view_as(param))
        offset += param.numel()
