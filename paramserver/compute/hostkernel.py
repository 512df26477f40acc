"""The rules' fused updates compiled for the host CPU: a push read once to check it, then
one pass that updates the weights and the rule's state in place.

On the CPU the torch rules take several passes a push, each a kernel with its own
set-up, after the NaN/Inf check read the push once more: measured in one process on
this project's 2-core machine at the proxy CNN's 206,922 floats, `add` 96-119 us a push
and the default `fresh` (server momentum, the gradient noise scale) 0.76-1.04 ms, of
which torch's fused SGD step is 350 us and the noise scale's float64 norm 180 us. Here
each rule's `Update` (the statements a GPU server hands cupy, paramserver/compute/fused.py) is
compiled by g++ into one C++ function: it sums |d|^2 in float64 (blocks of 256 summed
in float32, so the loop vectorises), which is finite exactly when every element of d
is (where it is not, an exact pass says which: a NaN or Inf rejects the push before
anything is written; huge finite values are let through, as the torch path's check
does), and hands that sum to the noise scale; then one loop reads w, d, the rule's state
and reads once and writes the new w and state over the old, summing d into the noise
scale's window on the way where the rule measures it (`InPlace`). In place, not
double-buffered as on a GPU (whose flag comes only after the kernel wrote): a second
weights vector here costs more than it saves (measured: w + d into a third vector 75-97
us against torch's in-place add 39 us at this size, the three vectors outgrowing a
core's L2).

Arithmetic is float32 as in the formulas, without fused multiply-adds but where a
formula asks for one (`fmadd`, paramserver/compute/fused.py; `-ffp-contract=off`), for the
baseline of the machine's architecture (no `-march=native`: a cache in a home directory
may be shared by a cluster's different nodes). Each kernel is compiled once and cached
by its source's hash (`$ASGD_KERNEL_CACHE`, else `~/.cache/gpu-asgd/kernels`; written
atomically, so concurrent ranks share it): a compile takes under a second, once per machine and formula.
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import math
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from paramserver.compute.fused import HOST_FMADD, statements
from paramserver.rules.base import PushFacts, Rule, Update

if TYPE_CHECKING:
    from torch import Tensor

COMPILER = "g++"
FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-ffp-contract=off", "-fno-math-errno", "-fopenmp-simd")
COMPILE_TIMEOUT_S = 120
_SQUARES = """// |d|^2 in float64, or -1 where an element of d is NaN or Inf
static double squares(const int64_t n, const float* d) {
    double total = 0;
    for (int64_t start = 0; start < n; start += 256) {
        const int64_t end = start + 256 < n ? start + 256 : n;
        float block = 0;
        #pragma omp simd reduction(+:block)
        for (int64_t i = start; i < end; ++i) block += d[i] * d[i];
        total += block;
    }
    if (std::isfinite(total)) return total;
    int bad = 0;  // a NaN or Inf, or finite elements whose squares overflow a float32 block
    total = 0;
    #pragma omp simd reduction(|:bad) reduction(+:total)
    for (int64_t i = 0; i < n; ++i) {
        bad |= !(std::fabs(d[i]) <= FLT_MAX);  // NaN compares false
        total += double(d[i]) * double(d[i]);
    }
    return bad ? -1 : total;
}
"""


SQUARES_SOURCE = f"""#include <cfloat>
#include <cmath>
#include <cstdint>
{_SQUARES}
extern "C" double asgd_squares(const int64_t n, const float* v) {{ return squares(n, v); }}
"""
# A gradient push summed into the noise scale's window (paramserver/noise.py) in the
# update's own pass: the window's first push replaces the last window's sum.
NOISE_STARTS, NOISE_ADDS = "noise_total_out = d;", "noise_total_out = noise_total + d;"


class KernelError(RuntimeError):
    """A formula the compiler refused: the rule's `Update` is not the C it must be."""


def available() -> bool:
    """Whether kernels can be compiled here (the compiler is on PATH)."""
    return shutil.which(COMPILER) is not None


def source(update: Update, vectors: tuple[str, ...], reads: tuple[str, ...]) -> str:
    """One C function `asgd_update(n, d, vectors..., reads..., scalars..., d_squared)`
    updating `vectors` (w and the rule's state) in place; it returns 1, having written
    nothing, where an element of d is not finite. A vector the update leaves as it was
    (`w_out = w;`, fresh's gathering push) is not written back: in place, that store
    would move the whole vector through memory for nothing."""
    outputs = [f"{k}_out" for k in vectors]
    code = statements(update.code)
    unchanged = {t for t, e in code if e.strip() + "_out" == t}
    params = (["const int64_t n", "const float* d_p"] + [f"float* {k}_p" for k in vectors]
              + [f"const float* {k}_p" for k in reads] + [f"const float {k}" for k in update.scalars]
              + ["double* d_squared"])
    element = ([f"        const float {k} = {k}_p[i];" for k in ("d", *vectors, *reads)]
               + [f"        float {t};" for t in outputs]
               + [f"        {'' if t in outputs else 'const float '}{t} = {e};" for t, e in code]
               + [f"        {k}_p[i] = {k}_out;" for k in vectors if f"{k}_out" not in unchanged])
    newline = "\n"
    return f"""#include <cfloat>
#include <cmath>
#include <cstdint>
using std::sqrt;
{HOST_FMADD}
{_SQUARES}
extern "C" int asgd_update({", ".join(params)}) {{
    const double total = squares(n, d_p);
    if (total < 0) return 1;
    *d_squared = total;
    #pragma omp simd  // each element reads and writes its own index only: in place is safe
    for (int64_t i = 0; i < n; ++i) {{
{newline.join(element)}
    }}
    return 0;
}}
"""


