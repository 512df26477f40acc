"""Your model, data, loss, metric and optimizer: importable callables named in the config,
checked before launch.

    --model     package.module:factory   (or path/to/file.py:factory) -> an nn.Module
    --data      package.module:factory   -> (train, test), two map-style torch Datasets
    --loss      package.module:function  -> loss(outputs, targets), a scalar tensor
    --metric    package.module:function  -> metric(outputs, targets) of a test batch, a number
    --optimizer package.module:factory   -> factory(params, lr=, ...), a torch Optimizer

A run records a module with the folder it was found in (`FOLDER:package.module:factory`,
`module_spec`) and a file by its absolute path (experiments/run/inputs.py, for every key of
`USER_CODE_KEYS`), so every rank, `asgd export` and `--resume` import the same code from
whatever folder they are started in; the Python API records a callable so (`spec_of`).

A model factory is called as `factory(input_shape, num_classes, **model_args)` when it
takes two arguments (with the run's `model_args` as keywords), else as
`factory(**model_args)`, after `torch.manual_seed(seed)`, so every rank builds the same
initial weights. A data factory is called with no arguments; each client reads a
disjoint seeded shard of its train Dataset (`TorchSplit` puts any map-style Dataset behind
the `Split.batch(idx)` protocol, so `ShardSampler` orders and resumes it as any other).
`clients/user/check.py` imports the three, checks what they return and runs one sample forward
and through the loss, so a mistake is one `ConfigError` line before any MPI process starts.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import json
import os
import site
import sys
import sysconfig
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset as TorchDataset, IterableDataset, TensorDataset, default_collate

from runconfig.settings import USER_CODE, ConfigError, is_user_code

_FILE_MODULES = "_asgd_user."          # sys.modules keys of files imported by path
_REGISTERED: dict[str, Callable] = {}  # spec -> callable, for the Python API (no re-import in this process)
importing: list[str] = []              # files being imported by spec: experiments.api refuses to train then


def spec_of(obj: Any, what: str) -> str:
    """The `module:name` (or `file.py:name` for a script run as __main__) that imports `obj`
    again in another process; registered so this process uses `obj` itself."""
    if isinstance(obj, str):
        return obj
    name = getattr(obj, "__qualname__", "")
    if not callable(obj) or not name or "<" in name:
        raise ConfigError(f"{what}: pass a top-level function or class (each rank, export and resume import it "
                          f"by name), got {obj!r}")
    module = obj.__module__
    if module == "__main__" or module.startswith(_FILE_MODULES):  # a script: named by its path
        spec = f"{os.path.abspath(sys.modules[module].__file__)}:{name}"
    else:
        spec = module_spec(module, name)
    _REGISTERED[spec] = obj
    return spec


def module_spec(module: str, name: str) -> str:
    """`FOLDER:module:name`, with the folder `module` is found in, as a run records it so
    that it is found again from any working directory; `module:name` where there is no
    folder of the user's to record (`_search_folder`)."""
    folder = _search_folder(module)
    return f"{folder}:{module}:{name}" if folder else f"{module}:{name}"


def _search_folder(module: str) -> str:
    """The folder `module`'s top-level package is found in, the working directory first as
    `resolve` imports it; '' where the interpreter finds it anywhere (installed, built in)
    or nowhere (refused, naming the field, when it is imported)."""
    _on_path(os.getcwd())
    try:
        spec = importlib.util.find_spec(module.partition(".")[0])
    except ValueError:  # imported already, without a spec
        return ""
    if spec is None or not (spec.submodule_search_locations or spec.has_location):
        return ""
    location = next(iter(spec.submodule_search_locations or [spec.origin]))
    folder = os.path.dirname(os.path.abspath(location))
    return "" if folder in _installed_folders() else folder


@functools.cache
def _installed_folders() -> frozenset[str]:
    paths = sysconfig.get_paths()
    folders = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    folders |= {*site.getsitepackages(), site.getusersitepackages()}
    return frozenset(os.path.abspath(folder) for folder in folders)


def resolve(spec: str, what: str) -> Callable:
    """The callable a `[FOLDER:]module:name` or `file.py:name` spec (one the config has
    checked) names; a ConfigError naming the field (`what`) if none."""
    if spec in _REGISTERED:
        return _REGISTERED[spec]
    parts = USER_CODE.fullmatch(spec)
    if parts["file"] and not Path(parts["file"]).is_file():
        raise ConfigError(f"{what}: no such file {parts['file']}")
    try:
        module = _import_file(parts["file"]) if parts["file"] else _import_module(parts["module"], parts["folder"])
        obj = functools.reduce(getattr, parts["name"].split("."), module)
    except Exception as error:  # noqa: BLE001 - any import failure is the user's, in one line
        raise ConfigError(f"{what}: cannot import {spec} ({type(error).__name__}: {error})") from None
    if not callable(obj):
        raise ConfigError(f"{what}: {spec} is not callable")
    _REGISTERED[spec] = obj
    return obj


def _import_module(name: str, folder: str | None) -> Any:
    """From the folder a run recorded, else, as `python -m` does, from the working directory."""
    _on_path(folder or os.getcwd())
    return importlib.import_module(name)


