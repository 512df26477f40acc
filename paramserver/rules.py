"""Server update rules: how a pushed vector changes the weights (the server's one strategy layer).

A rule sees the pushed vector, the pushing client, the push's staleness (pushes applied
since that client last pulled) and the number of clients K; it may keep per-client
state, which the checkpoint saves (`state`/`load_state`). Its arithmetic is written once
on torch tensors, so the very code runs on a CPU server (tensors sharing the host
buffers) and on a GPU one. A rule owns all it means: its torch arithmetic (`apply`), the
same update as a fused kernel's formula (`FORMULAS`, `fused`: paramserver/fused.py only
runs them), the checks of its config keys (`check_keys`, whichever rule runs; `check`,
when it does), what its clients push (`pushes`) and their step back (`client_elastic`,
EASGD's `follow`), and the versions its pushes make (`versions`).

Adding a rule is one class here and one `RULES` entry, its test and its row in
docs/rules.md (and a config key in paramserver/config.py if it has a setting of its
own). The formulas and their papers are
in docs/rules.md. `w` is the server's weights, `d` the push, `tau` its
staleness, `K` the clients:
- `add`       w += d                                    (the paper's; Downpour's)
- `sgd`       torch.optim.SGD on a pushed gradient sum  (server lr, momentum, decay)
- `scaled`    w += d / K
- `staleness` w += d * min(1, K / (tau + 1)) / K        (delay-adaptive; Mishchenko et al. 2022)
- `dcasgd`    w += d - lam0 / sqrt(ms) * g*g*(w - w_pulled) * lr, g = -d/lr  (DC-ASGD-a)
- `easgd`     w += alpha * (x_i - w), alpha = beta / K; the client pushes its own
              weights x_i and moves the same way back (EASGD; see clients/client.py)
- `adagrad`   w -= lr * g / (sqrt(sum g^2) + eps)       (Downpour's server-side Adagrad)
- `fresh`     gather gradient pushes at most R versions old until they cover S
              minibatches, then one SGD step on their mean (Rennala / Ringmaster ASGD)
- `nesterov`  w += d / N each push; every N pushes w += beta * m, m = beta m + mean d
              (delayed Nesterov, Liu et al. 2024)

Where clients push gradients, the server also measures the gradient noise scale
(paramserver/noise.py) on the way.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Protocol

from paramserver.noise import NoiseScale

if TYPE_CHECKING:  # torch loads with the server's weights, not with the config that names a rule
    from torch import Tensor


class RuleSettings(Protocol):
    """The run config's keys a rule reads (paramserver.config.RunConfig has them)."""

    effective_server_lr: float
    effective_server_momentum: float
    lr: float
    weight_decay: float
    dc_lambda: float
    easgd_beta: float
    batch_size: int
    push_every: int
    fetch_every: int
    lr_scaling: str
    fresh_batch: int | str
    max_staleness: int
    fresh_reply: str
    nesterov_every: int
    nesterov_momentum: float
    servers: int


@dataclass(slots=True)
class Update:
    """One push's update as a fused kernel runs it (paramserver/fused.py): `code`, a few
    `name = expr;` statements in the common ground of C and Python (names, + - * /,
    brackets and sqrt), over w, d, `state` (None: a vector not made yet, read as zeros),
    `reads` and float32 `scalars`, writing w_out and NAME_out for each state vector
    (other names are float temporaries); `after`: the rule's own counting, once the push
    is known to be finite (fresh's and nesterov's)."""

    code: str
    scalars: dict[str, float] = field(default_factory=dict)
    state: dict[str, Tensor | None] = field(default_factory=dict)
    reads: dict[str, Tensor] = field(default_factory=dict)
    after: Callable[[], object] | None = None


def _refusals(*checks: tuple[bool, str]) -> str:
    """The first failed check's "field: reason", or ""."""
    return next((reason for ok, reason in checks if not ok), "")


