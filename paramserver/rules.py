"""Server update rules: how a pushed vector changes the weights.

A rule is a small strategy object with state the checkpoint can save. All work in
place on float32 numpy arrays so an apply costs about one pass over the weights.

- `add`: the client pushes the change its own optimizer made to its weights (the
  paper's setting, our default); the server adds it.
- `sgd`: the client pushes the sum of its raw loss gradients over the window; the
  server applies weight decay, momentum (`server_momentum`) and its learning rate,
  exactly as `torch.optim.SGD` does.
"""
from __future__ import annotations

import numpy as np


class AddRule:
    """w += delta. Stateless."""

    def apply(self, weights: np.ndarray, push: np.ndarray) -> None:
        np.add(weights, push, out=weights)

    def state(self) -> dict[str, np.ndarray]:
        return {}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        pass


class SGDRule:
    """torch.optim.SGD's update, applied by the server to a pushed gradient sum."""

    def __init__(self, lr: float, momentum: float = 0.0, weight_decay: float = 0.0):
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.buffer: np.ndarray | None = None

    def apply(self, weights: np.ndarray, push: np.ndarray) -> None:
        grad = push + self.weight_decay * weights if self.weight_decay else push.copy()
        if self.momentum:
            if self.buffer is None:
                self.buffer = grad  # torch starts the buffer at the first gradient
            else:
                self.buffer *= self.momentum
                self.buffer += grad
            grad = self.buffer
        weights -= np.float32(self.lr) * grad

    def state(self) -> dict[str, np.ndarray]:
        return {} if self.buffer is None else {"momentum_buffer": self.buffer}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        self.buffer = state.get("momentum_buffer")


RULES = ("add", "sgd")


def make_rule(name: str, lr: float, momentum: float, weight_decay: float) -> AddRule | SGDRule:
    """The rule called `name`; the lr/momentum/weight decay matter to gradient rules only."""
    if name == "add":
        return AddRule()
    if name == "sgd":
        return SGDRule(lr, momentum, weight_decay)
    raise ValueError(f"rule: unknown rule {name!r} (choose from {', '.join(RULES)})")
