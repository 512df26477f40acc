"""The hot path's wire format (paramserver/wire/frame.py): what a header says comes back, and
anything else is `Garbled`, never an exception and never a header it did not say."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from paramserver.wire import frame
from paramserver.wire.frame import HEADER_BYTES, Garbled
from paramserver.wire.protocol import Push, Tag, Weights

PUSH = Push(12, 4, True, "bfloat16", rows=({"client": 3, "step": 12, "loss": 0.25, "tag": "x", "ok": None},))


def encoded(tag: int, header, rank: int) -> tuple[np.ndarray, bytes]:
    head = np.zeros(HEADER_BYTES, np.uint8)
    rows = frame.rows_bytes(header) if isinstance(header, Push) else b""
    frame.write_header(head, tag, header, rank, rows)
    return head, rows


@pytest.mark.parametrize("tag, header", [(Tag.PUSH, PUSH), (Tag.PUSH, Push(0, 0, False)),
                                         (Tag.WEIGHTS, Weights(2**40, 10**9)),
                                         (Tag.WEIGHTS, Weights(3, 10, 640, window=2**32 - 1)),
                                         (Tag.PUSH, Push(8, 5, True, fragment=3, offset=2**40)),
                                         (Tag.WEIGHTS, Weights(4, 5, fragment=3))])
def test_a_header_reads_back_as_it_was_written(tag, header):
    head, rows = encoded(tag, header, rank=5)
    assert frame.decode(tag, head, rows, 5) == header
    assert frame.rows_length(head) == len(rows)


def test_every_single_bit_flip_of_the_header_fields_is_garbled():
    head, rows = encoded(Tag.PUSH, PUSH, rank=1)
    for byte in range(frame._FIELDS.size + frame._CRC.size):  # the fields and their CRC; the padding is unread
        for bit in range(8):
            damaged = head.copy()
            damaged[byte] ^= 1 << bit
            assert isinstance(frame.decode(Tag.PUSH, damaged, rows, 1), Garbled), (byte, bit)


@pytest.mark.parametrize("tag, rank, rows", [(Tag.WEIGHTS, 1, None), (Tag.PUSH, 2, None), (Tag.PUSH, 1, b"[1]")],
                         ids=["another tag", "another sender", "other rows"])
def test_a_header_read_on_the_wrong_tag_from_the_wrong_rank_or_with_other_rows_is_garbled(tag, rank, rows):
    head, good_rows = encoded(Tag.PUSH, PUSH, rank=1)
    assert isinstance(frame.decode(tag, head, good_rows if rows is None else rows, rank), Garbled)


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=0, max_size=200), st.sampled_from([Tag.PUSH, Tag.WEIGHTS]))
def test_random_bytes_are_garbled_without_raising(data, tag):
    block = np.frombuffer(data, np.uint8)
    head, rows = block[:HEADER_BYTES], block[HEADER_BYTES:]
    assert isinstance(frame.decode(tag, head, rows, 0), Garbled)


def test_a_vector_from_empty_has_room_around_it_and_its_views_find_it():
    vector = frame.empty(10)
    as_bytes = vector.view(np.uint8)
    block = frame.around(as_bytes, 100)
    assert block is not None and block.nbytes == HEADER_BYTES + 40 + 100
    assert block[HEADER_BYTES:HEADER_BYTES + 40].__array_interface__ == as_bytes.__array_interface__
    assert frame.around(torch.from_numpy(vector).numpy().view(np.uint8), 0) is not None  # the server's weights
    assert frame.around(as_bytes, frame.ROWS_ROOM + 1) is None  # rows beyond the room: no block
    assert frame.around(vector[1:].view(np.uint8), 0) is None  # a view that starts elsewhere
    assert frame.around(vector[:5].view(np.uint8), 0) is not None  # a leading slice (a shard's)...
    assert frame.around(vector[:5].view(np.uint8), 1) is None  # ...but rows would overwrite the next
    assert frame.around(np.empty(10, np.float32).view(np.uint8), 0) is None


def test_a_reply_says_stop_and_asks_for_the_optimizer_state_in_its_header():
    import numpy as np

    from paramserver.wire import frame
    from paramserver.wire.protocol import Push, Tag, Weights

    head = np.zeros(frame.HEADER_BYTES, np.uint8)
    for stop in (False, True):
        for state in (False, True):
            frame.write_header(head, Tag.WEIGHTS, Weights(7, 10, 640, stop, state), rank=0)
            assert frame.decode(Tag.WEIGHTS, head, b"", rank=0) == Weights(7, 10, 640, stop, state)
    frame.write_header(head, Tag.PUSH, Push(3, 10, True), rank=1)
    head[7] = 3  # a push's fetch byte holds one flag only
    crc = frame._FIELDS.size
    head[crc:crc + 4] = np.frombuffer(frame._CRC.pack(frame.zlib.crc32(head[:crc])), np.uint8)
    assert "fetch 3" in frame.decode(Tag.PUSH, head, b"", rank=1).why


def test_a_push_that_carries_a_window_is_garbled():
    """Only a reply says a window (DyLU's, the server's to give)."""
    head, rows = encoded(Tag.PUSH, PUSH, rank=1)
    window = frame._FIELDS.size - 4
    head[window:window + 4] = np.frombuffer(np.uint32(3).tobytes(), np.uint8)
    crc = frame._FIELDS.size
    head[crc:crc + 4] = np.frombuffer(frame._CRC.pack(frame.zlib.crc32(head[:crc])), np.uint8)
    assert "window 3" in frame.decode(Tag.PUSH, head, rows, rank=1).why


def test_the_frames_table_forgets_freed_vectors_without_a_callback():
    """Freed vectors leave no Python callback to run (a SIGTERM's KeyboardInterrupt raised
    in one was lost) and the table stays bounded; a live vector keeps its room."""
    import numpy as np

    from paramserver.wire import frame

    live = frame.empty(10)
    for _ in range(5000):
        frame.empty(100)  # freed at once
    assert len(frame._FRAMES) <= 2 * frame._PRUNE_AT[0]
    assert frame.around(live.view(np.uint8), 0) is not None
    assert frame.around(np.zeros(10, np.float32).view(np.uint8), 0) is None


def test_an_address_is_where_the_arrays_bytes_start_whatever_the_array():
    """Read through ctypes where it can, numpy's way where it cannot (read-only, empty,
    strided): the same number either way, which the frames' lookup depends on."""
    vector = frame.empty(8)
    read_only = np.frombuffer(b"abcd", np.uint8)
    for array in (vector, vector.view(np.uint8), vector[2:], read_only, np.empty(0, np.float32),
                  np.arange(8.0)[::2], torch.zeros(4).numpy()):
        assert frame.address(array) == array.__array_interface__["data"][0]
    assert frame.around(vector.view(np.uint8), 0) is not None  # found by its address
