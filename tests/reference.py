"""The plain single-process PyTorch SGD loop that async training must reduce to."""
from __future__ import annotations

import numpy as np
import torch

from clients.data import Dataset, ShardSampler, shard_indices
from clients.models import build_model


def plain_sgd(dataset: Dataset, steps: int, *, model: str = "cnn", seed: int = 0, batch_size: int = 32,
              lr: float = 0.05, momentum: float = 0.9, weight_decay: float = 5e-4) -> np.ndarray:
    """Final weights, flattened, of `steps` minibatches of torch.optim.SGD over client 0's order."""
    net = build_model(model, dataset.shape, dataset.num_classes, seed)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    sampler = ShardSampler(shard_indices(len(dataset.train), 1, 0, seed), batch_size, seed, 0)
    for _ in range(steps):
        x, y = dataset.train.batch(sampler.next())
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        optimizer.step()
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()]).numpy()
