"""Compressed pushes and pulls: float32 vectors on the wire as 16-bit floats.

Half the bytes each way. The server keeps float32 weights and applies float32 updates;
only the wire is narrow. A push loses the low bits of each element, so the client keeps
what was lost (error feedback) and adds it to its next push: over many pushes the
server receives the client's whole work, late by one push at most. Pulled weights are
rounded once; the client's next push is measured from them, so no error accumulates.

- `fp16`: IEEE half (10-bit mantissa, range 6e-5 .. 65504: fine for updates, can
  overflow to Inf for weights beyond it; the server then rejects the push).
- `bf16`: bfloat16 (8-bit mantissa, float32's range), rounded to nearest even; numpy
  has no bfloat16, so it travels as the upper 16 bits of each float32.
"""
from __future__ import annotations

import numpy as np

CODECS = ("none", "fp16", "bf16")


class Codec:
    """No compression: the float32 vector itself."""

    dtype = "float32"          # the name a push header carries
    wire_dtype = np.dtype(np.float32)

    def encode(self, vector: np.ndarray) -> np.ndarray:
        return vector

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


def make_codec(name: str) -> Codec:
    return {"none": Codec, "fp16": Float16, "bf16": BFloat16}[name]()


class ErrorFeedback:
    """One client's pushes through a codec, keeping what the codec dropped for the next."""

    def __init__(self, codec: Codec, size: int):
        self.codec = codec
        self.residual = np.zeros(size, np.float32)
        self.decoded = np.empty(size, np.float32)

    def encode(self, push: np.ndarray) -> np.ndarray:
        total = push + self.residual
        data = self.codec.encode(total)
        np.subtract(total, self.codec.decode(data, self.decoded), out=self.residual)
        return data
