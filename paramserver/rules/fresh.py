"""The `fresh` rule: gather gradient pushes at most R versions old until they cover S
minibatches, then one step of the run's optimizer on their mean (Rennala / Ringmaster ASGD).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from paramserver.rules.base import PushFacts, RuleSettings, Update, refusals
from paramserver.rules.scaling import gain, ramped_scale
from paramserver.rules.sgd import SGDRule

if TYPE_CHECKING:  # as in base.py: torch loads with the weights
    from torch import Tensor


class FreshRule(SGDRule):
    """A step on fresh gradients only (Rennala SGD, Tyurin & Richtarik 2023, arXiv
    2305.12387; Ringmaster ASGD, Maranjyan, Tyurin & Richtarik 2025, arXiv 2501.16168).

    Pushed gradient sums computed at most R = `max_staleness` versions ago are summed
    until they cover S = `fresh_batch` minibatches; then one step of the run's optimizer
    (SGD with the server's momentum by default; paramserver/optimizer.py) on their mean, at the lr for that many minibatches (times their count
    with `lr_scaling = "linear"`, its root with "sqrt") and at the schedule's factor of
    the gather's first push, the progress its gradients were computed at. Staler pushes
    are dropped. The version moves only at a step, so staleness counts steps. With `fresh_reply = "wait"` a client
    whose push was gathered gets its reply at the step (S = K, R = 0 at equal speeds is
    then synchronous SGD); with "again" it gets the weights at once and computes there
    again, as a fast Rennala worker does; with "auto" it waits when the step is due
    before it could push again, else computes again (the reply policy decides:
    paramserver/reply/policy.py; with sharded servers server 0 decides and the others
    follow it, paramserver/drivers/follow.py). `fresh_batch = "auto"`: S =
    B_simple / b from the gradient noise scale, in [1, 4K] (K x n_push until it is
    measured).

    `lr_scaling = "adascale"`: the step's lr is times AdaScale's gain r = (1 + B/b) /
    (1 + B/(S b)) from the noise scale B measured so far (rules/scaling.py `gain`; 1
    before the first window closes), not ramped, and the rule counts the schedule's
    progress itself: `own_progress`, the steps' gains summed (AdaScale's tau), in minibatches,
    whose samples (x b) the replies carry, so warmup and decay stretch as AdaScale's do."""

    gathers = True
    # a push gathered (the weights copied through), or the one that completes the step:
    # the SGD step on the mean of the gathered pushes and this one
    GATHER = """total_out = total + d;
w_out = w;"""
    STEP_PLAIN = """g = (total + d) * inv_count + weight_decay * w;
total_out = 0;
w_out = w - lr * g;"""
    STEP = """g = (total + d) * inv_count + weight_decay * w;
momentum_buffer_out = momentum * momentum_buffer + g;
total_out = 0;
w_out = w - lr * momentum_buffer_out;"""
    FORMULAS = (GATHER, STEP_PLAIN, STEP)

    def __init__(self, settings: RuleSettings, clients: int, optimizer_factory: Callable | None = None):
        super().__init__(settings, clients, optimizer_factory)
        self.max_staleness = settings.max_staleness
        self.auto = settings.fresh_batch == "auto"
        self.fixed = fixed_batch(settings, clients)
        self.scaling = settings.lr_scaling
        self.batch_size = settings.batch_size
        self.total: Tensor | None = None  # the gathered pushes, summed
        self.covered = 0                  # the minibatches they cover
        self.gather_factor = 1.0          # the lr factor at the gather's first push
        self.gather_ramp = 1.0            # and the scaling's ramp there
        self.adascale = settings.lr_scaling == "adascale"
        self.own_progress = 0.0 if self.adascale else None

    @classmethod
    def check_keys(cls, settings: RuleSettings) -> str:
        batch = settings.fresh_batch
        return refusals(
            (batch == "auto" or batch >= 0,
             f"fresh_batch: must be a positive number of minibatches, 0 (clients) or auto, got {batch!r}"),
            (settings.max_staleness >= 0, f"max_staleness: must be non-negative, got {settings.max_staleness}"))

    @classmethod
    def check(cls, settings: RuleSettings) -> str:
        return super().check(settings) or refusals(
            (settings.fresh_batch != "auto" or settings.servers == 1,
             "fresh_batch: auto needs servers = 1 (each server sees only its slice's gradient norms)"))

    @classmethod
    def versions(cls, settings: RuleSettings, pushes: int, clients: int) -> int:
        return max(1, pushes * settings.push_every // fixed_batch(settings, clients))  # a push covers n_push

    @property
    def step_batch(self) -> int:
        """S, the minibatches a step gathers: fixed, or from the noise scale."""
        if not self.auto or not self.noise.windows:
            return self.fixed
        estimate = self.noise.estimate
        wanted = 4 * self.clients if estimate is None else round(estimate / self.batch_size)
        return min(4 * self.clients, max(1, wanted))

    @property
    def gain(self) -> float | None:
        """Under adascale, the gain of a whole step if one were taken now (the noise
        rows state it); else None."""
        return self.step_scale(self.step_batch, 1.0) if self.adascale else None

    @property
    def pending(self) -> bool:
        return self.covered > 0

    @property
    def remaining(self) -> int:
        """The minibatches the step being gathered still needs."""
        return max(1, self.step_batch - self.covered)

    def drops(self, staleness: int) -> str:
        return f"staleness {staleness} > max_staleness {self.max_staleness}" if staleness > self.max_staleness else ""

    def step_scale(self, covered: int, ramp: float) -> float:
        """The lr multiplier of a step of `covered` minibatches: `lr_scaling`'s, ramped in;
        with adascale the gain from the noise measured before this step (the windows that
        closed; the server's window is K pushes, a step at equal speeds, so it lags by one
        step and costs no pass over the gathered sum, which a fused step clears in its own).
        Before the first window there is no measurement: 1, one minibatch's lr, the gain's
        floor, which cannot overshoot and costs a single step."""
        if not self.adascale:
            return ramped_scale(self.scaling, covered, ramp)
        return gain(covered, self.noise.estimate, self.batch_size) if self.noise.windows else 1.0

    def restart(self, scale: float) -> None:
        """A step was taken at lr x `scale`: the gather starts afresh; adascale's progress
        moves by the step's gain."""
        self.covered = 0
        if self.own_progress is not None:
            self.own_progress += scale

    def apply(self, w: Tensor, push: PushFacts) -> None:
        if self.total is None:
            self.total = w.new_zeros(w.shape)
        self.total.add_(push.d)
        self.count(push)
        if self.covered >= self.step_batch:
            self.step(w)

    def fused(self, push: PushFacts) -> Update:
        covered = self.covered + push.minibatches
        if covered < self.step_batch:
            return Update(self.GATHER, {}, {"total": self.total}, after=lambda: self.count(push))
        factor, ramp = (self.gather_factor, self.gather_ramp) if self.covered else (push.lr_factor, push.scale_ramp)
        scale = self.step_scale(covered, ramp)

        def after() -> None:
            self.count(push)
            self.restart(scale)
        scalars = {"lr": self.base_lr * factor * scale, "inv_count": 1.0 / covered,
                   "weight_decay": self.weight_decay}
        if not self.momentum:
            return Update(self.STEP_PLAIN, scalars, {"total": self.total}, after=after)
        return Update(self.STEP, {**scalars, "momentum": self.momentum},
                      {"total": self.total, "momentum_buffer": self.buffer}, after=after)

    def count(self, push: PushFacts) -> None:
        """Count the push just summed; the gather's first push fixes its lr factor."""
        if not self.covered:
            self.gather_factor, self.gather_ramp = push.lr_factor, push.scale_ramp
        self.covered += push.minibatches

    def step(self, w: Tensor) -> None:
        scale = self.step_scale(self.covered, self.gather_ramp)
        self.optimizer.step(w, self.total.div_(self.covered), self.base_lr * self.gather_factor * scale)
        self.total.zero_()
        self.restart(scale)

    def state(self) -> dict[str, Tensor]:
        return {**super().state(), **({} if self.total is None else {"total": self.total})}

    def load_state(self, state: dict[str, Tensor]) -> None:
        super().load_state(state)
        self.total = state.get("total")

    def scalars(self) -> dict[str, float]:
        own = {} if self.own_progress is None else {"gained": self.own_progress}  # the checkpoint's name for it
        return {**super().scalars(), "covered": self.covered, "gather_factor": self.gather_factor,
                "gather_ramp": self.gather_ramp, **own}

    def load_scalars(self, values: dict[str, float]) -> None:
        super().load_scalars(values)
        self.covered = int(values.get("covered", 0))
        self.gather_factor = float(values.get("gather_factor", 1.0))
        self.gather_ramp = float(values.get("gather_ramp", 1.0))
        if self.own_progress is not None:
            self.own_progress = float(values.get("gained", 0.0))


def fixed_batch(settings: RuleSettings, clients: int) -> int:
    """fresh's S as set: `fresh_batch`, or a push of every client, K x n_push minibatches
    (0, and `auto` until the noise is measured): the step of synchronous SGD at equal
    speeds whatever n_sync."""
    if settings.fresh_batch in (0, "auto"):
        return clients * settings.push_every
    return int(settings.fresh_batch)
