"""The blockwise codecs (`--compress int8`, `int4`) compiled for the host: a push encoded
with its error feedback in one pass, a payload decoded in one.

numpy takes several passes over the vector (the sum with the residual, |x|, the blocks'
maxima, the product, the rounding, the cast, int4's nibbles, then a decode and a
subtraction for the residual): at the default CNN's 206,922 floats more than the 1 ms a
push the issue allows for encode and decode on one core, int4's most (bench/studies/
codecs.py measures both sides; docs/performance.md has the numbers). Here each block of 256 is
summed with its residual into a buffer that stays in L1, its largest |x| taken, its codes
and the new residual written in a second pass over that buffer; a decode reads each
record once. The arithmetic is numpy's in the same order (float32 L / absmax, x times it
rounded half to even, code times scale), so both give the same bytes
(tests/unit/test_blockwise.py), and a host without g++ runs numpy's.

`make_codec(name)` is the wire's `make_codec` with this kernel handed to a blockwise
codec: the wire sits below the rest of paramserver, so the server and the clients
(which may import this) hand it in. Compiled once and cached as the fused updates are
(paramserver/compute/hostkernel.py's `build`).
"""
from __future__ import annotations

import ctypes
import functools
from typing import Callable

from paramserver.compute.hostkernel import available, build
from paramserver.wire import compress
from paramserver.wire.compress import BLOCK, Codec

SOURCE = r"""#include <cmath>
#include <cstdint>
#include <cstring>
static const int64_t B = %(block)d;
static const int BITS = %(bits)d;
static const float LEVELS = BITS == 8 ? 127.0f : 7.0f;
// x + 1.5 * 2^23 - 1.5 * 2^23 rounds |x| < 2^22 to an integer, half to even, as rint does,
// in two vector additions (the baseline x86-64 has no rounding instruction: a libm call each)
static const float ROUND = 12582912.0f;

static inline int64_t code_bytes(int64_t m) { return BITS == 8 ? m : (m + 1) / 2; }

// A block of m totals -> its record (scale, codes); residual (if any) := total - decoded.
static inline int64_t pack(const int64_t m, const float* total, float* residual, uint8_t* out) {
    float absmax = 0.0f;
    int nan = 0;
    #pragma omp simd reduction(max:absmax) reduction(|:nan)
    for (int64_t i = 0; i < m; ++i) {
        nan |= total[i] != total[i];
        absmax = std::fabs(total[i]) > absmax ? std::fabs(total[i]) : absmax;
    }
    if (nan) absmax = NAN;  // as numpy's max: the scale says so and the server rejects the push
    const float scale = absmax / LEVELS;
    const float inverse = absmax > 0.0f ? LEVELS / absmax : 0.0f;
    std::memcpy(out, &scale, 4);
    int8_t q[B + 1];
    #pragma omp simd
    for (int64_t i = 0; i < m; ++i) {
        float r = (total[i] * inverse + ROUND) - ROUND;
        r = r == r ? r : 0.0f;  // NaN or Inf times 0: no integer; its block decodes to NaN anyway
        q[i] = (int8_t)(int)r;
    }
    if (residual) {
        #pragma omp simd
        for (int64_t i = 0; i < m; ++i) residual[i] = total[i] - float(q[i]) * scale;
    }
    uint8_t* codes = out + 4;
    if (BITS == 8) {
        std::memcpy(codes, q, m);
    } else {
        q[m] = 0;  // an odd last block: a zero code pads its last byte
        #pragma omp simd
        for (int64_t j = 0; j < code_bytes(m); ++j)
            codes[j] = uint8_t(q[2 * j] + 8) | uint8_t((q[2 * j + 1] + 8) << 4);
    }
    return 4 + code_bytes(m);
}

// push (+ residual, which then keeps what rounding lost; null: none) -> records
extern "C" void asgd_encode(const int64_t n, const float* push, float* residual, uint8_t* out) {
    float total[B];
    for (int64_t lo = 0; lo < n; lo += B) {
        const int64_t m = n - lo < B ? n - lo : B;
        if (residual) {
            #pragma omp simd
            for (int64_t i = 0; i < m; ++i) total[i] = push[lo + i] + residual[lo + i];
            out += pack(m, total, residual + lo, out);
        } else {
            out += pack(m, push + lo, nullptr, out);
        }
    }
}

extern "C" void asgd_decode(const int64_t n, const uint8_t* data, float* out) {
    for (int64_t lo = 0; lo < n; lo += B) {
        const int64_t m = n - lo < B ? n - lo : B;
        float scale;
        std::memcpy(&scale, data, 4);
        const uint8_t* codes = data + 4;
        float* o = out + lo;
        if (BITS == 8) {
            #pragma omp simd
            for (int64_t i = 0; i < m; ++i) o[i] = float(int8_t(codes[i])) * scale;
        } else {
            #pragma omp simd
            for (int64_t j = 0; j < m / 2; ++j) {
                o[2 * j] = float(int(codes[j] & 15) - 8) * scale;
                o[2 * j + 1] = float(int(codes[j] >> 4) - 8) * scale;
            }
            if (m & 1) o[m - 1] = float(int(codes[m / 2] & 15) - 8) * scale;
        }
        data += 4 + code_bytes(m);
    }
}
"""


@functools.cache
def kernel(bits: int) -> tuple[Callable, Callable] | None:
    """(encode, decode) of the `bits`-bit codec, compiled; None without a compiler."""
    if not available():
        return None
    library = ctypes.CDLL(str(build(SOURCE % {"block": BLOCK, "bits": bits})))
    encode, decode = library.asgd_encode, library.asgd_decode
    encode.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    decode.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
    encode.restype = decode.restype = None
    return encode, decode


def make_codec(name: str) -> Codec:
    """The codec `name` of paramserver/wire/compress.py, a blockwise one compiled where g++ is found."""
    return compress.make_codec(name, kernel(int(name[3:])) if name in ("int8", "int4") else None)