def _on_path(folder: str) -> None:
    if folder not in sys.path:
        sys.path.insert(0, folder)


def _import_file(path: str) -> Any:
    """A .py file as a module of its own (its `if __name__ == "__main__":` part does not run)."""
    file = Path(path).resolve()
    key = f"{_FILE_MODULES}{file.with_suffix('').as_posix().strip('/').replace('/', '.')}"
    if key in sys.modules:
        return sys.modules[key]
    sys.path.insert(0, str(file.parent))  # its own imports of modules beside it
    spec = importlib.util.spec_from_file_location(key, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    importing.append(str(file))
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[key]
        raise
    finally:
        importing.pop()
    return module


def call_model_factory(spec: str, shape: tuple[int, ...], num_classes: int | None,
                       model_args: dict[str, Any]) -> nn.Module:
    factory = resolve(spec, "model")
    positional = _positional(factory, spec, (shape, num_classes), model_args)
    try:
        model = factory(*positional, **model_args)
    except ConfigError:
        raise
    except Exception as error:  # noqa: BLE001
        raise ConfigError(f"model: {spec} raised {type(error).__name__}: {error}") from None
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model: {spec} returned {type(model).__name__}, not a torch.nn.Module")
    return model


def _positional(factory: Callable, spec: str, two: tuple, model_args: dict[str, Any]) -> tuple:
    """What the factory takes before `model_args`: (input_shape, num_classes), or nothing.
    model_args that fit neither are refused here, naming model_args, where the call would
    raise a TypeError that reads as the factory's own."""
    try:
        signature = inspect.signature(factory)
    except ValueError:  # no signature (a builtin): assume the documented two
        return two
    with_two, with_none = (_bind_error(signature, form, model_args) for form in (two, ()))
    if with_two is None:
        return two
    if with_none is None or not model_args:
        return ()  # without model_args, the call says what is missing
    takes_none = _bind_error(signature, (), {}) is None and _bind_error(signature, two, {}) is not None
    raise ConfigError(f"model_args: {spec}{signature} cannot take {json.dumps(model_args)}: "
                      f"{with_none if takes_none else with_two}")


def _bind_error(signature: inspect.Signature, positional: tuple, keywords: dict[str, Any]) -> str | None:
    try:
        signature.bind(*positional, **keywords)
    except TypeError as error:
        return str(error)
    return None


class TorchSplit:
    """A map-style torch Dataset behind `Split.batch(idx)`: items collated as a DataLoader would."""

    def __init__(self, dataset: TorchDataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def batch(self, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = default_collate([self.dataset[int(i)] for i in idx])
        return x, y

    def labels(self) -> torch.Tensor | None:
        """A TensorDataset's (inputs, labels) tensors hold every label; any other Dataset's
        labels come only from reading its items."""
        plain = type(self.dataset).__getitem__ is TensorDataset.__getitem__
        return self.dataset.tensors[1] if plain and len(self.dataset.tensors) == 2 else None


@functools.lru_cache(maxsize=4)
def load_user_data(spec: str) -> tuple[TorchSplit, TorchSplit, tuple[int, ...], int | None]:
    """The data factory's two Datasets, as splits, with the shape of an input and the
    number of classes (made once per process; clients/data.py makes them a Dataset)."""
    factory = resolve(spec, "data")
    try:
        made = factory()
        train, test = made
    except Exception as error:  # noqa: BLE001
        raise ConfigError(f"data: {spec} must return (train, test) torch Datasets; "
                          f"{type(error).__name__}: {error}") from None
    for role, split in (("train", train), ("test", test)):
        if not isinstance(split, TorchDataset) or isinstance(split, IterableDataset) or not hasattr(split, "__len__"):
            raise ConfigError(f"data: {spec}'s {role} set is a {type(split).__name__}, not a map-style "
                              "torch.utils.data.Dataset with __len__")
        if len(split) == 0:
            raise ConfigError(f"data: {spec}'s {role} set is empty")
    sample = _sample(train, spec)
    classes = getattr(train, "classes", None)
    num_classes = len(classes) if classes is not None else getattr(train, "num_classes", None)
    return TorchSplit(train), TorchSplit(test), tuple(sample[0].shape), num_classes


def _sample(split: TorchDataset, spec: str) -> tuple[torch.Tensor, torch.Tensor]:
    try:
        x, y = default_collate([split[0]])
    except Exception as error:  # noqa: BLE001
        raise ConfigError(f"data: {spec}'s train[0] must be an (input tensor, target) pair; "
                          f"{type(error).__name__}: {error}") from None
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        raise ConfigError(f"data: {spec}'s train[0] must be an (input tensor, target) pair of tensors or numbers")
    return x[0], y[0]


def loss_function(spec: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The run's loss: cross-entropy, or the user's."""
    return nn.functional.cross_entropy if not spec else resolve(spec, "loss")


def optimizer_factory(spec: str) -> Callable | None:
    """The user's optimizer factory a spec names; None for one of ours (a name)."""
    return resolve(spec, "optimizer") if is_user_code(spec) else None


def first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else ""
