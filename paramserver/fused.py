"""Each update rule as one fused elementwise kernel, for a server whose weights are on a GPU.

paramserver/rules.py writes each rule on torch tensors: several kernels a push (DC-ASGD's
takes about eight), each a pass over memory, after the host read the push once more
for NaN/Inf. Here each rule's update is written once more, as a few `name = expr;`
statements in the common ground of C and Python (names, + - * /, brackets and sqrt;
constants come in as float32 scalars, a literal 0.5 being a double in C), compiled by cupy into one ElementwiseKernel that reads w, d and the rule's state
once, writes their new values once, and raises a flag where an element of d is not
finite. `Store` uses it when the weights are on a GPU and cupy imports
(`for_store`); anywhere else the torch rules run, unchanged.

A rejected push must leave the weights and the rule's state as they were, and the flag
is known only after the kernel wrote them. So the kernel writes into second buffers
(`Fused` keeps one spare a vector), and they are swapped in only when the flag is clear:
no extra pass, at the cost of one more vector for the weights and each state vector.

The same statements run in numpy (`numpy_kernel`), which is how tests/unit/test_fused.py
holds every formula to its torch rule on a machine without a GPU (and it compiles each
kernel's operation as host C++). Unverified on a GPU so far: experiments/bench/
gpu_check.sh runs tests/sim/test_gpu.py and times the kernels.
"""
from __future__ import annotations

from dataclasses import dataclass, field
import re
from typing import TYPE_CHECKING, Callable

import numpy as np

from paramserver.rules import (AdagradRule, DCASGDRule, EASGDRule, FreshRule, NesterovRule, Rule, ScaledRule,
                               SGDRule, StalenessRule, staleness_factor)

if TYPE_CHECKING:
    from torch import Tensor

    from paramserver.arrays import ServerArrays

# The formulas. Inputs: w (weights), d (push), the rule's state vectors under their
# state() names, read-only vectors (`pulled`), float32 scalars. Outputs: w_out and
# NAME_out for each state vector. Other names are float temporaries.
ADD = "w_out = w + d;"
STEP = "w_out = w + alpha * d;"  # scaled, staleness
ELASTIC = "w_out = w + alpha * (d - w);"  # easgd: torch's lerp
SGD_PLAIN = "w_out = w - lr * (d + weight_decay * w);"  # torch's SGD without momentum
# torch's fused SGD (dampening 0, no nesterov). Its first step sets the buffer to g:
# the buffer starts at zeros here, and momentum * 0 + g is exactly g.
SGD = """g = d + weight_decay * w;
momentum_buffer_out = momentum * momentum_buffer + g;
w_out = w - lr * momentum_buffer_out;"""
ADAGRAD = """g = d + weight_decay * w;
sum_out = sum + g * g;
w_out = w - lr * (g / (sqrt(sum_out) + eps));"""
# keep = 0, take = 1 on the first step: the mean square starts at g^2 exactly
DCASGD = """g2 = (d / lr) * (d / lr);
meansquare_out = keep * meansquare + take * g2;
w_out = (w + d) - lr_lam * (g2 * (w - pulled) / (sqrt(meansquare_out) + eps));"""
# fresh: a push gathered (the weights copied through), or the one that completes the
# step: the SGD step above on the mean of the gathered pushes and this one
FRESH_GATHER = """total_out = total + d;
w_out = w;"""
FRESH_STEP_PLAIN = """g = (total + d) * inv_count + weight_decay * w;
total_out = 0;
w_out = w - lr * g;"""
FRESH_STEP = """g = (total + d) * inv_count + weight_decay * w;
momentum_buffer_out = momentum * momentum_buffer + g;
total_out = 0;
w_out = w - lr * momentum_buffer_out;"""
# nesterov: a plain step of d / N, and at every N-th push the momentum's look-ahead
NESTEROV_PLAIN = """total_out = total + d;
w_out = w + inv_n * d;"""
NESTEROV = """momentum_out = beta * momentum + inv_n * (total + d);
total_out = 0;
w_out = (w + inv_n * d) + beta * momentum_out;"""
FORMULAS = (ADD, STEP, ELASTIC, SGD_PLAIN, SGD, ADAGRAD, DCASGD, FRESH_GATHER, FRESH_STEP_PLAIN, FRESH_STEP,
            NESTEROV_PLAIN, NESTEROV)
STATEMENT = re.compile(r"\s*([A-Za-z]\w*)\s*=\s*([^;=]+);")


