"""The `dcasgd` rule: w += d - lam0 / sqrt(ms) * g*g*(w - w_pulled) * lr, g = -d/lr (DC-ASGD-a)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from paramserver.rules.base import PushFacts, Rule, RuleSettings, Update, refusals

if TYPE_CHECKING:  # as in base.py: torch loads with the weights
    from torch import Tensor


class DCASGDRule(Rule):
    """Delay-compensated ASGD with adaptive lambda (DC-ASGD-a, Zheng et al. 2017).

    The push d is the client's step, so its gradient is g = -d / lr. The server keeps the
    weights each client last pulled (K copies of the model: the memory the method costs)
    and corrects the stale gradient by the first-order term of its change since then,
    g + lam * g*g*(w - w_pulled), lam = lam0 / sqrt(mean square of g) (moving average,
    m = 0.95). lam0 = 0 is `add`."""
    by_slice = False  # its state spans the vector

    MOMENTUM, EPS = 0.95, 1e-7
    # DC-ASGD-a's published lam0, with its m (MOMENTUM): Zheng et al. 2017's CIFAR-10 runs
    DEFAULTS = {"dc_lambda": 2.0}
    # keep = 0, take = 1 on the first step: the mean square starts at g^2 exactly
    FORMULA = """g2 = (d / lr) * (d / lr);
meansquare_out = keep * meansquare + take * g2;
w_out = (w + d) - lr_lam * (g2 * (w - pulled) / (sqrt(meansquare_out) + eps));"""
    FORMULAS = (Rule.ADD, FORMULA)

    @classmethod
    def check_keys(cls, settings: RuleSettings) -> str:
        lam0 = cls.setting(settings, "dc_lambda")
        return refusals((lam0 >= 0, f"dc_lambda: must be non-negative, got {lam0}"))

    def __init__(self, settings: RuleSettings, clients: int):
        super().__init__(settings, clients)
        self.base_lr, self.lam0 = settings.lr, self.setting(settings, "dc_lambda")  # the clients' lr: g = -d / lr
        self.backups: dict[int, Tensor] = {}
        self.meansquare: Tensor | None = None

    def pulled(self, client: int, w: Tensor) -> None:
        if client in self.backups:
            self.backups[client].copy_(w)
        else:
            self.backups[client] = w.clone()

    def apply(self, w: Tensor, push: PushFacts) -> None:
        d, client, lr = push.d, push.client, self.lr(push)
        if not self.lam0 or client not in self.backups:
            w.add_(d)
            return
        g2 = (d / lr).square_()
        if self.meansquare is None:
            self.meansquare = g2.clone()
        else:
            self.meansquare.mul_(self.MOMENTUM).add_(g2, alpha=1 - self.MOMENTUM)
        # w += d - lr * lam * g^2 * (w - w_pulled), lam = lam0 / sqrt(ms)
        g2.mul_(w - self.backups[client]).div_(self.meansquare.sqrt().add_(self.EPS))
        w.add_(d).sub_(g2, alpha=lr * self.lam0)

    def fused(self, push: PushFacts) -> Update:
        client, lr = push.client, self.lr(push)
        if not self.lam0 or client not in self.backups:
            return Update(self.ADD)
        keep = 0.0 if self.meansquare is None else self.MOMENTUM
        scalars = {"lr": lr, "lr_lam": lr * self.lam0, "eps": self.EPS, "keep": keep, "take": 1 - keep}
        return Update(self.FORMULA, scalars, {"meansquare": self.meansquare}, {"pulled": self.backups[client]})

    def state(self) -> dict[str, Tensor]:
        arrays = {f"backup.{c}": b for c, b in self.backups.items()}
        return arrays if self.meansquare is None else {**arrays, "meansquare": self.meansquare}

    def load_state(self, state: dict[str, Tensor]) -> None:
        self.backups = {int(k.split(".")[1]): v for k, v in state.items() if k.startswith("backup.")}
        self.meansquare = state.get("meansquare")
