"""The `sgd` rule: torch.optim.SGD on a pushed gradient sum (server lr, momentum, decay),
and `sgd`, torch's SGD arithmetic on one flat vector, which every client step uses too.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from paramserver.rules.base import Rule, RuleSettings, Update

if TYPE_CHECKING:  # as in base.py: torch loads with the weights
    from torch import Tensor


def sgd(w: Tensor, g: Tensor, buffer: Tensor | None, *, lr: float, momentum: float,
        weight_decay: float) -> Tensor | None:
    """torch.optim.SGD's own arithmetic (its fused kernel; dampening 0, no nesterov) on one
    flat vector, in place; returns the momentum buffer (torch starts one at the first
    gradient when given None; None without momentum). The server's sgd rule and every
    client step with it: called directly, it skips torch.optim.Optimizer, whose first
    step imports torch._dynamo, a start-up cost in every process that trains
    (docs/performance.md)."""
    from torch.optim.sgd import sgd as torch_sgd

    buffers = [buffer]
    torch_sgd([w], [g], buffers, fused=True, lr=lr, momentum=momentum, weight_decay=weight_decay,
              dampening=0.0, nesterov=False, maximize=False)
    return buffers[0]


class SGDRule(Rule):
    """torch.optim.SGD's update, applied by the server to a pushed gradient sum."""

    pushes = "gradient"
    PLAIN = "w_out = w - lr * (d + weight_decay * w);"  # torch's SGD without momentum
    # torch's fused SGD (dampening 0, no nesterov). Its first step sets the buffer to g:
    # the buffer starts at zeros here, and momentum * 0 + g is exactly g.
    MOMENTUM = """g = d + weight_decay * w;
momentum_buffer_out = momentum * momentum_buffer + g;
w_out = w - lr * momentum_buffer_out;"""
    FORMULAS = (PLAIN, MOMENTUM)

    def __init__(self, settings: RuleSettings, clients: int):
        super().__init__(settings, clients)
        self.momentum = settings.effective_server_momentum
        self.weight_decay = settings.weight_decay
        self.buffer: Tensor | None = None  # torch starts it at the first gradient

    def apply(self, w: Tensor, d: Tensor, client: int, staleness: int) -> None:
        self.sgd_step(w, d, self.lr)

    def fused(self, client: int, staleness: int) -> Update:
        scalars = {"lr": self.lr, "weight_decay": self.weight_decay}
        if not self.momentum:  # torch keeps no buffer then, and neither does the checkpoint
            return Update(self.PLAIN, scalars)
        return Update(self.MOMENTUM, {**scalars, "momentum": self.momentum}, {"momentum_buffer": self.buffer})

    def sgd_step(self, w: Tensor, g: Tensor, lr: float) -> None:
        self.buffer = sgd(w, g, self.buffer, lr=lr, momentum=self.momentum, weight_decay=self.weight_decay)

    def state(self) -> dict[str, Tensor]:
        return {} if self.buffer is None else {"momentum_buffer": self.buffer}

    def load_state(self, state: dict[str, Tensor]) -> None:
        self.buffer = state.get("momentum_buffer")
