"""Datasets for the PyTorch ASGD clients: loading, checking and normalising them.

Fashion-MNIST (the default), a user's ``.npz`` arrays, or an ImageNet-style image
folder all load behind one small ``Split`` interface; which samples a client reads, and
in which order, is `clients/sampling.py`'s.
"""
from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

FASHION_MNIST_CACHE = os.path.expanduser("~/.cache/gpu-asgd/fashion-mnist")
FASHION_MNIST_DIRS: tuple[str, ...] = ("/usr/share/datasets/fashion-mnist", FASHION_MNIST_CACHE)
FASHION_MNIST_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                       "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
IDX_IMAGES, IDX_LABELS = 2051, 2049
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
STD_FLOOR = 1e-8
PIXEL_LIMIT = 1e30  # float pixels beyond it, standardised (down to STD_FLOOR), overflow float32
_CHUNK_ELEMENTS = 1 << 22
# what reading a damaged file raises; zipfile: NotImplementedError for a mangled compression
# method or flag, RuntimeError for a member flagged as encrypted
_READ_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, NotImplementedError, RuntimeError)


class DataError(ValueError):
    """Bad or missing data; one 'data: ...' line the command line can show without a traceback."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


class Split(Protocol):
    """One split of a dataset, read a minibatch at a time so nothing is converted twice."""

    def __len__(self) -> int: ...

    def batch(self, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 images (n, C, H, W), normalised; int64 labels (n,); no augmentation for array data."""

    def labels(self) -> np.ndarray | torch.Tensor | None:
        """Every label, where they are at hand without reading the items (None: they are not)."""


@dataclass(frozen=True)
class Dataset:
    """What a client needs to build its model and train on its shard."""

    name: str
    train: Split
    test: Split
    shape: tuple[int, ...]  # one input's: (C, H, W) for images
    num_classes: int | None  # None: a user's Dataset that does not say (no `classes`)
    files: tuple[Path, ...] = ()  # the files it was read from, whole (what a run fingerprints)


