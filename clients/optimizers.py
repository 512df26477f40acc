"""A client's optimizer: what turns the gradient in its flat vector into a step.

`sgd` (the default) is torch's SGD arithmetic called on the client's flat vectors at once
(`paramserver.rules.sgd.sgd`), with no `torch.optim.Optimizer`: that class's first step
imports torch._dynamo, about a CPU-second in every process that trains. `adam`, `adamw`
and a factory of the user's are `torch.optim` optimizers over the replica's parameters,
which are views of the bound client's vectors (clients/client.py), so the optimizer
steps the client's weights in place; each client owns its optimizer and so its state
(the simulator binds K clients to one replica in turn). With `fp16` even `sgd` is
`torch.optim.SGD`, since torch's GradScaler steps an Optimizer.

The lr of every step is the client's (its schedule's), set on the optimizer's groups;
`clip_grad_norm` clips the step's whole gradient, after the fp16 scale is taken off it.
A gradient push sums the gradients unclipped: the server clips their mean before its
own step, as synchronous data parallelism clips the averaged gradient, so one client at
n_sync 1 is torch's loop exactly.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numpy as np
import torch

from runconfig.settings import PRECISIONS, ConfigError
from paramserver.optimizer import flat_state, load_flat_state, sgd

AUTOCAST = dict(zip(PRECISIONS, (None, torch.bfloat16, torch.float16)))  # precision -> autocast's dtype


@dataclass(frozen=True)
class OptimizerSettings:
    """The clients' optimizer, as the config gives it (`name`: one of configchecks.OPTIMIZERS,
    or the spec of the user's `factory`)."""

    name: str = "sgd"
    lr: float = 0.03
    momentum: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False
    clip_grad_norm: float = 0.0
    precision: str = "fp32"
    factory: Callable[..., torch.optim.Optimizer] | None = None  # the user's, for a spec `name`

    @property
    def autocast(self) -> torch.dtype | None:
        return AUTOCAST[self.precision]

    @property
    def keeps_state(self) -> bool:
        """Whether a step depends on the steps before it (momentum, Adam's moments, fp16's
        loss scale, whatever a user's optimizer keeps): the state a checkpoint must hold."""
        return self.name != "sgd" or bool(self.momentum) or self.precision == "fp16"

    def build(self, weights: torch.Tensor, params: Callable[[], list[torch.nn.Parameter]]) -> "ClientOptimizer":
        """One client's optimizer for its flat `weights`; `params()`: the replica's
        parameters, bound to the client whenever it steps."""
        if self.name == "sgd" and self.precision != "fp16":
            return FlatSGD(self, params, weights)
        return TorchOptimizer(self, params, self._torch_optimizer(params()))

    def _torch_optimizer(self, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        if self.factory is not None:
            return user_optimizer(self.factory, params, self.name, lr=self.lr, momentum=self.momentum,
                                  weight_decay=self.weight_decay)
        if self.name == "sgd":
            return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay,
                                   nesterov=self.nesterov)
        kind = torch.optim.AdamW if self.name == "adamw" else torch.optim.Adam
        return kind(params, lr=self.lr, weight_decay=self.weight_decay)


class ClientOptimizer:
    """`scale(loss)` before backward; `step(grad, lr, summed)`: clip, add the gradient
    into `summed` (a gradient push under way, or None) and step (under fp16, a step whose
    gradient overflowed is skipped by torch's GradScaler and not summed)."""

    def __init__(self, settings: OptimizerSettings, params: Callable[[], list[torch.nn.Parameter]]):
        self.settings, self.params = settings, params

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss

    def step(self, grad: torch.Tensor, lr: float, summed: torch.Tensor | None) -> None:
        if summed is not None:
            summed += grad
        if self.settings.clip_grad_norm:  # torch's own, on the bound parameters' grads: views of `grad`
            torch.nn.utils.clip_grad_norm_(self.params(), self.settings.clip_grad_norm)
        self._step(grad, lr)

    def _step(self, grad: torch.Tensor, lr: float) -> None:
        raise NotImplementedError  # each optimizer's own

    def state_arrays(self) -> dict[str, np.ndarray]:
        """The optimizer's state as named arrays, copied (a checkpoint holds arrays, no pickle)."""
        return {}

    def load_state_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        """The state `state_arrays` gave, back in place: the steps go on as if never stopped."""


