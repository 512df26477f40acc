"""The `nesterov` rule: w += d / N each push; every N pushes w += beta * m, m = beta m + mean d
(delayed Nesterov, Liu et al. 2024).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from paramserver.rules.base import Rule, RuleSettings, Update, refusals

if TYPE_CHECKING:  # as in base.py: torch loads with the weights
    from torch import Tensor


class NesterovRule(Rule):
    """Delayed Nesterov momentum at the server (Liu et al. 2024, arXiv 2401.09135, for
    asynchronous local SGD): each pushed weight change d moves the weights by d / N at
    once, and every N = `nesterov_every` pushes (default K) the momentum, fed the mean of
    those N pushes, adds its look-ahead term: m = beta m + mean d, w += beta m. So a stale
    push is applied once, as a plain step, and never compounded by the momentum between
    its updates; with N = K equal-speed clients a round is one Nesterov step of the
    averaged client change (synchronous local SGD with a Nesterov server step); with one
    client, N = 1 and beta = 0 it is `add`."""

    # a plain step of d / N, and at every N-th push the momentum's look-ahead
    PLAIN = """total_out = total + d;
w_out = w + inv_n * d;"""
    LOOK_AHEAD = """momentum_out = beta * momentum + inv_n * (total + d);
total_out = 0;
w_out = (w + inv_n * d) + beta * momentum_out;"""
    FORMULAS = (PLAIN, LOOK_AHEAD)

    @classmethod
    def check_keys(cls, settings: RuleSettings) -> str:
        return refusals(
            (settings.nesterov_every >= 0, f"nesterov_every: must be non-negative (0: clients), got {settings.nesterov_every}"),
            (0 <= settings.nesterov_momentum < 1,
             f"nesterov_momentum: must be in [0, 1), got {settings.nesterov_momentum}"))

    def __init__(self, settings: RuleSettings, clients: int):
        super().__init__(settings, clients)
        self.every = settings.nesterov_every or clients
        self.beta = settings.nesterov_momentum
        self.total: Tensor | None = None     # the pushes since the last momentum update, summed
        self.momentum: Tensor | None = None
        self.count = 0                       # how many

    def apply(self, w: Tensor, d: Tensor, client: int, staleness: int) -> None:
        if self.total is None:
            self.total = w.new_zeros(w.shape)
        w.add_(d, alpha=1.0 / self.every)
        self.total.add_(d)
        if self.counted():
            if self.momentum is None:
                self.momentum = w.new_zeros(w.shape)
            self.momentum.mul_(self.beta).add_(self.total, alpha=1.0 / self.every)
            w.add_(self.momentum, alpha=self.beta)
            self.total.zero_()

    def fused(self, client: int, staleness: int) -> Update:
        scalars = {"inv_n": 1.0 / self.every}
        if not self.due():
            return Update(self.PLAIN, scalars, {"total": self.total}, after=self.counted)
        return Update(self.LOOK_AHEAD, {**scalars, "beta": self.beta}, {"total": self.total, "momentum": self.momentum},
                      after=self.counted)

    def due(self) -> bool:
        """Whether the push being applied is the N-th, which updates the momentum."""
        return self.count + 1 == self.every

    def counted(self) -> bool:
        """Count the push; True when it was the N-th."""
        due, self.count = self.due(), (self.count + 1) % self.every
        return due

    def state(self) -> dict[str, Tensor]:
        return {k: v for k, v in (("total", self.total), ("momentum", self.momentum)) if v is not None}

    def load_state(self, state: dict[str, Tensor]) -> None:
        self.total, self.momentum = state.get("total"), state.get("momentum")

    def scalars(self) -> dict[str, float]:
        return {"count": self.count}

    def load_scalars(self, values: dict[str, float]) -> None:
        self.count = int(values.get("count", 0))
