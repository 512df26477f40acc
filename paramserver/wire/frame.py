"""The hot path's wire format: a push, and a weights reply, each one MPI message.

    | 64-byte header | payload (the vector's bytes) | rows (a push's log rows, JSON) |

The header is fixed binary: magic, format, tag, dtype, fetch, the sender's rank, step
(of a reply: the server's progress in samples, which sets the lr schedule), version,
payload length in elements, a streamed fragment's index (-1: the whole vector) and a
push's offset of it (docs/training.md), the rows' byte count, a reply's DyLU window (a push's: 0),
and a CRC-32 of the fields before it. Nothing here is unpickled, so a message from a broken or hostile sender can
only be rejected (`Garbled`), never run. The rows go last, so a push's payload lands in
the server's buffer whatever the rows' length.

The vectors that travel (the server's weights and landing buffer, a CPU client's pushes
and incoming weights) are allocated by `empty()`, with room for the header before them
and for rows after: the message is then one contiguous block, sent and received in
place, with no copy. Any other vector (compressed, GPU-staged, a shard's slice after the
first) is copied into a block first, or out of one after (paramserver/wire/transport.py).
Not a derived MPI datatype over the parts: MPICH packs those in pieces that move only
while both sides poll (measured: 8 MB pushes to sharded servers crawled at 2 a second).
Rare messages (PULL, STOP, FAIL, BYE, STATE) stay pickled dataclasses: they cost a message each,
not one per minibatch.
"""
from __future__ import annotations

import ctypes
import json
import struct
import weakref
import zlib
from dataclasses import dataclass

import numpy as np

from paramserver.wire.protocol import Push, Tag, Weights

MAGIC, FORMAT = b"ASGD", 3  # 2: the window field; 3: a streamed fragment's index and offset
HEADER_BYTES = 64
# magic, format, tag, dtype code, fetch, client rank, step, version, length, fragment, offset, rows bytes,
# window | crc
_FIELDS = struct.Struct("<4sBBBBiqqqiqII")
_CRC = struct.Struct("<I")
DTYPES = ("float32", "float16", "bfloat16", "int8", "int4")  # a push header's codec name, by its code on the wire
FRAMED = (Tag.PUSH, Tag.WEIGHTS)
ROWS_ROOM = 1 << 16  # bytes kept after a vector from `empty()`, for a push's rows
# vector address -> a weak reference to its frame. Not a WeakValueDictionary: its callback
# is Python code run wherever a vector is freed (twice a push on a client), and a SIGTERM's
# KeyboardInterrupt raised inside it is lost ("Exception ignored in: ... remove"), seen in
# CI. Without a callback, dead references are dropped as the table grows.
_FRAMES: dict[int, weakref.ref] = {}
_PRUNE_AT = [1024]  # the table's size at which the dead are dropped: twice the living after


def empty(size: int, dtype: np.dtype | type = np.float32) -> np.ndarray:
    """An uninitialised vector with room for a frame around it (see the module's doc).
    Any view that starts where it does (a torch tensor's `.numpy()`) finds the room too."""
    nbytes = size * np.dtype(dtype).itemsize
    frame = np.empty(HEADER_BYTES + nbytes + ROWS_ROOM, np.uint8)
    vector = frame[HEADER_BYTES:HEADER_BYTES + nbytes].view(dtype)
    if len(_FRAMES) >= _PRUNE_AT[0]:
        for dead in [a for a, ref in _FRAMES.items() if ref() is None]:
            del _FRAMES[dead]
        _PRUNE_AT[0] = max(1024, 2 * len(_FRAMES))
    _FRAMES[address(vector)] = weakref.ref(frame)
    return vector


