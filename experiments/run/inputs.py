"""What a run reads, recorded so that its record never names other inputs than it used.

Two things, both checked before MPI starts:
- `absolute_paths`: every file or folder a config names (data, data_dir, init, replay, sim_calibrate,
  a `file.py:name` of user code) as an absolute path, and a `module:name` of user code
  with the folder it is found in, so config.json names the files themselves and every
  rank, an export or a resume started in another folder reads the same ones;
- `fingerprint`: what the data was, in config.json's `data_fingerprint`: for data read
  from files whole (a .npz, Fashion-MNIST's four files) each file's absolute path, size
  and SHA-256, with the Debian package that installed them where one did; for a user's
  Datasets or an image folder the lengths of both splits and the SHA-256 of a bounded,
  evenly spread sample of items (`SAMPLE` of each split, drawn under a fixed torch seed
  so a random augmentation draws alike). `check_fingerprint` refuses a resume, in one
  line, whose data is not what the run recorded.
"""
from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from typing import Any

from runconfig.settings import USER_CODE, USER_CODE_KEYS, ConfigError, is_user_code

SAMPLE = 32  # items of each split hashed for data that is not read from files whole
PACKAGE = "dataset-fashion-mnist"  # the Debian package of the system's Fashion-MNIST
PATH_KEYS = ("data_dir", "init", "replay", "sim_calibrate")  # settings that are always a path when given


def absolute_paths(values: dict[str, Any]) -> dict[str, Any]:
    """`values` with every path in it absolute (against the current folder) and user code
    named as it travels (`_travelling`); names (fashion-mnist, cnn) and values of the wrong
    type stay as given."""
    out = dict(values)
    for key in PATH_KEYS:
        if isinstance(out.get(key), str) and out[key]:
            out[key] = _absolute(out[key])
    for key in USER_CODE_KEYS:
        value = out.get(key)
        if not isinstance(value, str) or not value:
            continue
        if is_user_code(value):
            out[key] = _travelling(value)
        elif key == "data" and (value.endswith(".npz") or Path(_absolute(value)).is_dir()):
            out[key] = _absolute(value)
    return out


def _travelling(spec: str) -> str:
    """User code named so that it imports from any folder: a file by its absolute path, a
    module with the (absolute) folder it is found in; a malformed spec as given, for the
    config to refuse."""
    parts = USER_CODE.fullmatch(spec)
    if parts is None:
        return spec
    if parts["file"]:
        return f"{_absolute(parts['file'])}:{parts['name']}"
    if parts["folder"]:
        return f"{_absolute(parts['folder'])}:{parts['module']}:{parts['name']}"
    from clients.user.code import module_spec
    return module_spec(parts["module"], parts["name"])


def _absolute(text: str) -> str:
    """The path, from `~` or the current folder; as given where it cannot be one (a NUL
    in it, an unknown user's home): the check that reads it refuses it by name."""
    try:
        return str(Path(text).expanduser().resolve())
    except (RuntimeError, ValueError, OSError):
        return text


def fingerprint(dataset: Any) -> dict[str, Any]:
    """What `dataset` (a clients.data.Dataset) is, as config.json records it."""
    if dataset.files:
        files = {"files": [_file_print(path) for path in dataset.files]}
        package = _package(dataset.files[0]) if dataset.name == "fashion-mnist" else None
        return files | {"package": package} if package else files
    return {"train": len(dataset.train), "test": len(dataset.test),
            "sample_sha256": _sample_hash(dataset)}


def check_fingerprint(recorded: Any, dataset: Any) -> None:
    """Refuse (ConfigError, one line) data other than the run recorded. A run recorded
    before fingerprints were kept has none to check."""
    if recorded is None:
        return
    now = fingerprint(dataset)
    if _essence(recorded) != _essence(now):
        where = ", ".join(entry["path"] for entry in now.get("files", [])) or "the data"
        raise ConfigError(f"data: {where} differs from what the run trained on ({_said(recorded)} then, "
                          f"{_said(now)} now); restore it, or start a new run")


def _essence(record: Any) -> Any:
    """What must be equal: each file's size and hash, or the lengths and the sample's hash
    (not where the files are, nor how they were installed); None for a damaged record."""
    try:
        if "files" in record:
            return [(entry["size"], entry["sha256"]) for entry in record["files"]]
        return record["train"], record["test"], record["sample_sha256"]
    except (TypeError, KeyError):
        return None


def _said(record: Any) -> str:
    essence = _essence(record)
    if essence is None:
        return "a damaged fingerprint"
    if isinstance(essence, list):
        return "; ".join(f"{size} bytes, sha256 {str(digest)[:12]}" for size, digest in essence)
    return f"{essence[0]} training and {essence[1]} test items, sampled sha256 {str(essence[2])[:12]}"


def _file_print(path: Path) -> dict[str, Any]:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return {"path": str(path), "size": path.stat().st_size, "sha256": digest.hexdigest()}


def _package(path: Path) -> str | None:
    """'dataset-fashion-mnist VERSION' when Debian's package installed the file, else None."""
    try:
        owner = subprocess.run(["dpkg-query", "-S", str(path)], capture_output=True, text=True, timeout=30)
        if owner.returncode != 0 or not owner.stdout.startswith(f"{PACKAGE}:"):
            return None
        version = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", PACKAGE], capture_output=True,
                                 text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return f"{PACKAGE} {version.stdout.strip()}" if version.returncode == 0 else None


def _sample_hash(dataset: Any) -> str:
    """SHA-256 of SAMPLE items of each split, evenly spread, read under a fixed seed."""
    import numpy as np
    import torch

    digest = hashlib.sha256()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for split in (dataset.train, dataset.test):
            idx = np.unique(np.linspace(0, len(split) - 1, min(SAMPLE, len(split))).astype(np.int64))
            for tensor in split.batch(idx):
                digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()
