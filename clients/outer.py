"""The outer step of synchronous DiLoCo (`--mode local-sgd`; Douillard et al. 2023,
arXiv 2311.08455, Algorithm 1): at every averaging step the round's pseudo-gradient,
the global weights the round started from minus the clients' mean (the mean of
global - local), is the gradient of an outer
`torch.optim.SGD(lr=outer_lr, momentum=nesterov_momentum, nesterov=True)`, whose step
makes the next round's global weights, which every client then takes. Each client's
inner optimizer (the run's `optimizer`) keeps its state across rounds, as DiLoCo's does.

Outer lr 1 and momentum 0 are plain averaging: then there is no outer step at all
(`for_run` gives None), so the run is today's local SGD bit for bit (a step of lr 1
would round global - (global - mean) differently from the mean).

Every rank of an MPI run holds its own copy and steps it alike: the allreduce gives
every rank the same mean, so the global weights and the momentum stay the same
everywhere without another collective. The momentum is checkpointed (`state`) at the
averaging steps, where the run can go on from; the global weights then are the
clients' own.
"""
from __future__ import annotations

import numpy as np
import torch


MOMENTUM = "momentum"  # the name of the momentum buffer in a checkpoint's `outer` arrays


class OuterStep:
    """DiLoCo's outer optimizer over the flat weights every client holds alike."""

    def __init__(self, weights: torch.Tensor, lr: float, momentum: float, state: dict[str, np.ndarray]):
        self.global_weights = weights.detach().clone()
        self.optimizer = torch.optim.SGD([self.global_weights], lr=lr, momentum=momentum, nesterov=momentum > 0,
                                         foreach=False)
        if MOMENTUM in state:
            buffer = torch.as_tensor(state[MOMENTUM]).to(weights.device, weights.dtype)
            self.optimizer.state[self.global_weights]["momentum_buffer"] = buffer

    @classmethod
    def for_run(cls, lr: float | None, momentum: float, weights: torch.Tensor,
                state: dict[str, np.ndarray]) -> OuterStep | None:
        """The run's outer step from `weights` (the clients' at the start, or at the
        checkpoint resumed from); None where it is plain averaging, or where the run
        averages no weights (`lr` None: sync mode)."""
        if lr is None or (lr == 1.0 and momentum == 0.0):
            return None
        return cls(weights, lr, momentum, state)

    def step(self, averaged: list[torch.Tensor]) -> None:
        """The outer step on the clients' mean (every tensor of `averaged` holds it); each
        then holds the new global weights."""
        self.global_weights.grad = self.global_weights - averaged[0]
        self.optimizer.step()
        for tensor in averaged:
            tensor.copy_(self.global_weights)

    def state(self) -> dict[str, np.ndarray]:
        """The momentum, for a checkpoint (none before the first round, or without momentum)."""
        buffer = self.optimizer.state.get(self.global_weights, {}).get("momentum_buffer")
        return {} if buffer is None else {MOMENTUM: buffer.detach().cpu().numpy().copy()}