class Rule:
    """w += d: the paper's rule, and the base of the others. Stateless."""

    ADD = "w_out = w + d;"
    FORMULAS: tuple[str, ...] = (ADD,)  # every fused formula the rule's updates use

    pushes = "delta"   # what a client sends: its weight change ("delta"), "gradient" sums or "weights"
    defers = False     # whether a reply may wait for a step being gathered (fresh's "wait")
    paced = False      # whether the clients' pace decides that (fresh's "auto", paramserver/pace.py)
    step_batch: int | None = None  # the minibatches a step gathers, for rules that gather (fresh)

    def __init__(self, settings: RuleSettings, clients: int):
        self.clients = clients
        self.base_lr = settings.effective_server_lr
        # The lr schedule's multiplier at the server's progress, set before each apply
        # (paramserver/schedule.py): rules with an lr of their own follow the same curve
        # as the clients.
        self.lr_factor = 1.0
        # How far the batch-size scaling has ramped in (`lr_scale_warmup`), set with it.
        self.scale_ramp = 1.0
        # The minibatches the push being applied covers (the Store sets it from the push
        # header's step, which every server of a sharded run gets).
        self.minibatches = 1
        # Pushed gradients carry the gradient noise scale; other pushes do not.
        self.noise = NoiseScale(settings.batch_size, clients) if self.pushes == "gradient" else None

    @classmethod
    def check_keys(cls, settings: RuleSettings) -> str:
        """Why the rule's own keys are out of range (a ConfigError line), or "": checked
        whichever rule runs, as every key of the config is."""
        return ""

    @classmethod
    def check(cls, settings: RuleSettings) -> str:
        """Why these settings cannot run this rule (a ConfigError line), or ""."""
        return ""

    @classmethod
    def client_elastic(cls, settings: RuleSettings, clients: int) -> float:
        """The elastic step a client takes back towards the server's answer (EASGD's), or 0."""
        return 0.0

    @classmethod
    def versions(cls, settings: RuleSettings, pushes: int, clients: int) -> int:
        """The versions `pushes` applied pushes make (each makes one, but for fresh's)."""
        return pushes

    @property
    def lr(self) -> float:
        return self.base_lr * self.lr_factor

    @property
    def pending(self) -> bool:
        """Pushes taken in that no step has applied yet: the version waits for them."""
        return False

    def drops(self, staleness: int) -> str:
        """Why a push this stale is left out (counted, not applied, not an error), or ""."""
        return ""

    def apply(self, w: Tensor, d: Tensor, client: int, staleness: int) -> None:
        w.add_(d)

    def fused(self, client: int, staleness: int) -> Update:
        """`apply` as one fused kernel's update."""
        return Update(self.ADD)

    @classmethod
    def fusable(cls) -> bool:
        """Whether `fused` is this rule's own arithmetic: a rule that overrides `apply`
        but not `fused` runs its torch arithmetic on a GPU too."""
        def owner(name: str) -> type:
            return next(k for k in cls.__mro__ if name in vars(k))
        return issubclass(owner("fused"), owner("apply"))

    def step(self, w: Tensor) -> None:
        """Apply what is pending now (the Store's `flush`: no more pushes can come for it)."""

    def pulled(self, client: int, w: Tensor) -> None:
        """`client` now holds the weights `w` (called before they are sent)."""

    def state(self) -> dict[str, Tensor]:
        return {}

    def load_state(self, state: dict[str, Tensor]) -> None:
        pass

    def scalars(self) -> dict[str, float]:
        """Numbers of the rule's state (saved in float64 beside `state`'s vectors)."""
        return {}

    def load_scalars(self, values: dict[str, float]) -> None:
        pass


