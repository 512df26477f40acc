"""The `nesterov` rule: delayed Nesterov (Liu et al. 2024), the outer step of asynchronous
DiLoCo: w += eps d / N each push; every N pushes m = beta m + mean d, w += eps beta m.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from paramserver.rules.base import PushFacts, Rule, RuleSettings, Update, refusals

if TYPE_CHECKING:  # as in base.py: torch loads with the weights
    from torch import Tensor


class NesterovRule(Rule):
    """Delayed Nesterov momentum at the server (Liu et al. 2024, arXiv 2401.09135, Algorithm
    3, for asynchronous local SGD; the outer step of asynchronous DiLoCo): the clients push
    their local change d = -g (g: the pseudo-gradient, pulled minus local weights); every
    push moves the weights by its own share, and every N = `nesterov_every` pushes (default
    K) the momentum, fed the mean of those N pushes, adds its look-ahead term. With outer lr
    eps = `outer_lr`, beta = `nesterov_momentum` (0 unless given), activation c = `nesterov_activation`:
        each push         Delta += g
        the N-th push     m = beta m + Delta / N; w -= eps ((1 - cN + c) beta m + g / N); Delta = 0
        the others        w -= eps (c beta m + g / N)
    (kept here in terms of d, so `total` is -Delta and `momentum` is -m). So a stale push
    is applied once, as a plain step, and never compounded by the momentum between its
    updates; with N = K equal-speed clients a round is one Nesterov step of the averaged
    client change (synchronous local SGD with a Nesterov server step) when the clients
    pull after it (paramserver/reply/policy.py); with one client, N = 1, eps = 1 and
    beta = 0 it is `add`. At eps = 1 and c = 0 it is the arithmetic of the rule before it
    had them, bit for bit. eps defaults to 1 - beta (RunConfig.outer_step_lr): the outer
    step's amplification eps / (1 - beta) is then 1; beta to 0 (docs/rules.md: measured)."""
    by_slice = False  # its state spans the vector

    # a plain step of eps d / N (plus, with c > 0, a share of the momentum's look-ahead), and
    # at every N-th push the momentum's update and the rest of its look-ahead
    PLAIN = """total_out = total + d;
w_out = w + step_d * d;"""
    ACTIVE = """total_out = total + d;
w_out = (w + step_d * d) + look * momentum;"""
    LOOK_AHEAD = """momentum_out = beta * momentum + inv_n * (total + d);
total_out = 0;
w_out = (w + step_d * d) + look * momentum_out;"""
    FORMULAS = (PLAIN, ACTIVE, LOOK_AHEAD)
    rounds = True  # steps by rounds of N pushes: the reply policy may hold a round's early pushers
    outer_step = True  # takes `outer_lr` and `nesterov_momentum` (runconfig/checks.py refuses them elsewhere)

    @classmethod
    def check_keys(cls, settings: RuleSettings) -> str:
        return refusals(
            (settings.nesterov_every >= 0, f"nesterov_every: must be non-negative (0: clients), got {settings.nesterov_every}"),
            (0 <= settings.outer_momentum < 1,
             f"nesterov_momentum: must be in [0, 1), got {settings.nesterov_momentum}"),
            (settings.outer_lr is None or settings.outer_lr > 0,
             f"outer_lr: must be positive, got {settings.outer_lr}"),
            (0 <= settings.nesterov_activation <= 1,
             f"nesterov_activation: must be in [0, 1], got {settings.nesterov_activation}"))

    def __init__(self, settings: RuleSettings, clients: int):
        super().__init__(settings, clients)
        self.every = settings.nesterov_every or clients
        self.beta = settings.outer_momentum
        self.outer_lr = settings.outer_step_lr
        self.activation = settings.nesterov_activation
        self.total: Tensor | None = None     # the pushes since the last momentum update, summed
        self.momentum: Tensor | None = None
        self.count = 0                       # how many

    @property
    def step_d(self) -> float:
        """A push's own share: eps / N."""
        return self.outer_lr / self.every

    def look(self, due: bool) -> float:
        """The momentum's share in this push's step: eps (1 - cN + c) beta at the N-th push,
        eps c beta at the others."""
        c = self.activation
        return self.outer_lr * ((1 - c * self.every + c) if due else c) * self.beta

    def apply(self, w: Tensor, push: PushFacts) -> None:
        d = push.d
        if self.total is None:
            self.total = w.new_zeros(w.shape)
        w.add_(d, alpha=self.step_d)
        self.total.add_(d)
        if self.counted():
            if self.momentum is None:
                self.momentum = w.new_zeros(w.shape)
            self.momentum.mul_(self.beta).add_(self.total, alpha=1.0 / self.every)
            w.add_(self.momentum, alpha=self.look(True))
            self.total.zero_()
        elif self.activation and self.momentum is not None:
            w.add_(self.momentum, alpha=self.look(False))

    def fused(self, push: PushFacts) -> Update:
        scalars = {"step_d": self.step_d}
        if not self.due():
            if not self.activation or self.momentum is None:  # no look-ahead yet
                return Update(self.PLAIN, scalars, {"total": self.total}, after=self.counted)
            return Update(self.ACTIVE, {**scalars, "look": self.look(False)}, {"total": self.total},
                          {"momentum": self.momentum}, after=self.counted)  # the momentum read, not written
        return Update(self.LOOK_AHEAD, {**scalars, "inv_n": 1.0 / self.every, "beta": self.beta,
                                        "look": self.look(True)},
                      {"total": self.total, "momentum": self.momentum}, after=self.counted)

    @property
    def round_left(self) -> int:
        """The pushes the open round still needs (0: none open), for the reply policy."""
        return self.every - self.count if self.count else 0

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
