"""Server update rules: how a pushed vector changes the weights (the server's one strategy layer).

A rule sees the pushed vector, the pushing client, the push's staleness (pushes applied
since that client last pulled) and the number of clients K; it may keep per-client
state, which the checkpoint saves (`state`/`load_state`). Its arithmetic is written once
on torch tensors, so the very code runs on a CPU server (tensors sharing the host
buffers) and on a GPU one. `pushes` tells the clients what to send.

Adding a rule is one class here and one `RULES` entry. The formulas and their papers are
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
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # torch loads with the server's weights, not with the config that names a rule
    from torch import Tensor


class RuleSettings(Protocol):
    """The run config's keys a rule reads (paramserver.config.RunConfig has them)."""

    effective_server_lr: float
    lr: float
    server_momentum: float
    weight_decay: float
    dc_lambda: float
    easgd_beta: float


class Rule:
    """w += d: the paper's rule, and the base of the others. Stateless."""

    pushes = "delta"   # what a client sends: its weight change ("delta"), "gradient" sums or "weights"

    def __init__(self, settings: RuleSettings, clients: int):
        self.clients = clients
        self.base_lr = settings.effective_server_lr
        # The lr schedule's multiplier at the server's progress, set before each apply
        # (paramserver/schedule.py): rules with an lr of their own follow the same curve
        # as the clients.
        self.lr_factor = 1.0

    @property
    def lr(self) -> float:
        return self.base_lr * self.lr_factor

    def apply(self, w: Tensor, d: Tensor, client: int, staleness: int) -> None:
        w.add_(d)

    def pulled(self, client: int, w: Tensor) -> None:
        """`client` now holds the weights `w` (called before they are sent)."""

    def state(self) -> dict[str, Tensor]:
        return {}

    def load_state(self, state: dict[str, Tensor]) -> None:
        pass


class ScaledRule(Rule):
    """w += d / K: every push moves the weights 1/K of a client's step."""

    def apply(self, w: Tensor, d: Tensor, client: int, staleness: int) -> None:
        w.add_(d, alpha=1.0 / self.clients)


class StalenessRule(Rule):
    """The delay-adaptive step of Mishchenko et al. (2022) on a 1/K base: a straggler's
    stale push moves the weights less (`staleness_factor`)."""

    def apply(self, w: Tensor, d: Tensor, client: int, staleness: int) -> None:
        w.add_(d, alpha=staleness_factor(staleness, self.clients))


def staleness_factor(staleness: int, clients: int) -> float:
    """min(1, K / (tau + 1)) / K: 1 for a fresh push with one client, 1/K for a push
    one round of K clients old, 1/(tau + 1) for a staler one."""
    return min(1.0, clients / (staleness + 1)) / clients


class SGDRule(Rule):
    """torch.optim.SGD's update, applied by the server to a pushed gradient sum."""

    pushes = "gradient"

    def __init__(self, settings: RuleSettings, clients: int):
        super().__init__(settings, clients)
        self.momentum = settings.server_momentum
        self.weight_decay = settings.weight_decay
        self.buffer: Tensor | None = None  # torch starts it at the first gradient

    def apply(self, w: Tensor, d: Tensor, client: int, staleness: int) -> None:
        from torch.optim.sgd import sgd as torch_sgd  # torch.optim.SGD's own arithmetic, fused

        buffers = [self.buffer]
        torch_sgd([w], [d], buffers, fused=True, lr=self.lr, momentum=self.momentum,
                  weight_decay=self.weight_decay, dampening=0.0, nesterov=False, maximize=False)
        self.buffer = buffers[0]

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

    def state(self) -> dict[str, Tensor]:
        arrays = {f"backup.{c}": b for c, b in self.backups.items()}
        return arrays if self.meansquare is None else {**arrays, "meansquare": self.meansquare}

    def load_state(self, state: dict[str, Tensor]) -> None:
        self.backups = {int(k.split(".")[1]): v for k, v in state.items() if k.startswith("backup.")}
        self.meansquare = state.get("meansquare")


class EASGDRule(Rule):
    """Elastic averaging (asynchronous EASGD, Zhang, Choromanska and LeCun 2015): the
    client pushes its own weights x_i; the center moves alpha of the way towards them,
    alpha = beta / K, and the client (clients/client.py) moves the same amount back."""

    pushes = "weights"

    def __init__(self, settings: RuleSettings, clients: int):
        super().__init__(settings, clients)
        self.alpha = easgd_alpha(settings.easgd_beta, clients)

    def apply(self, w: Tensor, d: Tensor, client: int, staleness: int) -> None:
        w.lerp_(d, self.alpha)


def easgd_alpha(beta: float, clients: int) -> float:
    """The elastic coefficient: beta / K, as the EASGD paper sets it (beta = 0.9)."""
    return beta / clients


RULES: dict[str, type[Rule]] = {"add": Rule, "sgd": SGDRule, "scaled": ScaledRule, "staleness": StalenessRule,
                                "dcasgd": DCASGDRule, "easgd": EASGDRule, "adagrad": AdagradRule}


def rule_class(name: str) -> type[Rule]:
    try:
        return RULES[name]
    except KeyError:
        raise ValueError(f"rule: unknown rule {name!r} (choose from {', '.join(RULES)})") from None


def make_rule(name: str, settings: RuleSettings | None = None, clients: int = 1) -> Rule:
    """The rule called `name` for a run of `clients` clients; `settings` default to a run
    config's defaults."""
    if settings is None:
        from paramserver.config import RunConfig  # it imports this module: not at the top

        settings = RunConfig()
    return rule_class(name)(settings, clients)


def state_bytes(rule: Rule) -> int:
    """Memory the rule's state takes beside the weights (DC-ASGD's copies, momentum, sums)."""
    return sum(t.numel() * t.element_size() for t in rule.state().values())
