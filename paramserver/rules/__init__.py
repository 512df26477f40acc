"""Server update rules: how a pushed vector changes the weights (the server's one strategy layer).

A rule sees the pushed vector, the pushing client, the push's staleness (pushes applied
since that client last pulled) and the number of clients K; it may keep per-client
state, which the checkpoint saves (`state`/`load_state`). Its arithmetic is written once
on torch tensors, so the very code runs on a CPU server (tensors sharing the host
buffers) and on a GPU one. A rule owns all it means: its torch arithmetic (`apply`), the
same update as a fused kernel's formula (`FORMULAS`, `fused`: paramserver/compute/fused.py only
runs them), the checks of its config keys (`check_keys`, whichever rule runs; `check`,
when it does), what its clients push (`pushes`) and their step back (`client_elastic`,
EASGD's `follow`), and the versions its pushes make (`versions`).

Each rule is one module here, named by its config name (`add` is `Rule` itself, in
base.py); adding one is its module, its `RULES` entry below, its test and its row in
docs/rules.md (and a config key in runconfig/settings.py if it has a setting of its
own; where its value should follow from the rule, the key defaults to None there and the
rule's `DEFAULTS` names it). The formulas and their papers are in docs/rules.md. `w` is the server's weights,
`d` the push, `tau` its staleness, `K` the clients:
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

from typing import Callable

from paramserver.rules.adagrad import AdagradRule
from paramserver.rules.base import Rule, RuleSettings, Update
from paramserver.rules.dcasgd import DCASGDRule
from paramserver.rules.easgd import EASGDRule, easgd_alpha
from paramserver.rules.fresh import FreshRule, fixed_batch
from paramserver.rules.nesterov import NesterovRule
from paramserver.rules.scaled import ScaledRule
from paramserver.rules.scaling import batch_scale, ramped_scale
from paramserver.rules.sgd import SGDRule
from paramserver.rules.staleness import StalenessRule, staleness_factor

__all__ = ["RULES", "AdagradRule", "DCASGDRule", "EASGDRule", "FreshRule", "NesterovRule", "Rule", "RuleSettings",
           "SGDRule", "ScaledRule", "StalenessRule", "Update", "batch_scale", "easgd_alpha", "fixed_batch",
           "make_rule", "ramped_scale", "rule_class", "staleness_factor"]

RULES: dict[str, type[Rule]] = {"add": Rule, "sgd": SGDRule, "scaled": ScaledRule, "staleness": StalenessRule,
                                "dcasgd": DCASGDRule, "easgd": EASGDRule, "adagrad": AdagradRule,
                                "fresh": FreshRule, "nesterov": NesterovRule}


def rule_class(name: str) -> type[Rule]:
    try:
        return RULES[name]
    except KeyError:
        raise ValueError(f"rule: unknown rule {name!r} (choose from {', '.join(RULES)})") from None


def make_rule(name: str, settings: RuleSettings, clients: int = 1, optimizer_factory: Callable | None = None) -> Rule:
    """The rule called `name` for a run of `clients` clients (`settings`: a RunConfig);
    `optimizer_factory`: the user's optimizer, for a rule whose server steps with it."""
    cls = rule_class(name)
    if cls.steps_with_optimizer:
        return cls(settings, clients, optimizer_factory)
    return cls(settings, clients)
