"""The `staleness` rule: w += d * min(1, K / (tau + 1)) / K (delay-adaptive; Mishchenko et al. 2022)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from paramserver.rules.base import PushFacts, Rule, Update
from paramserver.rules.scaled import ScaledRule

if TYPE_CHECKING:  # as in base.py: torch loads with the weights
    from torch import Tensor


class StalenessRule(Rule):
    """The delay-adaptive step of Mishchenko et al. (2022) on a 1/K base: a straggler's
    stale push moves the weights less (`staleness_factor`)."""

    FORMULAS = (ScaledRule.STEP,)

    def apply(self, w: Tensor, push: PushFacts) -> None:
        w.add_(push.d, alpha=staleness_factor(push.staleness, self.clients))

    def fused(self, push: PushFacts) -> Update:
        return Update(ScaledRule.STEP, {"alpha": staleness_factor(push.staleness, self.clients)})


def staleness_factor(staleness: int, clients: int) -> float:
    """min(1, K / (tau + 1)) / K: 1 for a fresh push with one client, 1/K for a push
    one round of K clients old, 1/(tau + 1) for a staler one."""
    return min(1.0, clients / (staleness + 1)) / clients
