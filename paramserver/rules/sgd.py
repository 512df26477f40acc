"""The `sgd` rule: the run's optimizer, at the server, on a pushed gradient sum (server lr,
momentum, weight decay; paramserver/optimizer.py)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from paramserver.rules.base import PushFacts, Rule, RuleSettings, Update, refusals
from paramserver.optimizer import ServerOptimizer

if TYPE_CHECKING:  # as in base.py: torch loads with the weights
    from torch import Tensor


class SGDRule(Rule):
    """The server's optimizer (torch.optim.SGD's update by default) applied to each pushed
    gradient sum; the base of `fresh`, which steps the same way on a gathered mean."""
    by_slice = False  # its state spans the vector

    pushes = "gradient"
    steps_with_optimizer = True
    PLAIN = "w_out = w - lr * (d + weight_decay * w);"  # torch's SGD without momentum
    # torch's fused SGD (dampening 0, no nesterov). Its first step sets the buffer to g:
    # the buffer starts at zeros here, and momentum * 0 + g is exactly g.
    MOMENTUM = """g = d + weight_decay * w;
momentum_buffer_out = momentum * momentum_buffer + g;
w_out = w - lr * momentum_buffer_out;"""
    FORMULAS = (PLAIN, MOMENTUM)

    def __init__(self, settings: RuleSettings, clients: int, optimizer_factory: Callable | None = None):
        super().__init__(settings, clients)
        self.optimizer = ServerOptimizer.for_settings(settings, optimizer_factory)
        self.momentum = self.optimizer.momentum
        self.weight_decay = self.optimizer.weight_decay

    @classmethod
    def check(cls, settings: RuleSettings) -> str:
        return refusals((not settings.clip_grad_norm or settings.servers == 1,
                         "clip_grad_norm: the server clips the gathered gradient by its whole norm, and with "
                         "servers > 1 each server holds a slice of it (use servers = 1, or a delta rule)"))

    @property
    def formulas_fit(self) -> bool:
        return self.optimizer.formulas_fit

    @property
    def buffer(self) -> Tensor | None:
        """SGD's momentum buffer (None before the first step, and without momentum)."""
        return self.optimizer.vectors.get("momentum_buffer")

    def apply(self, w: Tensor, push: PushFacts) -> None:
        self.optimizer.step(w, push.d, self.lr(push))

    def fused(self, push: PushFacts) -> Update:
        scalars = {"lr": self.lr(push), "weight_decay": self.weight_decay}
        if not self.momentum:  # torch keeps no buffer then, and neither does the checkpoint
            return Update(self.PLAIN, scalars)
        return Update(self.MOMENTUM, {**scalars, "momentum": self.momentum}, {"momentum_buffer": self.buffer})

    def state(self) -> dict[str, Tensor]:
        return self.optimizer.state()

    def load_state(self, state: dict[str, Tensor]) -> None:
        self.optimizer.load_state(state)

    def scalars(self) -> dict[str, float]:
        return self.optimizer.scalars()

    def load_scalars(self, values: dict[str, float]) -> None:
        self.optimizer.load_scalars(values)
