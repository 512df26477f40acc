"""The run directory: append-only JSONL logs, atomic JSON, text and checkpoint files.

Rows are flushed to the OS as they are written (the server's: at least every 0.1 s and
before each checkpoint), so a crashed process loses at most the rows of its last moment,
which no checkpoint accounts for. Whole files (summary, config, checkpoint) are written to a
temporary name, fsynced and renamed, so a reader sees the old file or the new one,
never half of one. Checkpoints are `.npz` files of plain arrays: `np.load` reads them
with `allow_pickle=False`.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import sys
import time
import zipfile
import zlib
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np


class JsonlWriter:
    """One JSON object a line. `flush_every`: seconds rows may wait in memory before they
    go to the OS (0: each row at once); `flush()` sends them now."""

    def __init__(self, path: Path, lines: int = 0, tap: Callable[[list[dict[str, Any]]], None] | None = None,
                 flush_every: float = 0.0):
        self.path, self.tap, self.flush_every = Path(path), tap, flush_every
        self._file = open(self.path, "a", encoding="utf-8", buffering=1 << 20)
        self._flushed = time.monotonic()
        self.lines = lines  # rows in the file; a checkpoint records it to cut the log back on resume

    def write(self, row: dict[str, Any]) -> None:
        self.write_many([row])

    def write_many(self, rows: list[dict[str, Any]]) -> None:
        self.write_json("".join(_ROW.encode(r) + "\n" for r in rows), rows)

    def write_json(self, text: str, rows: list[dict[str, Any]]) -> None:
        """`rows`, already written as JSON lines in `text` (the server's hot path formats
        its own)."""
        try:  # not `naming`: a context manager costs more than the write, on every push
            self._file.write(text)
        except OSError as error:
            raise named(error, self.path) from None
        if time.monotonic() - self._flushed >= self.flush_every:
            self.flush()
        self.lines += len(rows)
        if self.tap is not None:
            self.tap(rows)

    def flush(self) -> None:
        with naming(self.path):
            self._file.flush()
        self._flushed = time.monotonic()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "JsonlWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextlib.contextmanager
def naming(path: Path) -> Iterator[None]:
    """An OS error while writing `path` (a full disk, a quota) says which file it hit."""
    try:
        yield
    except OSError as error:
        raise named(error, path) from None


def named(error: OSError, path: Path) -> OSError:
    """`error`, saying which file it hit if it does not."""
    if error.filename is not None:
        return error
    return OSError(error.errno, f"{error.strerror or error}: writing {path}", str(path))


def _plain(value: Any) -> Any:
    """numpy scalars in rows become plain numbers."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot write {type(value).__name__} to a log row")


# One encoder for every row: json.dumps with `default` makes one a call (0.7 us of a
# push's clients.jsonl row).
_ROW = json.JSONEncoder(default=_plain)


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Rows of a JSONL log; a torn last line (a kill mid-write) is skipped with a warning."""
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    for i, line in enumerate(lines):
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            if i != len(lines) - 1:
                raise ValueError(f"{path}: line {i + 1} is not JSON") from None
            print(f"warning: {path}: skipping a torn last line", file=sys.stderr)


def truncate_jsonl(path: Path, lines: int) -> None:
    """Keep the first `lines` rows of a log (atomically): what a checkpoint accounted for."""
    path = Path(path)
    kept = path.read_text(encoding="utf-8").splitlines(keepends=True)[:lines] if path.exists() else []
    _replace_atomically(path, lambda f: f.write("".join(kept).encode()))


def _replace_atomically(path: Path, write, mode: int = 0o666) -> None:
    """Every writer makes its folder: a first write into `results/` must not fail at the end
    of minutes of measurements. `mode`: the new file's permissions (less the umask), set
    as it is made, so a secret is never readable by others, not even for a moment."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with naming(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "wb") as f:
            if mode != 0o666:
                os.fchmod(f.fileno(), mode)  # a file left by a writer that died keeps its mode: not before writing
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def write_json_atomic(path: Path, obj: Any, private: bool = False) -> None:
    """`private`: readable and writable by the owner alone (a run's door, with its secret)."""
    text = json.dumps(_finite(obj), indent=2, default=_plain) + "\n"
    _replace_atomically(path, lambda f: f.write(text.encode("utf-8")), 0o600 if private else 0o666)


def write_text_atomic(path: Path, text: str) -> None:
    """A whole text file (a generated Markdown page), old or new, never half of one."""
    _replace_atomically(path, lambda f: f.write(text.encode("utf-8")))


def _finite(obj: Any) -> Any:
    """NaN/Inf become null: strict JSON readers (notebooks, jq) reject them."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


class CorruptFile(ValueError):
    """A checkpoint or snapshot that cannot be trusted; one line naming the file."""


def _checksum(arrays: dict[str, np.ndarray]) -> str:
    digest = hashlib.sha256()
    for key in sorted(k for k in arrays if k != "checksum"):
        value = np.ascontiguousarray(arrays[key])
        digest.update(f"{key}:{value.dtype.str}:{value.shape};".encode())
        digest.update(value.tobytes())
    return digest.hexdigest()


def save_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """An atomic `.npz` of plain arrays (a checkpoint or a snapshot), with a SHA-256 of
    their contents so a damaged file is refused instead of trained on."""
    arrays = {**arrays, "checksum": np.array(_checksum(arrays))}
    _replace_atomically(path, lambda f: np.savez(f, **arrays))


def _npz(file) -> np.lib.npyio.NpzFile:
    """np.load of an archive; a lone array (np.save's .npy) is no checkpoint (ValueError)."""
    loaded = np.load(file, allow_pickle=False)
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise ValueError("a single .npy array, not a .npz archive of named arrays")
    return loaded


def load_arrays(path: Path, checksummed: bool = False) -> dict[str, np.ndarray]:
    """The arrays of a `.npz`, checked against its checksum when it has one; `checksummed`:
    it must have one (a file this tool wrote; a user's own file for --init may not)."""
    try:
        with open(path, "rb") as file, _npz(file) as data:  # np.load leaks a file it opened on a bad archive
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error,
            NotImplementedError, RuntimeError) as error:  # zipfile: a mangled compression method or flag
        raise CorruptFile(f"{path}: unreadable ({error})") from None
    odd = sorted(k for k, v in arrays.items() if not isinstance(v, np.ndarray))  # np.load hands those as bytes
    if odd:
        raise CorruptFile(f"{path}: member {odd[0]!r} is not a .npy array")
    stored = arrays.pop("checksum", None)
    if stored is None and checksummed:
        raise CorruptFile(f"{path}: no checksum: not a file this tool wrote whole")
    if stored is not None and str(stored) != _checksum(arrays):
        raise CorruptFile(f"{path}: checksum mismatch: the file is corrupt")
    return arrays