@dataclass(frozen=True)
class Update:
    """One push's update: `code` over w, d, `state` (None: a vector not made yet, read as
    zeros), `reads` and `scalars`; `after`: the rule's own counting, once the push is
    known to be finite (fresh's and nesterov's)."""

    code: str
    scalars: dict[str, float] = field(default_factory=dict)
    state: dict[str, Tensor | None] = field(default_factory=dict)
    reads: dict[str, Tensor] = field(default_factory=dict)
    after: Callable[[], object] | None = None


def _sgd(rule: SGDRule, client: int, staleness: int) -> Update:
    scalars = {"lr": rule.lr, "weight_decay": rule.weight_decay}
    if not rule.momentum:  # torch keeps no buffer then, and neither does the checkpoint
        return Update(SGD_PLAIN, scalars)
    return Update(SGD, {**scalars, "momentum": rule.momentum}, {"momentum_buffer": rule.buffer})


def _dcasgd(rule: DCASGDRule, client: int, staleness: int) -> Update:
    if not rule.lam0 or client not in rule.backups:
        return Update(ADD)
    keep = 0.0 if rule.meansquare is None else rule.MOMENTUM
    scalars = {"lr": rule.lr, "lr_lam": rule.lr * rule.lam0, "eps": rule.EPS, "keep": keep, "take": 1 - keep}
    return Update(DCASGD, scalars, {"meansquare": rule.meansquare}, {"pulled": rule.backups[client]})


def _fresh(rule: FreshRule, client: int, staleness: int) -> Update:
    covered = rule.covered + rule.minibatches
    if covered < rule.step_batch:
        return Update(FRESH_GATHER, {}, {"total": rule.total}, after=rule.gathered)
    factor, ramp = (rule.gather_factor, rule.gather_ramp) if rule.covered else (rule.lr_factor, rule.scale_ramp)

    def after() -> None:
        rule.gathered()
        rule.covered = 0
    scalars = {"lr": rule.step_lr(covered, factor, ramp), "inv_count": 1.0 / covered, "weight_decay": rule.weight_decay}
    if not rule.momentum:
        return Update(FRESH_STEP_PLAIN, scalars, {"total": rule.total}, after=after)
    return Update(FRESH_STEP, {**scalars, "momentum": rule.momentum},
                  {"total": rule.total, "momentum_buffer": rule.buffer}, after=after)


def _nesterov(rule: NesterovRule, client: int, staleness: int) -> Update:
    scalars = {"inv_n": 1.0 / rule.every}
    if not rule.due():
        return Update(NESTEROV_PLAIN, scalars, {"total": rule.total}, after=rule.counted)
    return Update(NESTEROV, {**scalars, "beta": rule.beta}, {"total": rule.total, "momentum": rule.momentum},
                  after=rule.counted)


UPDATES: dict[type[Rule], Callable[..., Update]] = {
    Rule: lambda rule, client, staleness: Update(ADD),
    ScaledRule: lambda rule, client, staleness: Update(STEP, {"alpha": 1.0 / rule.clients}),
    StalenessRule: lambda rule, client, staleness: Update(STEP, {"alpha": staleness_factor(staleness, rule.clients)}),
    EASGDRule: lambda rule, client, staleness: Update(ELASTIC, {"alpha": rule.alpha}),
    SGDRule: _sgd,
    DCASGDRule: _dcasgd,
    FreshRule: _fresh,
    NesterovRule: _nesterov,
    AdagradRule: lambda rule, client, staleness: Update(ADAGRAD, {"lr": rule.lr, "weight_decay": rule.weight_decay,
                                                                  "eps": rule.EPS}, {"sum": rule.sum}),
}

# run(update, inputs, outputs) -> whether every element of d is finite
Kernel = Callable[[Update, "dict[str, Tensor]", "dict[str, Tensor]"], bool]


class Fused:
    """`rule`'s updates run by `kernel`, double-buffered (see the module docstring)."""

    def __init__(self, rule: Rule, kernel: Kernel):
        self.rule, self.kernel = rule, kernel
        self.spare: dict[str, Tensor] = {}  # the buffers the next update writes into

    def apply(self, w: Tensor, d: Tensor, client: int, staleness: int) -> Tensor | None:
        """The new weights (`w` becomes a spare), or None if d is not finite; the rule's
        state is replaced likewise."""
        update = UPDATES[type(self.rule)](self.rule, client, staleness)
        state = {k: w.new_zeros(w.shape) if v is None else v for k, v in update.state.items()}
        outputs = {k: self.spare.pop(k) if k in self.spare else w.new_empty(w.shape) for k in ("w", *state)}
        if not self.kernel(update, {"w": w, "d": d, **state, **update.reads}, outputs):
            self.spare.update(outputs)
            return None
        self.spare.update({"w": w, **state})
        if state:
            self.rule.load_state({**self.rule.state(), **{k: outputs[k] for k in state}})
        if update.after is not None:
            update.after()
        return outputs["w"]


