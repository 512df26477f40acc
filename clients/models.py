"""Models, and the flat parameter vector that clients exchange with the server.

- `cnn`: a small CNN sized for 28x28 images (the demo and the proxy-scale figures).
- `convnet`: the single-GPU ImageNet network of cuda-convnet (Krizhevsky et al. 2012),
  the network the paper trained, for paper-scale runs on 224x224 images.

`FlatParams` makes every parameter a view into one contiguous vector, so a push or
pull copies one buffer instead of gathering dozens of tensors.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn


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


def build_model(name: str, shape: tuple[int, int, int], num_classes: int, seed: int) -> nn.Module:
    """The model `name` with its initial weights drawn from `seed` (same seed, same weights)."""
    if name not in MODELS:
        raise ValueError(f"model: unknown model {name!r} (choose from {', '.join(MODELS)})")
    torch.manual_seed(seed)
    return MODELS[name](shape, num_classes)


class FlatParams:
    """One contiguous float32 vector that the model's parameters (and grads) view into."""

    def __init__(self, model: nn.Module):
        params = [p for p in model.parameters() if p.requires_grad]
        device = params[0].device
        self.vector = torch.cat([p.detach().reshape(-1) for p in params]).to(device, torch.float32)
        self.grad = torch.zeros_like(self.vector)
        offset = 0
        for p in params:
            n = p.numel()
            p.data = self.vector[offset:offset + n].view_as(p)
            # Autograd accumulates into an existing .grad in place, so grads stay views
            # as long as the optimizer zeroes them instead of setting them to None.
            p.grad = self.grad[offset:offset + n].view_as(p)
            offset += n

    @property
    def size(self) -> int:
        return self.vector.numel()

    def to_host(self) -> np.ndarray:
        """A host copy of the weights (a copy, never a view of the live vector)."""
        return host_copy(self.vector)

    def load(self, weights: np.ndarray) -> None:
        self.vector.copy_(torch.from_numpy(weights))


def host_copy(tensor: torch.Tensor) -> np.ndarray:
    """`.cpu()` already copies a device tensor (and waits for its stream); a host one needs a copy."""
    tensor = tensor.detach()
    return tensor.numpy().copy() if tensor.device.type == "cpu" else tensor.cpu().numpy()