class ScaledRule(Rule):
    """w += d / K: every push moves the weights 1/K of a client's step."""

    STEP = "w_out = w + alpha * d;"
    FORMULAS = (STEP,)

    def apply(self, w: Tensor, d: Tensor, client: int, staleness: int) -> None:
        w.add_(d, alpha=1.0 / self.clients)

    def fused(self, client: int, staleness: int) -> Update:
        return Update(self.STEP, {"alpha": 1.0 / self.clients})


class StalenessRule(Rule):
    """The delay-adaptive step of Mishchenko et al. (2022) on a 1/K base: a straggler's
    stale push moves the weights less (`staleness_factor`)."""

    FORMULAS = (ScaledRule.STEP,)

    def apply(self, w: Tensor, d: Tensor, client: int, staleness: int) -> None:
        w.add_(d, alpha=staleness_factor(staleness, self.clients))

    def fused(self, client: int, staleness: int) -> Update:
        return Update(ScaledRule.STEP, {"alpha": staleness_factor(staleness, self.clients)})


def staleness_factor(staleness: int, clients: int) -> float:
    """min(1, K / (tau + 1)) / K: 1 for a fresh push with one client, 1/K for a push
    one round of K clients old, 1/(tau + 1) for a staler one."""
    return min(1.0, clients / (staleness + 1)) / clients


def sgd(w: Tensor, g: Tensor, buffer: Tensor | None, *, lr: float, momentum: float,
        weight_decay: float) -> Tensor | None:
    """torch.optim.SGD's own arithmetic (its fused kernel; dampening 0, no nesterov) on one
    flat vector, in place; returns the momentum buffer (torch starts one at the first
    gradient when given None; None without momentum). The server's sgd rule and every
    client step with it: called directly, it skips torch.optim.Optimizer, whose first
    step imports torch._dynamo (about a second of CPU in every process that trains)."""
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


class AdagradRule(Rule):
    """Downpour's server-side Adagrad on a pushed gradient sum: each weight's step is the
    server lr over the root of its squared pushes so far (torch.optim.Adagrad's update).
    A push of n_sync minibatches makes one step, as in Downpour; counting its squares as
    1 / n_sync each, so that it would move about as far as n_sync pushes of one, diverged
    at 8 clients and n_sync 16 (test error 89%), so it is not done."""

    pushes = "gradient"
    EPS = 1e-10  # torch.optim.Adagrad's
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

    def apply(self, w: Tensor, d: Tensor, client: int, staleness: int) -> None:
        g = d.add(w, alpha=self.weight_decay) if self.weight_decay else d
        if self.sum is None:
            self.sum = w.new_zeros(w.shape)
        self.sum.addcmul_(g, g)
        w.addcdiv_(g, self.sum.sqrt().add_(self.EPS), value=-self.lr)

    def fused(self, client: int, staleness: int) -> Update:
        return Update(self.FORMULA, {"neg_lr": -self.lr, "weight_decay": self.weight_decay, "eps": self.EPS},
                      {"sum": self.sum})

    def state(self) -> dict[str, Tensor]:
        return {} if self.sum is None else {"sum": self.sum}

    def load_state(self, state: dict[str, Tensor]) -> None:
        self.sum = state.get("sum")


