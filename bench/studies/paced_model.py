"""A model whose minibatch takes a set time however many processes share the cores
(bench/studies/churn_mpi.py): a linear classifier that sleeps in its training forward.
A module of its own, since each rank imports it by file: nothing here but torch."""
from __future__ import annotations

import math
import time

import torch
from torch import nn


class Paced(nn.Module):
    """Sleeps `step_s` in a training forward (an evaluation does not wait)."""

    def __init__(self, step_s: float):
        super().__init__()
        self.step_s = step_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            time.sleep(self.step_s)
        return x


def make_model(shape: tuple[int, ...], num_classes: int, step_s: float = 0.2) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(shape), num_classes), Paced(step_s))
