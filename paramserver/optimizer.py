"""The optimizer's step on one flat vector: the server's under a gradient rule, the
clients' SGD everywhere.

Where the server takes the step (`sgd`, `fresh`: clients push gradients), the run's
`optimizer` is the server's: `ServerOptimizer` steps the weights with the gathered
gradient by torch's own arithmetic (`sgd`, `adam`, `adamw`: torch.optim's functional
forms, which skip torch.optim.Optimizer's first-step import of torch._dynamo, a
start-up cost in every process: docs/performance.md) or with the user's factory's
torch.optim.Optimizer over one flat parameter. With one client and n_sync 1 a gradient
rule's step is therefore that optimizer's step on that client's gradient, as in a plain
PyTorch loop. SGD without nesterov or clipping is also what the rules' fused formulas
compute (the compiled host kernel, the GPU's cupy kernel); the rest runs here.

The state is named vectors (`momentum_buffer`; `exp_avg`, `exp_avg_sq`; a factory's
`opt.I.NAME`) and numbers (`opt_step`, a factory's `opt_number.I.NAME`), which the
checkpoint saves without pickle, so a resumed run steps on as if never stopped.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # torch loads with the weights, not with the config that names a rule
    import torch
    from torch import Tensor

ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8  # torch.optim.Adam's defaults (a factory sets others)
STATE_VECTORS = ("momentum_buffer", "exp_avg", "exp_avg_sq")


def sgd(w: Tensor, g: Tensor, buffer: Tensor | None, *, lr: float, momentum: float,
        weight_decay: float, nesterov: bool = False) -> Tensor | None:
    """torch.optim.SGD's own arithmetic (its fused kernel; dampening 0) on one flat vector,
    in place; returns the momentum buffer (torch starts one at the first gradient when
    given None; None without momentum)."""
    from torch.optim.sgd import sgd as torch_sgd

    buffers = [buffer]
    torch_sgd([w], [g], buffers, fused=True, lr=lr, momentum=momentum, weight_decay=weight_decay,
              dampening=0.0, nesterov=nesterov, maximize=False)
    return buffers[0]


def clip_(g: Tensor, max_norm: float) -> None:
    """torch.nn.utils.clip_grad_norm_'s scaling on one flat gradient, in place."""
    total = g.norm(2)
    g.mul_((max_norm / (total + 1e-6)).clamp(max=1.0))


def flat_state(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """A torch optimizer's per-parameter state as `state.I.NAME` tensors and `number.I.NAME`
    Python numbers; anything else (torch's SGD keeps `momentum_buffer = None` at momentum
    0) is left out, as torch's optimizers take a missing entry for a fresh one. The
    groups' settings come from the config, not from here."""
    import torch

    flat: dict[str, Any] = {}
    for index, values in optimizer.state_dict()["state"].items():
        for name, value in values.items():
            if torch.is_tensor(value):
                flat[f"state.{index}.{name}"] = value
            elif isinstance(value, (int, float)):
                flat[f"number.{index}.{name}"] = value
    return flat


def load_flat_state(optimizer: torch.optim.Optimizer, flat: dict[str, Any]) -> None:
    """`flat_state`'s entries back into `optimizer` (tensors as given, numbers as numbers)."""
    state: dict[int, dict[str, Any]] = {}
    for key, value in flat.items():
        kind, _, rest = key.partition(".")
        if kind in ("state", "number"):
            index, _, name = rest.partition(".")
            state.setdefault(int(index), {})[name] = value
    optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})


