"""The plain single-process PyTorch SGD loop that async training must reduce to."""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from clients.data import Dataset
from clients.models import build_model
from clients.sampling import ShardSampler, shard_indices


def plain_sgd(dataset: Dataset, steps: int, *, model: str = "cnn", seed: int = 0, batch_size: int = 32,
              lr: float = 0.05, momentum: float = 0.9, weight_decay: float = 5e-4, clients: int = 1,
              optimizer: str = "SGD", lr_lambda: Callable[[int], float] | None = None,
              clip_grad_norm: float = 0.0, autocast: torch.dtype | None = None, nesterov: bool = False) -> np.ndarray:
    """Final weights, flattened, of `steps` minibatches of torch.optim.SGD (or of another
    torch.optim class named by `optimizer`, at the same lr and weight decay), the gradient
    clipped by torch.nn.utils.clip_grad_norm_ to `clip_grad_norm` (0: not), the forward
    under torch.autocast to `autocast` (float16: with torch's GradScaler, as its recipe).

    Each minibatch joins the next `batch_size` samples of each of `clients` shards (in
    the order those clients would see them under the default run's budget), so one client gives client 0's run and K
    clients give the batch K*B that synchronous data parallelism is equivalent to.
    `lr_lambda`: a torch LambdaLR multiplier of the steps taken, stepped after each."""
    net = build_model(model, dataset.shape, dataset.num_classes, seed)
    if optimizer == "SGD":
        optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay,
                                    nesterov=nesterov)
    else:
        optimizer = getattr(torch.optim, optimizer)(net.parameters(), lr=lr, weight_decay=weight_decay)
    scaler = torch.amp.GradScaler("cpu") if autocast == torch.float16 else None
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda) if lr_lambda else None
    # dealt afresh each epoch, as under the run's budget
    redeal = (len(dataset.train), clients) if clients > 1 else None
    samplers = [ShardSampler(shard_indices(len(dataset.train), clients, k, seed), batch_size, seed, k, redeal)
                for k in range(clients)]
    for _ in range(steps):
        x, y = dataset.train.batch(np.concatenate([s.next() for s in samplers]))
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
            loss = torch.nn.functional.cross_entropy(net(x), y)
        if scaler:
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
        else:
            loss.backward()
        if clip_grad_norm:
            torch.nn.utils.clip_grad_norm_(net.parameters(), clip_grad_norm)
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        if scheduler:
            scheduler.step()
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()]).numpy()
