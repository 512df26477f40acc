"""Server update rules: how a pushed vector changes the weights.

A rule is a small strategy object: which update, its settings, and state the checkpoint
can save. The arithmetic runs where the weights live (`paramserver/arrays.py`: numpy in
place on the host by default, a fused kernel on a GPU), about one pass over the weights.

- `add`: the client pushes the change its own optimizer made to its weights (the
  paper's setting, our default); the server adds it.
- `sgd`: the client pushes the sum of its raw loss gradients over the window; the
  server applies weight decay, momentum (`server_momentum`) and its learning rate,
  exactly as `torch.optim.SGD` does.
"""
from __future__ import annotations

from typing import Any


class AddRule:
    """w += delta. Stateless."""

    def apply(self, weights: Any, push: Any, backend: Any) -> None:
        backend.add(weights, push)

    def state(self) -> dict[str, Any]:
        return {}

    def load_state(self, state: dict[str, Any]) -> None:
        pass


class SGDRule:
    """torch.optim.SGD's update, applied by the server to a pushed gradient sum."""

    def __init__(self, lr: float, momentum: float = 0.0, weight_decay: float = 0.0):
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.buffer: Any = None  # the momentum buffer, an array of the weights' backend

    def apply(self, weights: Any, push: Any, backend: Any) -> None:
        self.buffer = backend.sgd(weights, push, self.buffer, self.lr, self.momentum, self.weight_decay)

    def state(self) -> dict[str, Any]:
        return {} if self.buffer is None else {"momentum_buffer": self.buffer}

    def load_state(self, state: dict[str, Any]) -> None:
        self.buffer = state.get("momentum_buffer")


RULES = ("add", "sgd")


def make_rule(name: str, lr: float, momentum: float, weight_decay: float) -> AddRule | SGDRule:
    """The rule called `name`; the lr/momentum/weight decay matter to gradient rules only."""
    if name == "add":
        return AddRule()
    if name == "sgd":
        return SGDRule(lr, momentum, weight_decay)
    raise ValueError(f"rule: unknown rule {name!r} (choose from {', '.join(RULES)})")
