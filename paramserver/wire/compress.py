"""Compressed pushes and pulls: float32 vectors on the wire as 16-bit floats, or as 8-
or 4-bit integers with a float32 scale a block.

The server keeps float32 weights and applies float32 updates: a push is decoded before
any rule sees it; only the wire is narrow. A push loses the low bits of each element, so
the client keeps what was lost (error feedback) and adds it to its next push: over many
pushes the server receives the client's whole work, late by one push at most (what is
owed is one rounding's worth, however many pushes went). Pulls are compressed only with
`compress_pulls`, and without error feedback: pulled weights are a state, not a sum;
each pull rounds the server's float32 weights afresh and the client's next push is
measured from what it received (clients/client.py's `base`), so a pull's rounding never
enters the server's weights and nothing accumulates; the client only trains from a point
off by at most half a step of the codec.

- `fp16`: IEEE half (10-bit mantissa, range 6e-5 .. 65504: fine for updates, can
  overflow to Inf for weights beyond it; the server then rejects the push).
- `bf16`: bfloat16 (8-bit mantissa, float32's range), rounded to nearest even; numpy
  has no bfloat16, so it travels as the upper 16 bits of each float32.
- `int8`, `int4`: blockwise: each block of `BLOCK` elements of the flat vector travels
  as its float32 scale (its largest |x| / 127, or / 7) and one integer an element,
  round(x / scale), in [-127, 127] (a byte each) or [-7, 7] (stored + 8, two a byte, the
  even element in the low nibble), so |x - decoded| <= scale / 2. A block is a record
  [scale | codes], so any run of whole blocks is a contiguous run of bytes: sharded
  servers' slices start at multiples of `BLOCK` (`Codec.block`, which
  `protocol.shard_bounds` aligns to) and each server decodes its own bytes alone. A
  NaN or Inf makes its block's scale one, which decodes to NaN: the server rejects the
  push, as it does a malformed frame's NaN or Inf scale (a wrong length it rejects by size).

`BLOCK` = 256, from the two costs a block size sets. The scale's 4 bytes add 4 / B
bytes an element: 1.6 % of int8's bytes at 256 (0.254x float32's), 3.1 % of int4's
(0.129x); at 64 they would be 6.3 % and 12.5 % (0.266x, 0.141x, near the targets of
0.27x and 0.15x). The bound, scale / 2, follows the block's largest |x|, which for
B roughly normal values grows as sqrt(2 ln B): 2.9 sigma at 64, 3.3 at 256, 3.7 at
1024. So 256 costs about 13 % more rounding than 64 for a quarter of its overhead, and
1024 saves 1.2 % (int8) of the bytes for 12 % more rounding.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

CODECS = ("none", "fp16", "bf16", "int8", "int4")
BLOCK = 256  # elements a scale (see the module's doc)


class Codec:
    """No compression: the float32 vector itself."""

    dtype = "float32"          # the name a push header carries
    wire_dtype = np.dtype(np.float32)
    block = 1                  # a slice of the vector that starts at a multiple of it encodes alone

    def wire_size(self, size: int) -> int:
        """The wire's elements (of `wire_dtype`) for a vector of `size` float32."""
        return size

    def wire_bounds(self, bounds: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Slices of the vector (each starting at a multiple of `block`) as slices of its encoding."""
        return [(self.wire_size(lo), self.wire_size(hi)) for lo, hi in bounds]

    def encode(self, vector: np.ndarray) -> np.ndarray:
        return vector

    def encode_owing(self, push: np.ndarray, residual: np.ndarray, scratch: np.ndarray) -> np.ndarray:
        """`push` + `residual` encoded, `residual` left holding what the encoding lost."""
        total = push + residual
        data = self.encode(total)
        np.subtract(total, self.decode(data, scratch), out=residual)
        return data

    def decode(self, data: np.ndarray, out: np.ndarray) -> np.ndarray:
        """The float32 vector (`data` itself when it already is one, else written to `out`)."""
        return data


class Float16(Codec):
    dtype = "float16"
    wire_dtype = np.dtype(np.float16)

    def encode(self, vector: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):  # beyond 65504 is Inf, which the server rejects
            return vector.astype(np.float16)

    def decode(self, data: np.ndarray, out: np.ndarray) -> np.ndarray:
        np.copyto(out, data)
        return out


class BFloat16(Codec):
    dtype = "bfloat16"
    wire_dtype = np.dtype(np.uint16)

    def encode(self, vector: np.ndarray) -> np.ndarray:
        bits = vector.view(np.uint32)
        rounding = np.uint32(0x7FFF) + ((bits >> 16) & 1)  # to nearest, ties to even
        data = ((bits + rounding) >> 16).astype(np.uint16)
        with np.errstate(over="ignore"):
            finite = np.isfinite(np.dot(vector, vector))
        if not finite:  # a NaN may have rounded to Inf, or wrapped around to 0
            data[np.isnan(vector)] = 0x7FC0
        return data

    def decode(self, data: np.ndarray, out: np.ndarray) -> np.ndarray:
        out.view(np.uint32)[:] = data.astype(np.uint32) << 16
        return out


class Blockwise(Codec):
    """Integers of `bits` bits a block of `BLOCK`, each block after its float32 scale.

    `kernel`: the same arithmetic compiled, bit for bit (paramserver/compute/quantkernel.py,
    which the wire cannot import: it sits below the rest of paramserver), as the functions
    (encode(n, push, residual or None, out), decode(n, data, out)) on the arrays' memory;
    None: numpy's passes, several a push."""

    wire_dtype = np.dtype(np.uint8)
    block = BLOCK

    def __init__(self, bits: int, kernel: tuple[Callable, Callable] | None = None):
        self.bits, self.dtype, self.kernel = bits, f"int{bits}", kernel
        self.levels = 2 ** (bits - 1) - 1  # 127, 7: symmetric, so 0 is exact
        self.record = 4 + self.codes(BLOCK)  # bytes a whole block takes

    def codes(self, elements: int) -> int:
        """The code bytes of a block of `elements`."""
        return elements if self.bits == 8 else (elements + 1) // 2

    def wire_size(self, size: int) -> int:
        whole, rest = divmod(size, BLOCK)
        return whole * self.record + (4 + self.codes(rest) if rest else 0)

    def encode(self, vector: np.ndarray) -> np.ndarray:
        data = np.empty(self.wire_size(vector.size), np.uint8)
        if self.kernel is not None:
            self.kernel[0](vector.size, _address(np.ascontiguousarray(vector, np.float32)), None, _address(data))
            return data
        for values, records in self._blocks(vector, data):
            self._pack(values, records)
        return data

    def encode_owing(self, push: np.ndarray, residual: np.ndarray, scratch: np.ndarray) -> np.ndarray:
        if self.kernel is None:
            return super().encode_owing(push, residual, scratch)
        data = np.empty(self.wire_size(push.size), np.uint8)
        self.kernel[0](push.size, _address(push), _address(residual), _address(data))
        return data

    def decode(self, data: np.ndarray, out: np.ndarray) -> np.ndarray:
        if data.nbytes != self.wire_size(out.size):  # the server refuses it before; a kernel must not read past it
            raise ValueError(f"{data.nbytes} bytes do not hold {out.size} elements as {self.dtype}")
        if self.kernel is not None:
            self.kernel[1](out.size, _address(data), _address(out))
            return out
        for values, records in self._blocks(out, data):
            self._unpack(records, values)
        return out

    def _blocks(self, vector: np.ndarray, data: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """The whole blocks as (blocks, B) beside their records, and the last partial one."""
        whole = vector.size // BLOCK
        cut = whole * self.record
        parts = [(vector[:whole * BLOCK].reshape(whole, BLOCK), data[:cut].reshape(whole, self.record))]
        if vector.size % BLOCK:
            parts.append((vector[whole * BLOCK:].reshape(1, -1), data[cut:].reshape(1, -1)))
        return parts

    def _pack(self, values: np.ndarray, records: np.ndarray) -> None:
        with np.errstate(invalid="ignore", over="ignore"):  # NaN, Inf: the scale says so (module doc)
            absmax = np.abs(values).max(axis=1)
            records[:, :4].view(np.float32)[:, 0] = absmax / self.levels
            inverse = np.divide(self.levels, absmax, out=np.zeros_like(absmax), where=absmax > 0)
            # |x| * levels / absmax rounds to at most `levels`: no clipping needed
            codes = np.rint(values * inverse[:, None]).astype(np.int8)
        if self.bits == 8:
            records[:, 4:] = codes.view(np.uint8)
            return
        if codes.shape[1] % 2:  # an odd last block: a zero code pads its last byte
            codes = np.concatenate([codes, np.zeros((codes.shape[0], 1), np.int8)], axis=1)
        nibbles = (codes + 8).view(np.uint8)
        records[:, 4:] = nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)

    def _unpack(self, records: np.ndarray, values: np.ndarray) -> None:
        scales = records[:, :4].view(np.float32)
        with np.errstate(invalid="ignore", over="ignore"):  # a NaN or Inf scale: the server rejects the push
            self._scaled(records, scales, values)

    def _scaled(self, records: np.ndarray, scales: np.ndarray, values: np.ndarray) -> None:
        if self.bits == 8:
            np.multiply(records[:, 4:].view(np.int8), scales, out=values)
            return
        packed = records[:, 4:]
        codes = np.empty((packed.shape[0], 2 * packed.shape[1]), np.int8)
        np.bitwise_and(packed, 15, out=codes[:, 0::2].view(np.uint8))
        np.right_shift(packed, 4, out=codes[:, 1::2].view(np.uint8))
        codes -= 8
        np.multiply(codes[:, :values.shape[1]], scales, out=values)


def _address(array: np.ndarray) -> int:
    """Where a contiguous array's bytes start, for a compiled kernel."""
    if not array.flags.c_contiguous:
        raise ValueError("a compiled codec takes contiguous arrays")
    return array.__array_interface__["data"][0]


def make_codec(name: str, kernel: tuple[Callable, Callable] | None = None) -> Codec:
    """The codec `name` (CODECS); `kernel`: a blockwise one's compiled arithmetic."""
    if name in ("int8", "int4"):
        return Blockwise(int(name[3:]), kernel)
    return {"none": Codec, "fp16": Float16, "bf16": BFloat16}[name]()


class ErrorFeedback:
    """One client's pushes through a codec, keeping what the codec dropped for the next."""

    def __init__(self, codec: Codec, size: int):
        self.codec = codec
        self.residual = np.zeros(size, np.float32)
        self.decoded = np.empty(size, np.float32)

    def encode(self, push: np.ndarray, lo: int = 0) -> np.ndarray:
        """`push` encoded with what earlier pushes dropped; `lo`: where it starts in the
        vector, a streamed fragment's slice (its residual is that slice's)."""
        hi = lo + push.size
        return self.codec.encode_owing(np.ascontiguousarray(push, np.float32), self.residual[lo:hi],
                                       self.decoded[lo:hi])