class DCASGDRule(Rule):
    """Delay-compensated ASGD with adaptive lambda (DC-ASGD-a, Zheng et al. 2017).

    The push d is the client's step, so its gradient is g = -d / lr. The server keeps the
    weights each client last pulled (K copies of the model: the memory the method costs)
    and corrects the stale gradient by the first-order term of its change since then,
    g + lam * g*g*(w - w_pulled), lam = lam0 / sqrt(mean square of g) (moving average,
    m = 0.95). lam0 = 0 is `add`."""

    MOMENTUM, EPS = 0.95, 1e-7
    # keep = 0, take = 1 on the first step: the mean square starts at g^2 exactly
    FORMULA = """g2 = (d / lr) * (d / lr);
meansquare_out = keep * meansquare + take * g2;
w_out = (w + d) - lr_lam * (g2 * (w - pulled) / (sqrt(meansquare_out) + eps));"""
    FORMULAS = (Rule.ADD, FORMULA)

    @classmethod
    def check_keys(cls, settings: RuleSettings) -> str:
        return _refusals((settings.dc_lambda >= 0, f"dc_lambda: must be non-negative, got {settings.dc_lambda}"))

    def __init__(self, settings: RuleSettings, clients: int):
        super().__init__(settings, clients)
        self.base_lr, self.lam0 = settings.lr, settings.dc_lambda  # the clients' lr: g = -d / lr
        self.backups: dict[int, Tensor] = {}
        self.meansquare: Tensor | None = None

    def pulled(self, client: int, w: Tensor) -> None:
        if client in self.backups:
            self.backups[client].copy_(w)
        else:
            self.backups[client] = w.clone()

    def apply(self, w: Tensor, d: Tensor, client: int, staleness: int) -> None:
        if not self.lam0 or client not in self.backups:
            w.add_(d)
            return
        g2 = (d / self.lr).square_()
        if self.meansquare is None:
            self.meansquare = g2.clone()
        else:
            self.meansquare.mul_(self.MOMENTUM).add_(g2, alpha=1 - self.MOMENTUM)
        # w += d - lr * lam * g^2 * (w - w_pulled), lam = lam0 / sqrt(ms)
        g2.mul_(w - self.backups[client]).div_(self.meansquare.sqrt().add_(self.EPS))
        w.add_(d).sub_(g2, alpha=self.lr * self.lam0)

    def fused(self, client: int, staleness: int) -> Update:
        if not self.lam0 or client not in self.backups:
            return Update(self.ADD)
        keep = 0.0 if self.meansquare is None else self.MOMENTUM
        scalars = {"lr": self.lr, "lr_lam": self.lr * self.lam0, "eps": self.EPS, "keep": keep, "take": 1 - keep}
        return Update(self.FORMULA, scalars, {"meansquare": self.meansquare}, {"pulled": self.backups[client]})

    def state(self) -> dict[str, Tensor]:
        arrays = {f"backup.{c}": b for c, b in self.backups.items()}
        return arrays if self.meansquare is None else {**arrays, "meansquare": self.meansquare}

    def load_state(self, state: dict[str, Tensor]) -> None:
        self.backups = {int(k.split(".")[1]): v for k, v in state.items() if k.startswith("backup.")}
        self.meansquare = state.get("meansquare")