@functools.cache
def _compiler_id() -> str:
    """What the cache key must change with besides the source: the compiler's file (an
    upgrade replaces it), read without starting it in every server process."""
    path = os.path.realpath(shutil.which(COMPILER) or COMPILER)
    stat = os.stat(path)
    return f"{path} {stat.st_size} {stat.st_mtime_ns}"


def cache_dir() -> Path:
    return Path(os.environ.get("ASGD_KERNEL_CACHE") or Path.home() / ".cache" / "gpu-asgd" / "kernels")


def build(code: str) -> Path:
    """The shared library of `code`, compiled once (see the module's doc)."""
    key = hashlib.sha256("\n".join([_compiler_id(), " ".join(FLAGS), os.uname().machine, code]).encode())
    folder = cache_dir()
    library = folder / f"asgd_{key.hexdigest()[:24]}.so"
    if library.exists():
        return library
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        (Path(scratch) / "kernel.cpp").write_text(code)
        built = Path(scratch) / "kernel.so"
        done = subprocess.run([COMPILER, *FLAGS, "-o", str(built), str(Path(scratch) / "kernel.cpp")],
                              capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        if done.returncode:
            raise KernelError(f"{COMPILER} refused a fused update: {done.stderr.strip()[:2000]}")
        os.replace(built, library)  # atomic: a rank that finds it finds it whole
    return library


class HostKernel:
    """Each (formula, signature) compiled once, called through ctypes on the tensors' memory."""

    def __init__(self):
        self.kernels: dict[tuple, ctypes._CFuncPtr] = {}
        self.squared = ctypes.c_double()
        self._squares: ctypes._CFuncPtr | None = None

    def squares(self, v: Tensor) -> float:
        """|v|^2 as the update's check sums it (inf where v holds a NaN or Inf, or its
        squares overflow): the noise scale's norm of its window's sum, with no float64
        copy of the vector (83 against 19 us at the proxy size in one process, hot)."""
        if self._squares is None:
            self._squares = ctypes.CDLL(str(build(SQUARES_SOURCE))).asgd_squares
            self._squares.argtypes, self._squares.restype = [ctypes.c_int64, ctypes.c_void_p], ctypes.c_double
        total = self._squares(v.shape[0], v.data_ptr())
        return math.inf if total < 0 else total

    def compile(self, update: Update, vectors: tuple[str, ...], reads: tuple[str, ...]):
        key = (update.code, vectors, reads, tuple(update.scalars))
        if key not in self.kernels:
            function = ctypes.CDLL(str(build(source(update, vectors, reads)))).asgd_update
            function.argtypes = ([ctypes.c_int64] + [ctypes.c_void_p] * (1 + len(vectors) + len(reads))
                                 + [ctypes.c_float] * len(update.scalars) + [ctypes.c_void_p])
            function.restype = ctypes.c_int
            self.kernels[key] = function
        return self.kernels[key]

    def __call__(self, update: Update, d: Tensor, vectors: dict[str, Tensor], reads: dict[str, Tensor]) -> float | None:
        """|d|^2 once `vectors` are updated in place, or None (nothing written) where d is not finite."""
        kernel = self.compile(update, tuple(vectors), tuple(reads))
        bad = kernel(d.shape[0], d.data_ptr(), *(t.data_ptr() for t in vectors.values()),
                     *(t.data_ptr() for t in reads.values()), *update.scalars.values(), ctypes.addressof(self.squared))
        return None if bad else self.squared.value


class InPlace:
    """`rule`'s updates run by a `HostKernel` over the weights and the rule's state, in
    place; the same interface as `paramserver.compute.fused.Fused`. Where the rule measures the
    gradient noise scale, the same pass sums each push into the scale's window and the
    kernel's squares take its norm (`sums_noise`): measured in one process at the proxy
    size, 2 clients of `fresh`, the noise scale's own passes had cost about what the
    update did."""

    def __init__(self, rule: Rule, kernel: HostKernel):
        self.rule, self.kernel = rule, kernel
        self.d_squared: float | None = None  # the last push's |d|^2, for the noise scale
        self.sums_noise = rule.noise is not None
        if self.sums_noise:
            rule.noise.norm = kernel.squares

    def apply(self, w: Tensor, push: PushFacts) -> Tensor | None:
        """`w`, updated, or None (nothing changed) if the push is not finite."""
        update, d = self.rule.fused(push), push.d
        state = {k: w.new_zeros(w.shape) if v is None else v for k, v in update.state.items()}
        vectors = {"w": w, **state}
        noise = self.rule.noise if self.sums_noise else None
        if noise is not None:  # a window's first push writes its sum: nothing to read, any memory will do
            starts = noise.starts or noise.total is None
            update = dataclasses.replace(update, code=f"{update.code}\n{NOISE_STARTS if starts else NOISE_ADDS}")
            vectors["noise_total"] = w.new_empty(w.shape) if noise.total is None else noise.total
        self.d_squared = self.kernel(update, d, vectors, update.reads)
        if self.d_squared is None:
            return None
        if noise is not None:
            noise.total = vectors["noise_total"]
        if any(v is None for v in update.state.values()):  # the vectors made here become the rule's
            self.rule.load_state({**self.rule.state(), **state})
        if update.after is not None:
            update.after()
        return w