def address(array: np.ndarray) -> int:
    """Where `array`'s bytes start. Read through ctypes (0.4 us), not numpy's
    `__array_interface__` (1.0 us: it builds a dict of six entries), since a round trip
    asks it eight times; a read-only or empty array the numpy way."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(array))
    except (TypeError, ValueError, BufferError):
        return array.__array_interface__["data"][0]


def around(data: np.ndarray, tail: int) -> np.ndarray | None:
    """The contiguous block [header | `data` | `tail` bytes] when `data` (bytes) starts a
    vector from `empty()` and that much room after it is free (after the whole vector:
    behind a leading slice of it, such as a sharded server's, lies the next slice)."""
    ref = _FRAMES.get(address(data))
    frame = ref() if ref is not None else None
    if frame is None:
        return None
    whole = data.nbytes == frame.nbytes - HEADER_BYTES - ROWS_ROOM
    return frame[:HEADER_BYTES + data.nbytes + tail] if tail == 0 or whole and tail <= ROWS_ROOM else None


@dataclass(frozen=True)
class Garbled:
    """A framed message that could not be read: the handler rejects it, saying why."""

    why: str


def write_header(out: np.ndarray, tag: int, header: Push | Weights, rank: int, rows: bytes = b"") -> None:
    """The 64 header bytes for `header`, sent by `rank`, into `out`. (Replies from the
    server's weights share the room before them: the transport writes one there only
    when no send from it is under way, paramserver/wire/transport.py's `post`.)"""
    if isinstance(header, Push):
        fields = (DTYPES.index(header.dtype), header.fetch, header.step, 0, header.size, header.fragment,
                  header.offset, 0)
    else:  # a reply's step field carries the server's progress in samples, its fetch byte two flags
        fields = (0, header.stop | header.state << 1, header.samples, header.version, header.size, header.fragment,
                  0, header.window)
    dtype, fetch, step, version, length, fragment, offset, window = fields
    _FIELDS.pack_into(out, 0, MAGIC, FORMAT, tag, dtype, fetch, rank, step, version, length, fragment, offset,
                      len(rows), window)
    _CRC.pack_into(out, _FIELDS.size, zlib.crc32(out[:_FIELDS.size]))


_ROWS = json.JSONEncoder(separators=(",", ":"))  # one, not one a push as json.dumps makes (0.7 of its 3.2 us)


def rows_bytes(header: Push) -> bytes:
    return _ROWS.encode(header.rows).encode() if header.rows else b""


def nbytes(header: Push | Weights, payload: np.ndarray) -> int:
    """The bytes of `header`'s frame with `payload`, as `Transport.post` sends it."""
    return HEADER_BYTES + payload.nbytes + (len(rows_bytes(header)) if isinstance(header, Push) else 0)


def rows_length(head: np.ndarray) -> int:
    """The rows' byte count a header announces (0 when the header is unreadable)."""
    if head.nbytes < HEADER_BYTES or bytes(head[:4]) != MAGIC:
        return 0
    return _FIELDS.unpack_from(head)[-2]


def decode(tag: int, head: np.ndarray, rows: np.ndarray | bytes, rank: int) -> Push | Weights | Garbled:
    """The header a framed message carries, or why it is unreadable. `head`: its first 64
    bytes; `rows`: the bytes after the payload; `rank`: the sender's, which the header
    must name."""
    if head.nbytes < HEADER_BYTES:
        return Garbled(f"a framed message of {head.nbytes} bytes, shorter than its header")
    (magic, fmt, wire_tag, dtype, fetch, client, step, version, length, fragment, offset, nrows,
     window) = _FIELDS.unpack_from(head)
    if magic != MAGIC:
        return Garbled("a framed message without the frame's magic bytes")
    if _CRC.unpack_from(head, _FIELDS.size)[0] != zlib.crc32(head[:_FIELDS.size]):
        return Garbled("a frame header whose checksum does not match")
    flags = 3 if tag == Tag.WEIGHTS else 1  # a reply's stop and state, a push's fetch
    if ((fmt, wire_tag, client) != (FORMAT, tag, rank) or dtype >= len(DTYPES) or fetch > flags
            or nrows != len(rows) or window and tag != Tag.WEIGHTS or offset and tag == Tag.WEIGHTS):
        return Garbled(f"a frame header of format {fmt}, tag {wire_tag}, rank {client}, dtype code {dtype}, "
                       f"fetch {fetch}, {nrows} row bytes ({len(rows)} came), window {window}, offset {offset} on tag {tag} "
                       f"for rank {rank}")
    if tag == Tag.WEIGHTS:
        return Weights(version, length, step, bool(fetch & 1), bool(fetch & 2), window, fragment)
    try:
        decoded = json.loads(bytes(rows)) if nrows else []
    except (UnicodeDecodeError, ValueError):
        return Garbled("a push whose rows are not JSON")
    if not isinstance(decoded, list):
        return Garbled("a push whose rows are not a list")
    return Push(step, length, bool(fetch), DTYPES[dtype], rows=tuple(decoded), fragment=fragment, offset=offset)