class EASGDRule(Rule):
    """Elastic averaging (asynchronous EASGD, Zhang, Choromanska and LeCun 2015): the
    client pushes its own weights x_i; the center moves alpha of the way towards them,
    alpha = beta / K, and the client moves the same amount back (`follow`, which
    clients/client.py calls with the answer to its push)."""

    pushes = "weights"
    FORMULA = "w_out = w + alpha * (d - w);"  # torch's lerp
    FORMULAS = (FORMULA,)

    def __init__(self, settings: RuleSettings, clients: int):
        super().__init__(settings, clients)
        self.alpha = easgd_alpha(settings.easgd_beta, clients)

    @classmethod
    def check_keys(cls, settings: RuleSettings) -> str:
        return _refusals((0 < settings.easgd_beta < 1, f"easgd_beta: must be in (0, 1), got {settings.easgd_beta}"))

    @classmethod
    def check(cls, settings: RuleSettings) -> str:
        return _refusals((settings.push_every == settings.fetch_every,
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

    def apply(self, w: Tensor, d: Tensor, client: int, staleness: int) -> None:
        w.lerp_(d, self.alpha)

    def fused(self, client: int, staleness: int) -> Update:
        return Update(self.FORMULA, {"alpha": self.alpha})


def easgd_alpha(beta: float, clients: int) -> float:
    """The elastic coefficient: beta / K, as the EASGD paper sets it (beta = 0.9)."""
    return beta / clients


class FreshRule(SGDRule):
    """A step on fresh gradients only (Rennala SGD, Tyurin & Richtarik 2023, arXiv
    2305.12387; Ringmaster ASGD, Maranjyan, Tyurin & Richtarik 2025, arXiv 2501.16168).

    Pushed gradient sums computed at most R = `max_staleness` versions ago are summed
    until they cover S = `fresh_batch` minibatches; then one SGD step (server momentum,
    weight decay) on their mean, at the lr for that many minibatches (times their count
    with `lr_scaling = "linear"`, its root with "sqrt") and at the schedule's factor of
    the gather's first push, the progress its gradients were computed at. Staler pushes
    are dropped. The version moves only at a step, so staleness counts steps. With `fresh_reply = "wait"` a client
    whose push was gathered gets its reply at the step (S = K, R = 0 at equal speeds is
    then synchronous SGD); with "again" it gets the weights at once and computes there
    again, as a fast Rennala worker does; with "auto" it waits when the step is due
    before it could push again, else computes again (paramserver/pace.py; with sharded
    servers, which would time the clients apart, it waits). `fresh_batch = "auto"`: S =
    B_simple / b from the gradient noise scale, in [1, 4K] (K x n_push until it is
    measured)."""

    REPLIES = ("wait", "again", "auto")
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

    def __init__(self, settings: RuleSettings, clients: int):
        super().__init__(settings, clients)
        self.max_staleness = settings.max_staleness
        self.auto = settings.fresh_batch == "auto"
        self.fixed = fixed_batch(settings, clients)
        self.scaling = settings.lr_scaling
        # auto times the clients; sharded servers would each time them apart and could
        # answer one client differently, so there it waits
        self.paced = settings.fresh_reply == "auto" and settings.servers == 1
        self.defers = settings.fresh_reply != "again" and not self.paced
        self.batch_size = settings.batch_size
        self.total: Tensor | None = None  # the gathered pushes, summed
        self.covered = 0                  # the minibatches they cover
        self.gather_factor = 1.0          # the lr factor at the gather's first push
        self.gather_ramp = 1.0            # and the scaling's ramp there

    @classmethod
    def check_keys(cls, settings: RuleSettings) -> str:
        batch = settings.fresh_batch
        return _refusals(
            (batch == "auto" or batch >= 0,
             f"fresh_batch: must be a positive number of minibatches, 0 (clients) or auto, got {batch!r}"),
            (settings.max_staleness >= 0, f"max_staleness: must be non-negative, got {settings.max_staleness}"),
            (settings.fresh_reply in cls.REPLIES,
             f"fresh_reply: expected {' or '.join(cls.REPLIES)}, got {settings.fresh_reply!r}"))

    @classmethod
    def check(cls, settings: RuleSettings) -> str:
        return _refusals((settings.fresh_batch != "auto" or settings.servers == 1,
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
    def pending(self) -> bool:
        return self.covered > 0

    @property
    def remaining(self) -> int:
        """The minibatches the step being gathered still needs."""
        return max(1, self.step_batch - self.covered)

    def drops(self, staleness: int) -> str:
        return f"staleness {staleness} > max_staleness {self.max_staleness}" if staleness > self.max_staleness else ""

    def step_lr(self, covered: int, factor: float, ramp: float) -> float:
        return self.base_lr * factor * ramped_scale(self.scaling, covered, ramp)

    def apply(self, w: Tensor, d: Tensor, client: int, staleness: int) -> None:
        if self.total is None:
            self.total = w.new_zeros(w.shape)
        self.total.add_(d)
        self.gathered()
        if self.covered >= self.step_batch:
            self.step(w)

    def fused(self, client: int, staleness: int) -> Update:
        covered = self.covered + self.minibatches
        if covered < self.step_batch:
            return Update(self.GATHER, {}, {"total": self.total}, after=self.gathered)
        factor, ramp = (self.gather_factor, self.gather_ramp) if self.covered else (self.lr_factor, self.scale_ramp)

        def after() -> None:
            self.gathered()
            self.covered = 0
        scalars = {"lr": self.step_lr(covered, factor, ramp), "inv_count": 1.0 / covered,
                   "weight_decay": self.weight_decay}
        if not self.momentum:
            return Update(self.STEP_PLAIN, scalars, {"total": self.total}, after=after)
        return Update(self.STEP, {**scalars, "momentum": self.momentum},
                      {"total": self.total, "momentum_buffer": self.buffer}, after=after)

    def gathered(self) -> None:
        """Count the push just summed; the gather's first push fixes its lr factor."""
        if not self.covered:
            self.gather_factor, self.gather_ramp = self.lr_factor, self.scale_ramp
        self.covered += self.minibatches

    def step(self, w: Tensor) -> None:
        lr = self.step_lr(self.covered, self.gather_factor, self.gather_ramp)
        self.sgd_step(w, self.total.div_(self.covered), lr)
        self.total.zero_()
        self.covered = 0

    def state(self) -> dict[str, Tensor]:
        return {**super().state(), **({} if self.total is None else {"total": self.total})}

    def load_state(self, state: dict[str, Tensor]) -> None:
        super().load_state(state)
        self.total = state.get("total")

    def scalars(self) -> dict[str, float]:
        return {"covered": self.covered, "gather_factor": self.gather_factor, "gather_ramp": self.gather_ramp}

    def load_scalars(self, values: dict[str, float]) -> None:
        self.covered = int(values.get("covered", 0))
        self.gather_factor = float(values.get("gather_factor", 1.0))
        self.gather_ramp = float(values.get("gather_ramp", 1.0))


def batch_scale(scaling: str, minibatches: int) -> float:
    """The lr multiplier for an update that averages `minibatches` client minibatches:
    `linear` (Goyal et al. 2017, arXiv 1706.02677), `sqrt` (Krizhevsky 2014, arXiv
    1404.5997; Hoffer et al. 2017, arXiv 1705.08741: keeps the update's noise as at one
    minibatch) or `none`. The one home of the rule for the schedule and for `fresh`."""
    if scaling == "linear":
        return float(minibatches)
    return math.sqrt(minibatches) if scaling == "sqrt" else 1.0


def ramped_scale(scaling: str, minibatches: int, ramp: float) -> float:
    """`batch_scale` ramped in from 1 (one minibatch's lr) at ramp 0 to its whole value at
    1: Goyal et al.'s gradual warmup, which leaves one client's lr as it is."""
    return 1.0 + (batch_scale(scaling, minibatches) - 1.0) * ramp


def fixed_batch(settings: RuleSettings, clients: int) -> int:
    """fresh's S as set: `fresh_batch`, or a push of every client, K x n_push minibatches
    (0, and `auto` until the noise is measured): the step of synchronous SGD at equal
    speeds whatever n_sync."""
    if settings.fresh_batch in (0, "auto"):
        return clients * settings.push_every
    return int(settings.fresh_batch)


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
        return _refusals(
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


RULES: dict[str, type[Rule]] = {"add": Rule, "sgd": SGDRule, "scaled": ScaledRule, "staleness": StalenessRule,
                                "dcasgd": DCASGDRule, "easgd": EASGDRule, "adagrad": AdagradRule,
                                "fresh": FreshRule, "nesterov": NesterovRule}


def rule_class(name: str) -> type[Rule]:
    try:
        return RULES[name]
    except KeyError:
        raise ValueError(f"rule: unknown rule {name!r} (choose from {', '.join(RULES)})") from None


def make_rule(name: str, settings: RuleSettings, clients: int = 1) -> Rule:
    """The rule called `name` for a run of `clients` clients (`settings`: a RunConfig)."""
    return rule_class(name)(settings, clients)
