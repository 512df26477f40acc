"""The `easgd` rule: w += alpha * (x_i - w), alpha = beta / K; the client pushes its own
weights x_i and moves the same way back (`EASGDRule.follow`, called by clients/client.py).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from paramserver.rules.base import PushFacts, Rule, RuleSettings, Update, refusals

if TYPE_CHECKING:  # as in base.py: torch loads with the weights
    from torch import Tensor


class EASGDRule(Rule):
    """Elastic averaging (asynchronous EASGD, Zhang, Choromanska and LeCun 2015): the
    client pushes its own weights x_i; the center moves alpha of the way towards them,
    alpha = beta / K, and the client moves the same amount back (`follow`, which
    clients/client.py calls with the answer to its push)."""
    by_slice = False  # its state spans the vector

    pushes = "weights"
    FORMULA = "w_out = w + alpha * (d - w);"  # torch's lerp
    FORMULAS = (FORMULA,)

    def __init__(self, settings: RuleSettings, clients: int):
        super().__init__(settings, clients)
        self.alpha = easgd_alpha(settings.easgd_beta, clients)

    @classmethod
    def check_keys(cls, settings: RuleSettings) -> str:
        return refusals((0 < settings.easgd_beta < 1, f"easgd_beta: must be in (0, 1), got {settings.easgd_beta}"))

    @classmethod
    def check(cls, settings: RuleSettings) -> str:
        return refusals((settings.push_every == settings.fetch_every,
                          "rule: easgd needs n_push == n_fetch (each push is answered by the center it moved)"))

    @classmethod
    def client_elastic(cls, settings: RuleSettings, clients: int) -> float:
        return easgd_alpha(settings.easgd_beta, clients)

    @staticmethod
    def follow(x: Tensor, center: Tensor, alpha: float) -> None:
        """The client's side: x -= alpha (x - center_before). The server moved the center
        by that much towards x, so center_after = center_before + alpha (x - center_before),
        which gives x - center_before = (x - center_after) / (1 - alpha)."""
        x.sub_(x - center, alpha=alpha / (1 - alpha))

    def apply(self, w: Tensor, push: PushFacts) -> None:
        w.lerp_(push.d, self.alpha)

    def fused(self, push: PushFacts) -> Update:
        return Update(self.FORMULA, {"alpha": self.alpha})


def easgd_alpha(beta: float, clients: int) -> float:
    """The elastic coefficient: beta / K, as the EASGD paper sets it (beta = 0.9)."""
    return beta / clients