class ServerOptimizer:
    """The step a gradient rule takes with the gathered gradient `g` (a mean of pushes,
    changed in place by clipping): `name` sgd, adam or adamw at the step's lr, or the
    user's optimizer (`factory(params)`: a torch.optim.Optimizer over them, its settings
    bound by the caller; the lr of each step is set on its groups)."""

    def __init__(self, name: str, *, momentum: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False,
                 clip: float = 0.0, factory: Callable[..., torch.optim.Optimizer] | None = None):
        self.name, self.momentum, self.weight_decay = name, momentum, weight_decay
        self.nesterov, self.clip, self.factory = nesterov, clip, factory
        self.vectors: dict[str, Tensor] = {}    # the state vectors, by name
        self.numbers: dict[str, float] = {}     # and numbers
        self.torch_optimizer: torch.optim.Optimizer | None = None  # the factory's, made at the first step

    @classmethod
    def for_settings(cls, settings: Any, factory: Callable | None = None) -> ServerOptimizer:
        """The run's optimizer as the config sets it (`factory`: the user's, resolved; a
        spec of the user's without it cannot step, which is said here, not at the first push)."""
        if factory is None and settings.optimizer not in ("sgd", "adam", "adamw"):
            raise ValueError(f"optimizer: {settings.optimizer} needs its factory resolved for the server's step")
        return cls("factory" if factory else settings.optimizer, momentum=settings.effective_server_momentum,
                   weight_decay=settings.weight_decay, nesterov=settings.nesterov,
                   clip=settings.clip_grad_norm, factory=factory)

    @property
    def formulas_fit(self) -> bool:
        """Whether the rules' SGD formulas are this step (the fused kernels may run it)."""
        return self.name == "sgd" and not self.nesterov and not self.clip

    def step(self, w: Tensor, g: Tensor, lr: float) -> None:
        if self.clip:
            clip_(g, self.clip)
        if self.name == "sgd":
            buffer = sgd(w, g, self.vectors.get("momentum_buffer"), lr=lr, momentum=self.momentum,
                         weight_decay=self.weight_decay, nesterov=self.nesterov)
            if buffer is not None:
                self.vectors["momentum_buffer"] = buffer
        elif self.name in ("adam", "adamw"):
            self._adam(w, g, lr)
        else:
            self._factory_step(w, g, lr)

    def _adam(self, w: Tensor, g: Tensor, lr: float) -> None:
        """torch.optim.Adam / AdamW's single-tensor arithmetic (what they run on a CPU)."""
        import torch
        from torch.optim.adam import adam

        for k in ("exp_avg", "exp_avg_sq"):  # made once, at the first step (not a zeros vector a step)
            if k not in self.vectors:
                self.vectors[k] = torch.zeros_like(w)
        moments = [self.vectors["exp_avg"], self.vectors["exp_avg_sq"]]
        step = torch.tensor(self.numbers.get("opt_step", 0.0), dtype=torch.float32)
        adam([w], [g], moments[:1], moments[1:], [], [step], foreach=False, decoupled_weight_decay=self.name == "adamw",
             amsgrad=False, beta1=ADAM_BETAS[0], beta2=ADAM_BETAS[1], lr=lr, weight_decay=self.weight_decay,
             eps=ADAM_EPS, maximize=False)
        self.numbers["opt_step"] = step.item()

    def _factory_step(self, w: Tensor, g: Tensor, lr: float) -> None:
        """The user's optimizer over one parameter that is the weights' flat vector (made at
        the first step, with the state a checkpoint gave)."""
        import torch

        if self.torch_optimizer is None:
            self.torch_optimizer = self.factory([torch.nn.Parameter(w, requires_grad=False)])
            loaded = {k[len("opt."):]: v for k, v in self.vectors.items() if k.startswith("opt.")}
            loaded.update({k[len("opt_"):]: v for k, v in self.numbers.items() if k.startswith("opt_number.")})
            if loaded:
                load_flat_state(self.torch_optimizer, loaded)
        param = self.torch_optimizer.param_groups[0]["params"][0]
        if param.data_ptr() != w.data_ptr():  # a store that replaced its weights' tensor
            param.data = w
        param.grad = g
        for group in self.torch_optimizer.param_groups:
            group["lr"] = lr
        with torch.no_grad():
            self.torch_optimizer.step()
        param.grad = None

    def state(self) -> dict[str, Tensor]:
        if self.torch_optimizer is None:
            return dict(self.vectors)
        flat = flat_state(self.torch_optimizer)
        return {f"opt.{k}": v for k, v in flat.items() if k.startswith("state.")}

    def load_state(self, state: dict[str, Tensor]) -> None:
        self.vectors = {k: v for k, v in state.items() if k in STATE_VECTORS or k.startswith("opt.")}
        self.torch_optimizer = None  # remade with this state at its next step

    def scalars(self) -> dict[str, float]:
        if self.torch_optimizer is None:
            return dict(self.numbers)
        flat = flat_state(self.torch_optimizer)
        return {f"opt_{k}": float(v) for k, v in flat.items() if k.startswith("number.")}

    def load_scalars(self, values: dict[str, float]) -> None:
        self.numbers = {k: v for k, v in values.items() if k == "opt_step" or k.startswith("opt_number.")}
        self.torch_optimizer = None
