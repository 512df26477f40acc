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
    step's amplification eps / (1 - beta) is then 1; beta to 0 (docs/rules.md: measured).

    With streamed fragments (`--fragments P`, Streaming DiLoCo's setting) the rule is P of
    these side by side, one a slice: each slice keeps its slice of `total` and `momentum`
    and its own count (`counts`, by the slice's first index), so a fragment updates only
    its slice's state and a slice's momentum step comes with the N-th push of that slice.
    A client pushes each slice once a window, as it pushes the whole vector without
    fragments, so N keeps its meaning (the client windows a round gathers, default K); a
    client's last push, whole, is a push of every slice (the Store applies it slice by
    slice). The version moves by one a fragment, so a slice's round spans about P N
    versions. With P = 1 none of this runs."""
    by_slice = False  # its rounds count pushes: a slice's push is not the whole's
    per_slice = True  # so with fragments each slice keeps its own (the class docstring)

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
        self.counts: dict[int, int] = {}     # with fragments, each slice's, by its first index

    @property
    def step_d(self) -> float:
        """A push's own share: eps / N."""
        return self.outer_lr / self.every

    def look(self, due: bool) -> float:
        """The momentum's share in this push's step: eps (1 - cN + c) beta at the N-th push,
        eps c beta at the others."""
        c = self.activation
        return self.outer_lr * ((1 - c * self.every + c) if due else c) * self.beta

    def vectors(self, push: PushFacts) -> tuple[Tensor | None, Tensor | None]:
        """The pushes' sum and the momentum this push reads: the whole vectors, or a
        fragment's slices of them (made whole-length and zero the first time, so a slice
        never stepped reads a momentum of zeros: its look-ahead adds +0)."""
        if push.piece is None:
            return self.total, self.momentum
        if self.total is None:
            self.total = push.d.new_zeros(push.size)
        if self.momentum is None:
            self.momentum = push.d.new_zeros(push.size)
        return self.total[push.piece], self.momentum[push.piece]

    def apply(self, w: Tensor, push: PushFacts) -> None:
        d = push.d
        total, momentum = self.vectors(push)
        if total is None:
            total = self.total = w.new_zeros(w.shape)
        w.add_(d, alpha=self.step_d)
        total.add_(d)
        if self.counted(push.piece):
            if momentum is None:
                momentum = self.momentum = w.new_zeros(w.shape)
            momentum.mul_(self.beta).add_(total, alpha=1.0 / self.every)
            w.add_(momentum, alpha=self.look(True))
            total.zero_()
        elif self.activation and momentum is not None:
            w.add_(momentum, alpha=self.look(False))

    def fused(self, push: PushFacts) -> Update:
        (total, momentum), piece = self.vectors(push), push.piece
        scalars = {"step_d": self.step_d}

        def after() -> bool:
            return self.counted(piece)

        if not self.due(piece):
            if not self.activation or momentum is None:  # no look-ahead yet
                return Update(self.PLAIN, scalars, {"total": total}, after=after)
            return Update(self.ACTIVE, {**scalars, "look": self.look(False)}, {"total": total},
                          {"momentum": momentum}, after=after)  # the momentum read, not written
        return Update(self.LOOK_AHEAD, {**scalars, "inv_n": 1.0 / self.every, "beta": self.beta,
                                        "look": self.look(True)},
                      {"total": total, "momentum": momentum}, after=after)

    @property
    def round_left(self) -> int:
        """The pushes the open round still needs (0: none open), for the reply policy. With
        fragments none is ever open (each slice counts its own, `counts`): a client never
        waits for a fragment's answer while it has work to do, so none is held for."""
        return self.every - self.count if self.count else 0

    def due(self, piece: slice | None = None) -> bool:
        """Whether the push being applied (to `piece`, or whole) is the N-th of its slice,
        which updates the momentum."""
        return self._count(piece) + 1 == self.every

    def counted(self, piece: slice | None = None) -> bool:
        """Count the push (to `piece`, or whole); True when it was the N-th."""
        due, count = self.due(piece), (self._count(piece) + 1) % self.every
        if piece is None:
            self.count = count
        else:
            self.counts[piece.start] = count
        return due

    def _count(self, piece: slice | None) -> int:
        return self.count if piece is None else self.counts.get(piece.start, 0)

    def state(self) -> dict[str, Tensor]:
        return {k: v for k, v in (("total", self.total), ("momentum", self.momentum)) if v is not None}

    def load_state(self, state: dict[str, Tensor]) -> None:
        self.total, self.momentum = state.get("total"), state.get("momentum")

    def scalars(self) -> dict[str, float]:
        return {"count": self.count, **{f"count.{start}": n for start, n in sorted(self.counts.items())}}

    def load_scalars(self, values: dict[str, float]) -> None:
        self.count = int(values.get("count", 0))
        self.counts = {int(k[6:]): int(v) for k, v in values.items() if k.startswith("count.")}