class ArraySplit:
    """A split held as raw arrays; rows are normalised only when batched, keeping uint8 data compact."""

    def __init__(self, x: np.ndarray, y: np.ndarray, scale: float, mean: float, std: float) -> None:
        self.x, self.y = x, y
        self._scale, self._mean, self._std = scale, mean, std

    def __len__(self) -> int:
        return len(self.y)

    def batch(self, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        rows = (self.x[idx] * self._scale - self._mean) / self._std
        return torch.from_numpy(rows.astype(np.float32, copy=False)), torch.from_numpy(self.y[idx])

    def labels(self) -> np.ndarray:
        return self.y


@dataclass(frozen=True)
class FolderSplit:
    """An image-folder split decoded (and, for training, augmented) per batch, since it will not fit in memory."""

    folder: Any

    def __len__(self) -> int:
        return len(self.folder)

    def batch(self, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        items = [self.folder[int(i)] for i in idx]
        return torch.stack([im for im, _ in items]), torch.tensor([lab for _, lab in items], dtype=torch.int64)

    def labels(self) -> np.ndarray:
        return np.asarray(self.folder.targets, dtype=np.int64)  # ImageFolder's, with no target transform


MAX_CLASSES = 100_000  # a larger label is a mistake, not a class: the classifier would not fit in memory

def load_dataset(spec: str, data_dir: str | None = None) -> Dataset:
    """One entry point so the --dataset/--data-dir flags map straight onto a Dataset."""
    from runconfig.settings import is_user_code

    if is_user_code(spec):  # the user's factory of torch Datasets
        from clients.user.code import load_user_data
        return Dataset(spec, *load_user_data(spec))
    if spec == "fashion-mnist":
        return _load_fashion_mnist(data_dir)
    if data_dir:
        raise DataError(f"data_dir: only for --data fashion-mnist (the data is {spec})")
    path = Path(spec).expanduser()
    if spec.endswith(".npz"):
        return _load_npz(path)
    if (path / "train").is_dir() and (path / "val").is_dir():
        return _load_image_folder(path)
    raise DataError(f"data: unknown dataset '{spec}' (expected fashion-mnist, a .npz file, or an image folder "
                    "with train/ and val/)")


def _array_dataset(name: str, train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray],
                   num_classes: int, files: tuple[Path, ...]) -> Dataset:
    """Standardise both splits with train statistics only, so test data never leaks into training."""
    (x, y), (x_test, y_test) = train, test
    scale = _scale(x)
    mean, std = _moments(x)
    mean, std = mean * scale, max(std * scale, STD_FLOOR)
    splits = ArraySplit(x, y, scale, mean, std), ArraySplit(x_test, y_test, _scale(x_test), mean, std)
    return Dataset(name, *splits, (x.shape[1], x.shape[2], x.shape[3]), num_classes, files)


def _scale(x: np.ndarray) -> float:
    return 1.0 / 255.0 if x.dtype == np.uint8 else 1.0


def _moments(x: np.ndarray) -> tuple[float, float]:
    """Mean and std accumulated in float64 over row chunks, so a large uint8 array never gets a float64 copy."""
    step = max(1, _CHUNK_ELEMENTS // max(1, x[0].size))
    chunks = [x[i:i + step] for i in range(0, len(x), step)]
    mean = sum(float(c.sum(dtype=np.float64)) for c in chunks) / x.size
    var = sum(float(np.square(c.astype(np.float64) - mean).sum()) for c in chunks) / x.size
    return mean, var ** 0.5


def _load_fashion_mnist(data_dir: str | None) -> Dataset:
    folder = _find_fashion_mnist(data_dir)
    splits = []
    for images_name, labels_name in (FASHION_MNIST_FILES[:2], FASHION_MNIST_FILES[2:]):
        images = _read_idx(folder / images_name, IDX_IMAGES)
        labels = _read_idx(folder / labels_name, IDX_LABELS)
        if len(images) != len(labels):
            raise DataError(f"data: {folder / labels_name}: {len(labels)} labels but {len(images)} images")
        splits.append((images[:, None], labels.astype(np.int64)))
    return _array_dataset("fashion-mnist", splits[0], splits[1], 10,
                          tuple((folder / name).resolve() for name in FASHION_MNIST_FILES))


def _missing_files(folder: str) -> list[str]:
    return [name for name in FASHION_MNIST_FILES if not os.path.isfile(os.path.join(folder, name))]


def _find_fashion_mnist(data_dir: str | None) -> Path:
    """Search the given dir, then the system and cache dirs; download only as a last resort."""
    if data_dir and _missing_files(data_dir):  # a folder the user named is not looked past
        raise DataError(f"data_dir: {data_dir} lacks {', '.join(_missing_files(data_dir))}; it must hold the "
                        "four Fashion-MNIST *-ubyte.gz files")
    searched = ([data_dir] if data_dir else []) + list(FASHION_MNIST_DIRS)
    for folder in searched:
        if not _missing_files(folder):
            return Path(folder)
    try:
        from torchvision.datasets import FashionMNIST
    except ImportError:
        lacks = f" (--data-dir {data_dir} lacks {', '.join(_missing_files(data_dir))})" if data_dir else ""
        raise DataError(f"data: Fashion-MNIST not found in {', '.join(searched)}{lacks}; install it with "
                        "'apt-get install dataset-fashion-mnist', or pass --data-dir DIR holding the four "
                        "*-ubyte.gz files, or pip install torchvision to download it") from None
    return _download_fashion_mnist(FashionMNIST)


def _download_fashion_mnist(fashion_mnist: Any) -> Path:
    """torchvision keeps the same gz files under FashionMNIST/raw; move them up so later runs need no torchvision."""
    dest = Path(FASHION_MNIST_CACHE)
    try:
        fashion_mnist(root=str(dest), train=True, download=True)
        for name in FASHION_MNIST_FILES:
            shutil.move(dest / "FashionMNIST" / "raw" / name, dest / name)
        shutil.rmtree(dest / "FashionMNIST")
    except (OSError, RuntimeError) as e:
        raise DataError(f"data: downloading Fashion-MNIST into {dest} failed ({e}); install it with "
                        "'apt-get install dataset-fashion-mnist' or pass --data-dir DIR") from e
    return dest


def _read_idx(path: Path, magic: int) -> np.ndarray:
    """Parse one gzipped IDX file of unsigned bytes, refusing anything whose header does not fit its size."""
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read()
    except _READ_ERRORS as e:
        raise DataError(f"data: {path}: not a readable gzip file ({e})") from e
    ndim, header = magic & 0xFF, 4 + 4 * (magic & 0xFF)
    found = int.from_bytes(raw[:4], "big")
    if len(raw) < header or found != magic:
        raise DataError(f"data: {path}: corrupt IDX file (magic number {found}, expected {magic})")
    dims = tuple(int(d) for d in np.frombuffer(raw, ">u4", count=ndim, offset=4))
    body = np.frombuffer(raw, np.uint8, offset=header)
    if body.size != int(np.prod(dims)):
        raise DataError(f"data: {path}: corrupt IDX file (header says {dims}, but {body.size} data bytes follow)")
    return body.reshape(dims)


def _load_npz(path: Path) -> Dataset:
    arrays = _read_npz(path)
    x = _images(arrays, "x", path)
    y = _labels(arrays, "y", len(x), path)
    if ("x_test" in arrays) != ("y_test" in arrays):
        absent = "y_test" if "x_test" in arrays else "x_test"
        raise _field_error(path, absent, "is missing (give both x_test and y_test, or neither)")
    if "x_test" in arrays:
        x_test = _images(arrays, "x_test", path)
        if x_test.shape[1:] != x.shape[1:]:
            raise _field_error(path, "x_test", f"has images of shape {x_test.shape[1:]}, but 'x' has {x.shape[1:]}")
        y_test = _labels(arrays, "y_test", len(x_test), path)
    else:  # the last 10% (at least one sample), the same on every client
        n_test = max(1, len(x) // 10)
        if len(x) <= n_test:
            raise _field_error(path, "x", "has 1 sample; need 2 to hold out a test split, or give x_test")
        x, y, x_test, y_test = x[:-n_test], y[:-n_test], x[-n_test:], y[-n_test:]
    declared = _declared_classes(arrays, path)
    for key, labels in (("y", y), ("y_test", y_test)):
        if declared is not None and labels.max() >= declared:
            raise _field_error(path, key, f"has the label {labels.max()}, outside the {declared} classes "
                                          f"'num_classes' declares (labels 0..{declared - 1})")
    num_classes = declared or int(max(y.max(), y_test.max())) + 1
    if num_classes > MAX_CLASSES:
        raise _field_error(path, "y", f"has the label {num_classes - 1}: labels are class indices 0..C-1, "
                                      f"C at most {MAX_CLASSES:,} (remap them)")
    return _array_dataset(path.stem, (x, y), (x_test, y_test), num_classes, (path.resolve(),))


def _declared_classes(arrays: dict[str, np.ndarray], path: Path) -> int | None:
    """The file's `num_classes`, where it has one: without it the class count is the
    largest label + 1, so a label one too large would silently grow the model's outputs."""
    declared = arrays.get("num_classes")
    if declared is None:
        return None
    if declared.dtype.kind not in "iu" or declared.size != 1 or declared.ndim > 1:
        raise _field_error(path, "num_classes", f"is {declared.dtype} of shape {declared.shape}; expected one "
                                                "integer (np.savez(..., num_classes=10))")
    value = int(declared.reshape(()))
    if not 1 <= value <= MAX_CLASSES:
        raise _field_error(path, "num_classes", f"is {value}; expected 1 to {MAX_CLASSES:,}")
    return value


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    """Read the known fields eagerly, so the file closes and a bad field is reported by name."""
    if not path.is_file():
        raise DataError(f"data: {path}: no such file")
    if not zipfile.is_zipfile(path):
        raise DataError(f"data: {path}: not a .npz (zip) archive; write it with np.savez")
    arrays = {}
    with contextlib.ExitStack() as files:  # np.load leaves a file it opened open when the archive is corrupt
        try:
            npz = files.enter_context(np.load(files.enter_context(open(path, "rb")), allow_pickle=False))
        except _READ_ERRORS as e:
            raise DataError(f"data: {path}: not a readable .npz file ({e})") from e
        for key in ("x", "y", "x_test", "y_test", "num_classes"):
            try:
                if key in npz.files:
                    arrays[key] = npz[key]
            except _READ_ERRORS as e:
                raise _field_error(path, key, f"cannot be read ({e})") from e
            if key in arrays and not isinstance(arrays[key], np.ndarray):  # np.load hands other members as bytes
                raise _field_error(path, key, "is not a .npy array; write the file with np.savez")
    return arrays


def _field_error(path: Path, key: str, reason: str) -> DataError:
    return DataError(f"data: {path}: field '{key}' {reason}")


def _images(arrays: dict[str, np.ndarray], key: str, path: Path) -> np.ndarray:
    """Accept (N, H, W) or (N, C, H, W) finite numbers; grey-scale (N, H, W) gains a channel axis."""
    x = arrays.get(key)
    if x is None:
        raise _field_error(path, key, "is missing")
    if x.dtype.kind not in "iuf":
        raise _field_error(path, key, f"has dtype {x.dtype}; expected integer or float pixels")
    if x.ndim not in (3, 4):
        raise _field_error(path, key, f"has shape {x.shape}; expected (N, H, W) or (N, C, H, W)")
    if x.size == 0:
        raise _field_error(path, key, f"is empty (shape {x.shape})")
    if x.dtype.kind == "f" and not np.isfinite(x).all():
        raise _field_error(path, key, "contains NaN or infinite values")
    if x.dtype.kind == "f" and float(np.abs(x).max()) > PIXEL_LIMIT:
        raise _field_error(path, key, f"has values beyond ±{PIXEL_LIMIT:g}, too large to standardise in float32")
    if x.dtype == np.float16:  # standardised in float16, the std floor rounds to 0 (NaN) and 65504 overflows
        x = x.astype(np.float32)
    return x[:, None] if x.ndim == 3 else x


def _labels(arrays: dict[str, np.ndarray], key: str, n: int, path: Path) -> np.ndarray:
    y = arrays.get(key)
    if y is None:
        raise _field_error(path, key, "is missing")
    if y.dtype.kind not in "iu":
        raise _field_error(path, key, f"has dtype {y.dtype}; expected integer class labels")
    if y.ndim != 1:
        raise _field_error(path, key, f"has shape {y.shape}; expected (N,)")
    if len(y) != n:
        raise _field_error(path, key, f"has {len(y)} labels but '{'x' + key[1:]}' has {n} samples")
    if y.min() < 0:
        raise _field_error(path, key, f"has a negative label ({y.min()})")
    if y.max() > np.iinfo(np.int64).max:  # uint64 labels would wrap to negative ones
        raise _field_error(path, key, f"has a label too large for int64 ({y.max()})")
    return y.astype(np.int64)


def _load_image_folder(root: Path) -> Dataset:
    try:
        from torchvision import datasets, transforms as T
    except ImportError:
        raise DataError(f"data: image folder {root} needs torchvision; pip install torchvision") from None
    tensor = [T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    train_tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), *tensor])
    test_tf = T.Compose([T.Resize(256), T.CenterCrop(224), *tensor])
    try:
        train = datasets.ImageFolder(str(root / "train"), train_tf)
        test = datasets.ImageFolder(str(root / "val"), test_tf)
    except (OSError, RuntimeError) as e:
        raise DataError(f"data: image folder {root}: {e}") from e
    if test.classes != train.classes:
        raise DataError(f"data: image folder {root}: val/ has different class folders from train/")
    return Dataset(root.name, FolderSplit(train), FolderSplit(test), (3, 224, 224), len(train.classes))