def statements(code: str) -> list[tuple[str, str]]:
    """(target, expression) of each `target = expression;` in `code`."""
    found = STATEMENT.findall(code)
    if re.sub(r"\s", "", "".join(f"{t}={e};" for t, e in found)) != re.sub(r"\s", "", code):
        raise ValueError(f"not `name = expression;` statements: {code!r}")
    return found


def numpy_kernel(update: Update, inputs: dict[str, Tensor], outputs: dict[str, Tensor]) -> bool:
    """The statements in float32 numpy, on CPU tensors: the reference the tests hold the
    torch rules and the cupy kernels to."""
    scope = {"sqrt": np.sqrt, **{k: np.float32(v) for k, v in update.scalars.items()},
             **{k: v.numpy() for k, v in inputs.items()}, **{f"{k}_out": v.numpy() for k, v in outputs.items()}}
    with np.errstate(all="ignore"):  # a rejected push runs too, as on the GPU
        for target, expression in statements(update.code):
            value = eval(expression, {"__builtins__": {}}, scope)  # noqa: S307 (this module's formulas)
            if target.endswith("_out"):
                scope[target][...] = value
            else:
                scope[target] = value
    return bool(np.isfinite(scope["d"]).all())


def kernel_source(update: Update, inputs: tuple[str, ...], outputs: tuple[str, ...]) -> tuple[str, str, str]:
    """An ElementwiseKernel's in_params, out_params and operation for `update` over the
    named arrays: temporaries declared float, the flag `bad` set where d is not finite."""
    targets = {f"{k}_out" for k in outputs}
    body = [f"{'' if t in targets else 'float '}{t} = {e};" for t, e in statements(update.code)]
    body.append("if (!isfinite(d)) bad[0] = 1;")  # a benign race: every writer writes 1
    return (", ".join(f"float32 {k}" for k in (*inputs, *update.scalars)),
            ", ".join([*(f"float32 {k}_out" for k in outputs), "raw int32 bad"]), "\n".join(body))


class CupyKernel:
    """The statements as cupy ElementwiseKernels (compiled once per formula and
    signature) on CUDA tensors, shared with torch through DLPack, on torch's stream."""

    def __init__(self):
        import cupy

        self.cupy = cupy
        self.kernels: dict[tuple, object] = {}
        self.flags: dict[int, object] = {}  # per device: the int32 set where d is not finite

    def compile(self, update: Update, inputs: tuple[str, ...], outputs: tuple[str, ...]):
        key = (update.code, inputs, tuple(update.scalars), outputs)
        if key not in self.kernels:
            self.kernels[key] = self.cupy.ElementwiseKernel(*kernel_source(update, inputs, outputs),
                                                            name="asgd_update")
        return self.kernels[key]

    def __call__(self, update: Update, inputs: dict[str, Tensor], outputs: dict[str, Tensor]) -> bool:
        import torch

        cp, device = self.cupy, inputs["w"].device
        kernel = self.compile(update, tuple(inputs), tuple(outputs))
        stream = torch.cuda.current_stream(device).cuda_stream
        with cp.cuda.Device(device.index), (cp.cuda.ExternalStream(stream) if stream else cp.cuda.Stream.null):
            if device.index not in self.flags:
                self.flags[device.index] = cp.zeros(1, cp.int32)
            flag = self.flags[device.index]
            kernel(*(cp.from_dlpack(t) for t in inputs.values()), *(np.float32(v) for v in update.scalars.values()),
                   *(cp.from_dlpack(t) for t in outputs.values()), flag)
            if not flag.get()[0]:  # the one sync: a 4-byte read
                return True
            flag.fill(0)
            return False


def for_store(backend: ServerArrays, rule: Rule) -> Fused | None:
    """The fused path for a Store, where the weights are on a GPU, cupy imports and the
    rule has a formula here; None elsewhere (the torch rule runs)."""
    if backend.on_host or type(rule) not in UPDATES:
        return None
    try:
        return Fused(rule, CupyKernel())
    except ImportError:
        return None
