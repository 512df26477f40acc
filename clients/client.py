"""One model replica: local SGD steps between syncs, and what it pushes. No MPI inside.

The client keeps `base`, the weights as they would be without its unpushed work.
A push hands over the work done since the last push (the weight change, or for
gradient rules the summed gradients) and moves `base` up to the current weights. A
fetch replaces the weights with the server's plus any work not pushed yet, so with
n_push == n_fetch (the paper's setting) the client simply takes the server's weights.
Momentum and weight decay stay in the client's own optimizer.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from clients.data import ShardSampler, Split
from clients.models import FlatParams, host_copy


@dataclass(frozen=True)
class StepResult:
    loss: float
    error: float
    samples: int


class Client:
    def __init__(self, model: nn.Module, train: Split, sampler: ShardSampler, *,
                 lr: float, momentum: float, weight_decay: float,
                 push_gradients: bool = False, device: str = "cpu"):
        self.model = model.to(device)
        self.device = torch.device(device)
        self.flat = FlatParams(self.model)
        self.train, self.sampler = train, sampler
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=momentum,
                                         weight_decay=weight_decay)
        self.push_gradients = push_gradients
        self.grad_sum = torch.zeros_like(self.flat.grad) if push_gradients else None
        self.base = self.flat.to_host()
        self.incoming = np.empty_like(self.base)  # where pulled weights land
        self.unpushed_steps = 0

    def step(self) -> StepResult:
        """One minibatch: forward, backward, local optimizer step."""
        x, y = self.train.batch(self.sampler.next())
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=False)  # keep grads as views of the flat buffer
        logits = self.model(x)
        loss = nn.functional.cross_entropy(logits, y)
        loss.backward()
        if self.grad_sum is not None:
            self.grad_sum += self.flat.grad
        self.optimizer.step()
        self.unpushed_steps += 1
        wrong = (logits.argmax(1) != y).sum()
        return StepResult(loss.item(), wrong.item() / len(y), len(y))

    def take_push(self) -> np.ndarray:
        """The work since the last push, as one flat float32 host vector."""
        weights = self.flat.to_host()
        if self.grad_sum is not None:
            push = host_copy(self.grad_sum)
            self.grad_sum.zero_()
        else:
            push = weights - self.base
        self.base = weights
        self.unpushed_steps = 0
        return push

    def sync(self, weights: np.ndarray) -> None:
        """Take the server's weights, keeping any local work not pushed yet."""
        if self.unpushed_steps:
            pending = self.flat.to_host() - self.base
            self.flat.load(weights + pending)
        else:
            self.flat.load(weights)
        self.base = weights.copy()