class FlatSGD(ClientOptimizer):
    """torch's SGD on the flat vectors (its momentum buffer starts at zeros, which is
    torch's first step exactly: momentum * 0 + g == g)."""

    def __init__(self, settings: OptimizerSettings, params: Callable[[], list[torch.nn.Parameter]],
                 weights: torch.Tensor):
        super().__init__(settings, params)
        self.weights = weights
        self.buffer = torch.zeros_like(weights) if settings.momentum else None

    def _step(self, grad: torch.Tensor, lr: float) -> None:
        s = self.settings
        sgd(self.weights, grad, self.buffer, lr=lr, momentum=s.momentum, weight_decay=s.weight_decay,
            nesterov=s.nesterov)

    def state_arrays(self) -> dict[str, np.ndarray]:
        return {} if self.buffer is None else {"momentum_buffer": _array(self.buffer)}

    def load_state_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        if self.buffer is not None and "momentum_buffer" in arrays:
            self.buffer.copy_(torch.from_numpy(arrays["momentum_buffer"]))


class TorchOptimizer(ClientOptimizer):
    """A torch.optim optimizer over the replica's parameters (views of this client's
    vectors while it is bound), with torch's GradScaler under fp16."""

    def __init__(self, settings: OptimizerSettings, params: Callable[[], list[torch.nn.Parameter]],
                 optimizer: torch.optim.Optimizer):
        super().__init__(settings, params)
        self.optimizer = optimizer
        device = optimizer.param_groups[0]["params"][0].device.type
        self.scaler = torch.amp.GradScaler(device) if settings.precision == "fp16" else None

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss if self.scaler is None else self.scaler.scale(loss)

    def step(self, grad: torch.Tensor, lr: float, summed: torch.Tensor | None) -> None:
        if self.scaler is None:
            super().step(grad, lr, summed)
            return
        self.scaler.unscale_(self.optimizer)  # in place, on the grads: views of `grad`
        if torch.isfinite(grad).all():
            super().step(grad, lr, summed)
        else:
            self._step(grad, lr)  # GradScaler.step skips the step whose gradient overflowed
        self.scaler.update()

    def state_arrays(self) -> dict[str, np.ndarray]:
        """torch's state_dict flattened (`paramserver.optimizer.flat_state`: `state.I.NAME`
        tensors, `number.I.NAME` numbers) and `scaler.NAME` for GradScaler's."""
        arrays = {k: _array(v) if torch.is_tensor(v) else np.array(v) for k, v in flat_state(self.optimizer).items()}
        if self.scaler is not None:
            arrays.update({f"scaler.{k}": np.array(v) for k, v in self.scaler.state_dict().items()})
        return arrays

    def load_state_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        load_flat_state(self.optimizer, {k: torch.from_numpy(v.copy()) if k.startswith("state.") else v.item()
                                         for k, v in arrays.items() if k.startswith(("state.", "number."))})
        scaler = {key[len("scaler."):]: value.item() for key, value in arrays.items() if key.startswith("scaler.")}
        if self.scaler is not None and scaler:
            self.scaler.load_state_dict(scaler)

    def _step(self, grad: torch.Tensor, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self.scaler is None:
            self.optimizer.step()
        else:
            self.scaler.step(self.optimizer)


def _array(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().cpu().numpy().copy()


def user_optimizer(factory: Callable[..., torch.optim.Optimizer], params: Iterable[torch.nn.Parameter],
                   spec: str, **settings: Any) -> torch.optim.Optimizer:
    """The user's `factory(params, **settings)`, given the settings its signature takes
    (all of them where it takes **kwargs); a factory that fails or returns no Optimizer
    is the user's mistake, named in one line."""
    try:
        accepted = inspect.signature(factory).parameters.values()
        if not any(p.kind is p.VAR_KEYWORD for p in accepted):
            settings = {k: v for k, v in settings.items() if k in {p.name for p in accepted}}
    except (TypeError, ValueError):  # no signature (a builtin): every setting, as documented
        pass
    try:
        optimizer = factory(list(params), **settings)
    except Exception as error:  # noqa: BLE001 - the user's code, in one line
        raise ConfigError(f"optimizer: {spec} raised {type(error).__name__}: {error}") from None
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ConfigError(f"optimizer: {spec} returned {type(optimizer).__name__}, not a torch.optim.Optimizer")
    return optimizer
