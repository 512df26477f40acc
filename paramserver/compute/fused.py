"""Each update rule as one fused elementwise kernel, for a server whose weights are on a GPU.

paramserver/rules/ writes each rule on torch tensors: several kernels a push (DC-ASGD's
takes about eight), each a pass over memory, after the host read the push once more
for NaN/Inf. Each rule also writes its update once more, beside its torch arithmetic
(`Rule.fused`, an `Update`: a few `name = expr;` statements in the common ground of C
and Python; constants come in as float32 scalars, a literal 0.5 being a double in C).
Here such an update is compiled by cupy into one ElementwiseKernel that reads w, d and
the rule's state once, writes their new values once, and raises a flag where an element
of d is not finite; nothing here knows a rule. `Store` uses it when the weights are on a
GPU and cupy imports; on the host the same statements compiled by g++ into one C++ loop
that updates in place once it has read d (paramserver/compute/hostkernel.py), where g++ is
found (`paramserver.store.kernel_path`); elsewhere, and with `server_kernel = "torch"`, the torch rules run.

A rejected push must leave the weights and the rule's state as they were, and the flag
is known only after the kernel wrote them. So the kernel writes into second buffers
(`Fused` keeps one spare a vector), and they are swapped in only when the flag is clear:
no extra pass, at the cost of one more vector for the weights and each state vector.

The same statements run in numpy (`numpy_kernel`), which is how tests/unit/test_fused.py
holds every formula to its torch rule on a machine without a GPU (and it compiles each
kernel's operation as host C++). Unverified on a GPU so far: bench/
gpu_check.sh runs tests/sim/test_gpu.py and times the kernels.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Callable

import numpy as np

from paramserver.rules import RULES
from paramserver.rules.base import PushFacts, Rule, Update

if TYPE_CHECKING:
    from torch import Tensor


# Every formula the rules' fused updates use (each rule owns its own: paramserver/rules/).
FORMULAS = tuple(dict.fromkeys(code for rule in RULES.values() for code in rule.FORMULAS))
STATEMENT = re.compile(r"\s*([A-Za-z]\w*)\s*=\s*([^;=]+);")
# `fmadd(a, b, c)`: a * b + c rounded once, as torch's vectorised CPU kernels (AVX2, AVX-512;
# measured) and CUDA compute addcmul, so a formula can match them bit for bit. On the host
# in float64 (the product exact; it vectorises without -mfma), on a GPU by fmaf.
HOST_FMADD = "static inline float fmadd(float a, float b, float c) { return float(double(a) * double(b) + double(c)); }"
CUDA_FMADD = "__device__ inline float fmadd(float a, float b, float c) { return fmaf(a, b, c); }"

# run(update, inputs, outputs) -> whether every element of d is finite
Kernel = Callable[[Update, "dict[str, Tensor]", "dict[str, Tensor]"], bool]


class KernelFailed(RuntimeError):
    """The kernel did not compile or launch (a driver or toolkit cupy cannot use): the
    Store goes on with the rule's torch arithmetic."""


class Fused:
    """`rule`'s updates run by `kernel`, double-buffered (see the module docstring)."""

    d_squared: float | None = None  # |d|^2 of the last push: these kernels do not sum it (the host's does)
    sums_noise = False  # nor the noise scale's window (the host's does)

    def __init__(self, rule: Rule, kernel: Kernel):
        self.rule, self.kernel = rule, kernel
        self.spare: dict[str, Tensor] = {}  # the buffers the next update writes into

    def apply(self, w: Tensor, push: PushFacts) -> Tensor | None:
        """The new weights (`w` becomes a spare), or None if the push is not finite; the
        rule's state is replaced likewise. A fragment's `w` and state are views into the
        whole vectors, so its new values are copied back into them instead (and `w` returned)."""
        update, d = self.rule.fused(push), push.d
        state = {k: w.new_zeros(w.shape) if v is None else v for k, v in update.state.items()}
        outputs = {k: self._buffer(k, w) for k in ("w", *state)}
        if not self.kernel(update, {"w": w, "d": d, **state, **update.reads}, outputs):
            self.spare.update(outputs)
            return None
        if push.piece is not None:
            for k, view in {"w": w, **state}.items():
                view.copy_(outputs[k])
            self.spare.update(outputs)
        else:
            self.spare.update({"w": w, **state})
            if state:
                self.rule.load_state({**self.rule.state(), **{k: outputs[k] for k in state}})
        if update.after is not None:
            update.after()
        return w if push.piece is not None else outputs["w"]

    def _buffer(self, name: str, w: Tensor) -> Tensor:
        """A buffer of `w`'s length for `name`'s new values: the spare, where it has that length."""
        spare = self.spare.pop(name, None)
        return spare if spare is not None and spare.shape == w.shape else w.new_empty(w.shape)


def statements(code: str) -> list[tuple[str, str]]:
    """(target, expression) of each `target = expression;` in `code`."""
    found = STATEMENT.findall(code)
    if re.sub(r"\s", "", "".join(f"{t}={e};" for t, e in found)) != re.sub(r"\s", "", code):
        raise ValueError(f"not `name = expression;` statements: {code!r}")
    return found


def numpy_kernel(update: Update, inputs: dict[str, Tensor], outputs: dict[str, Tensor]) -> bool:
    """The statements in float32 numpy, on CPU tensors: the reference the tests hold the
    torch rules and the cupy kernels to."""
    scope = {"sqrt": np.sqrt, "fmadd": _fmadd, **{k: np.float32(v) for k, v in update.scalars.items()},
             **{k: v.numpy() for k, v in inputs.items()}, **{f"{k}_out": v.numpy() for k, v in outputs.items()}}
    with np.errstate(all="ignore"):  # a rejected push runs too, as on the GPU
        for target, expression in statements(update.code):
            value = eval(expression, {"__builtins__": {}}, scope)  # noqa: S307 (this module's formulas)
            if target.endswith("_out"):
                scope[target][...] = value
            else:
                scope[target] = value
    return bool(np.isfinite(scope["d"]).all())


def _fmadd(a, b, c):
    return (np.asarray(a, np.float64) * np.asarray(b, np.float64) + np.asarray(c, np.float64)).astype(np.float32)


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
                                                            name="asgd_update", preamble=CUDA_FMADD)
        return self.kernels[key]

    def __call__(self, update: Update, inputs: dict[str, Tensor], outputs: dict[str, Tensor]) -> bool:
        try:
            return self._run(update, inputs, outputs)
        except Exception as error:  # noqa: BLE001 - cupy's compiler, driver and runtime errors alike
            raise KernelFailed(f"the cupy kernel failed ({type(error).__name__}: {error})") from error

    def _run(self, update: Update, inputs: dict[str, Tensor], outputs: dict[str, Tensor]) -> bool:
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
