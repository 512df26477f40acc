"""The `adagrad` rule: w -= lr * g / (sqrt(sum g^2) + eps) (Downpour's server-side Adagrad)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from paramserver.rules.base import PushFacts, Rule, RuleSettings, Update

if TYPE_CHECKING:  # as in base.py: torch loads with the weights
    from torch import Tensor


class AdagradRule(Rule):
    """Downpour's server-side Adagrad on a pushed gradient sum: each weight's step is the
    server lr over the root of its squared pushes so far (torch.optim.Adagrad's update).
    A push of n_sync minibatches makes one step, as in Downpour; counting its squares as
    1 / n_sync each, so that it would move about as far as n_sync pushes of one, diverged
    (docs/rules.md), so it is not done."""
    by_slice = False  # its state spans the vector

    pushes = "gradient"
    EPS = 1e-10  # torch.optim.Adagrad's
    # Its lr is each weight's first step whatever the gradient's scale (g / sqrt(g^2) = +-1),
    # not a multiple of the gradient as SGD's is, so the run's SGD lr does not carry over
    # (docs/rules.md measures it): torch.optim.Adagrad's default instead.
    DEFAULTS = {"server_lr": 0.01}
    # torch's add(alpha) and addcmul as its AVX2/AVX-512 kernels compute them (one rounding;
    # at the default capability torch rounds the product first), its addcdiv: w + value * g /
    # denominator, (value * g) rounded first
    FORMULA = """g = fmadd(weight_decay, w, d);
sum_out = fmadd(g, g, sum);
w_out = w + neg_lr * g / (sqrt(sum_out) + eps);"""
    FORMULAS = (FORMULA,)

    def __init__(self, settings: RuleSettings, clients: int):
        super().__init__(settings, clients)
        self.weight_decay = settings.weight_decay
        self.sum: Tensor | None = None

    def apply(self, w: Tensor, push: PushFacts) -> None:
        d = push.d
        g = d.add(w, alpha=self.weight_decay) if self.weight_decay else d
        if self.sum is None:
            self.sum = w.new_zeros(w.shape)
        self.sum.addcmul_(g, g)
        w.addcdiv_(g, self.sum.sqrt().add_(self.EPS), value=-self.lr(push))

    def fused(self, push: PushFacts) -> Update:
        return Update(self.FORMULA, {"neg_lr": -self.lr(push), "weight_decay": self.weight_decay, "eps": self.EPS},
                      {"sum": self.sum})

    def state(self) -> dict[str, Tensor]:
        return {} if self.sum is None else {"sum": self.sum}

    def load_state(self, state: dict[str, Tensor]) -> None:
        self.sum = state.get("sum")
