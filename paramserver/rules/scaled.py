"""The `scaled` rule: w += d / K."""
from __future__ import annotations

from typing import TYPE_CHECKING

from paramserver.rules.base import PushFacts, Rule, Update

if TYPE_CHECKING:  # as in base.py: torch loads with the weights
    from torch import Tensor


class ScaledRule(Rule):
    """w += d / K: every push moves the weights 1/K of a client's step."""

    STEP = "w_out = w + alpha * d;"
    FORMULAS = (STEP,)

    def apply(self, w: Tensor, push: PushFacts) -> None:
        w.add_(push.d, alpha=1.0 / self.clients)

    def fused(self, push: PushFacts) -> Update:
        return Update(self.STEP, {"alpha": 1.0 / self.clients})
