"""Tests for clients.data: dataset loading and its one-line errors."""
from __future__ import annotations

import gzip
import os
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from clients import data
from clients.data import FASHION_MNIST_FILES, DataError, load_dataset


def _assert_one_line(err: pytest.ExceptionInfo, *parts: str) -> None:
    message = str(err.value)
    assert message.startswith(("data: ", "data_dir: ")) and "\n" not in message
    for part in parts:
        assert part in message


def _write_idx(path: Path, magic: int, array: np.ndarray) -> None:
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def _write_fashion(folder: Path, n_train: int = 20, n_test: int = 10) -> None:
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        _write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", 2051, rng.integers(0, 256, (n, 28, 28)))
        _write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", 2049, rng.integers(0, 10, n))


def _standardised(x: np.ndarray, train: np.ndarray, scale: float) -> np.ndarray:
    """Reference normalisation: one scalar mean and std of the scaled train split."""
    train = train.astype(np.float64) * scale
    return (x.astype(np.float64) * scale - train.mean()) / train.std()


@pytest.fixture
def no_fashion_mnist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hide the system copy, the cache and torchvision, whatever this machine has."""
    monkeypatch.setattr(data, "FASHION_MNIST_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(data, "FASHION_MNIST_DIRS", (str(tmp_path / "system"), str(tmp_path / "cache")))
    monkeypatch.setitem(sys.modules, "torchvision", None)


@pytest.fixture(scope="module")
def fashion() -> data.Dataset:
    if not any(all(os.path.isfile(os.path.join(d, f)) for f in FASHION_MNIST_FILES) for d in data.FASHION_MNIST_DIRS):
        pytest.skip("Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)")
    return load_dataset("fashion-mnist")


def test_installed_fashion_mnist_parses(fashion: data.Dataset) -> None:
    assert (fashion.name, len(fashion.train), len(fashion.test)) == ("fashion-mnist", 60000, 10000)
    assert fashion.shape == (1, 28, 28) and fashion.num_classes == 10
    x, y = fashion.train.batch(np.random.default_rng(0).choice(60000, 3000, replace=False))
    assert x.dtype == torch.float32 and x.shape == (3000, 1, 28, 28)
    assert y.dtype == torch.int64 and y.shape == (3000,) and y.min() >= 0 and y.max() <= 9
    assert abs(x.mean().item()) < 0.05 and abs(x.std().item() - 1) < 0.05
    x_test, y_test = fashion.test.batch(np.arange(7))
    assert x_test.shape == (7, 1, 28, 28) and y_test.dtype == torch.int64


def test_fashion_mnist_from_data_dir_is_standardised_with_train_stats(tmp_path: Path) -> None:
    _write_fashion(tmp_path)
    ds = load_dataset("fashion-mnist", str(tmp_path))
    assert (len(ds.train), len(ds.test), ds.shape, ds.num_classes) == (20, 10, (1, 28, 28), 10)
    with gzip.open(tmp_path / FASHION_MNIST_FILES[0]) as f:
        train = np.frombuffer(f.read(), np.uint8, offset=16).reshape(20, 1, 28, 28)
    with gzip.open(tmp_path / FASHION_MNIST_FILES[2]) as f:
        test = np.frombuffer(f.read(), np.uint8, offset=16).reshape(10, 1, 28, 28)
    idx = np.array([3, 0, 7])
    np.testing.assert_allclose(ds.train.batch(idx)[0].numpy(), _standardised(train[idx], train, 1 / 255), atol=1e-5)
    np.testing.assert_allclose(ds.test.batch(idx)[0].numpy(), _standardised(test[idx], train, 1 / 255), atol=1e-5)


@pytest.mark.parametrize("header, name", [
    ((2049, 20, 28, 28), "train-images-idx3-ubyte.gz"),   # wrong magic number
    ((2051, 21, 28, 28), "train-images-idx3-ubyte.gz"),   # header promises more bytes than follow
])
def test_corrupt_idx_names_the_file(tmp_path: Path, header: tuple[int, ...], name: str) -> None:
    _write_fashion(tmp_path)
    raw = b"".join(d.to_bytes(4, "big") for d in header) + bytes(20 * 28 * 28)
    with gzip.open(tmp_path / name, "wb") as f:
        f.write(raw)
    with pytest.raises(DataError) as err:
        load_dataset("fashion-mnist", str(tmp_path))
    _assert_one_line(err, name, "corrupt IDX")


def test_not_gzip_and_count_mismatch_name_the_file(tmp_path: Path) -> None:
    _write_fashion(tmp_path)
    (tmp_path / FASHION_MNIST_FILES[3]).write_bytes(b"not gzip at all")
    with pytest.raises(DataError) as err:
        load_dataset("fashion-mnist", str(tmp_path))
    _assert_one_line(err, FASHION_MNIST_FILES[3])
    _write_idx(tmp_path / FASHION_MNIST_FILES[3], 2049, np.zeros(9))
    with pytest.raises(DataError) as err:
        load_dataset("fashion-mnist", str(tmp_path))
    _assert_one_line(err, FASHION_MNIST_FILES[3], "9 labels but 10 images")


@pytest.mark.usefixtures("no_fashion_mnist")
def test_missing_fashion_mnist_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(DataError) as err:
        load_dataset("fashion-mnist")
    _assert_one_line(err, "Fashion-MNIST not found", str(tmp_path / "system"),
                     "apt-get install dataset-fashion-mnist", "--data-dir", "pip install torchvision")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError) as err:  # a folder the user named is not looked past
        load_dataset("fashion-mnist", str(empty))
    _assert_one_line(err, f"data_dir: {empty} lacks", FASHION_MNIST_FILES[0])


@pytest.mark.usefixtures("no_fashion_mnist")
def test_download_with_torchvision_lands_in_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    roots = []

    def fake_fashion_mnist(root: str, train: bool, download: bool) -> None:
        roots.append(root)
        _write_fashion(Path(root) / "FashionMNIST" / "raw")

    datasets = types.SimpleNamespace(FashionMNIST=fake_fashion_mnist)
    monkeypatch.setitem(sys.modules, "torchvision", types.SimpleNamespace(datasets=datasets))
    monkeypatch.setitem(sys.modules, "torchvision.datasets", datasets)
    assert len(load_dataset("fashion-mnist").train) == 20
    assert len(load_dataset("fashion-mnist").test) == 10
    assert roots == [str(tmp_path / "cache")]
    assert sorted(os.listdir(tmp_path / "cache")) == sorted(FASHION_MNIST_FILES)


def _labels(n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, 4, n)


@pytest.mark.parametrize("shape, dtype", [((30, 5, 6), np.uint8), ((30, 3, 5, 6), np.float32),
                                          ((30, 5, 6), np.float64), ((30, 3, 5, 6), np.uint8)])
@pytest.mark.parametrize("with_test", [False, True])
def test_npz_loads_and_normalises(tmp_path: Path, shape: tuple[int, ...], dtype: type, with_test: bool) -> None:
    rng = np.random.default_rng(1)
    x = (rng.integers(0, 256, shape) if dtype == np.uint8 else rng.normal(3.0, 2.0, shape)).astype(dtype)
    y = _labels(30, rng)
    fields = {"x": x, "y": y}
    if with_test:
        fields.update(x_test=x[:7] + 1, y_test=np.full(7, 9))
    np.savez(tmp_path / "toy.npz", **fields)
    ds = load_dataset(str(tmp_path / "toy.npz"))
    grid = x.reshape(30, -1, 5, 6)
    train_x, test_x, test_y = (grid, grid[:7] + 1, np.full(7, 9)) if with_test else (grid[:27], grid[27:], y[27:])
    assert (ds.name, ds.shape, len(ds.train), len(ds.test)) == ("toy", grid.shape[1:], len(train_x), len(test_x))
    assert ds.num_classes == (10 if with_test else int(y.max()) + 1)
    scale = 1 / 255 if dtype == np.uint8 else 1.0
    images, labels = ds.test.batch(np.arange(len(test_x)))
    assert images.dtype == torch.float32 and labels.dtype == torch.int64
    np.testing.assert_allclose(images.numpy(), _standardised(test_x, train_x, scale), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(labels.numpy(), test_y)
    np.testing.assert_array_equal(ds.train.batch(np.array([4, 1]))[1].numpy(), y[[4, 1]])


def test_npz_holds_out_at_least_one_sample(tmp_path: Path) -> None:
    np.savez(tmp_path / "five.npz", x=np.zeros((5, 2, 2), np.uint8), y=np.arange(5))
    ds = load_dataset(str(tmp_path / "five.npz"))
    assert (len(ds.train), len(ds.test)) == (4, 1)
    assert ds.test.batch(np.array([0]))[1].tolist() == [4]


_X, _Y = np.zeros((10, 4, 4), np.uint8), np.arange(10) % 3
_BAD_NPZ = {
    "x missing": ({"y": _Y}, "'x'"),
    "y missing": ({"x": _X}, "'y'"),
    "x wrong ndim": ({"x": _X.reshape(10, 16), "y": _Y}, "'x'"),
    "x not numeric": ({"x": _X.astype(str), "y": _Y}, "'x'"),
    "x object array": ({"x": np.array([1, "a"], dtype=object), "y": _Y[:2]}, "'x'"),
    "x not finite": ({"x": np.full((10, 4, 4), np.nan), "y": _Y}, "'x'"),
    "y not integer": ({"x": _X, "y": _Y.astype(float)}, "'y'"),
    "y wrong ndim": ({"x": _X, "y": _Y.reshape(10, 1)}, "'y'"),
    "y negative": ({"x": _X, "y": _Y - 1}, "'y'"),
    "length mismatch": ({"x": _X, "y": _Y[:9]}, "'y'"),
    "N == 0": ({"x": _X[:0], "y": _Y[:0]}, "'x'"),
    "one sample, no test": ({"x": _X[:1], "y": _Y[:1]}, "'x'"),
    "x_test shape": ({"x": _X, "y": _Y, "x_test": np.zeros((2, 5, 4)), "y_test": _Y[:2]}, "'x_test'"),
    "y_test length": ({"x": _X, "y": _Y, "x_test": _X[:2], "y_test": _Y[:3]}, "'y_test'"),
    "only x_test": ({"x": _X, "y": _Y, "x_test": _X[:2]}, "'y_test'"),
    "only y_test": ({"x": _X, "y": _Y, "y_test": _Y[:2]}, "'x_test'"),
}


@pytest.mark.parametrize("case", _BAD_NPZ)
def test_bad_npz_field_is_named(tmp_path: Path, case: str) -> None:
    fields, field = _BAD_NPZ[case]
    np.savez(tmp_path / "bad.npz", **fields)
    with pytest.raises(DataError) as err:
        load_dataset(str(tmp_path / "bad.npz"))
    _assert_one_line(err, str(tmp_path / "bad.npz"), field)


def test_unreadable_npz_files_are_named(tmp_path: Path) -> None:
    (tmp_path / "text.npz").write_text("not an archive\n")
    np.save(tmp_path / "bare.npy", _X)
    (tmp_path / "bare.npy").rename(tmp_path / "bare.npz")
    for name in ("absent.npz", "text.npz", "bare.npz"):
        with pytest.raises(DataError) as err:
            load_dataset(str(tmp_path / name))
        _assert_one_line(err, str(tmp_path / name))


def test_unknown_spec_and_image_folder_without_torchvision(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(DataError) as err:
        load_dataset("cifar-11")
    _assert_one_line(err, "unknown dataset 'cifar-11'")
    (tmp_path / "train").mkdir()
    (tmp_path / "val").mkdir()
    monkeypatch.setitem(sys.modules, "torchvision", None)
    with pytest.raises(DataError) as err:
        load_dataset(str(tmp_path))
    _assert_one_line(err, "pip install torchvision")
