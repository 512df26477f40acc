"""The Python API: your script builds nothing by hand and calls `train` once.

    # train.py
    from experiments.api import train

    def make_model(shape, num_classes): ...      # an nn.Module
    def make_data(): ...                         # (train, test) torch Datasets

    if __name__ == "__main__":
        result = train(make_model, make_data, steps=200, clients=4)
        if result.summary is not None:           # the process that recorded the run
            print(result.status, result.final_test_error, result.run_dir)
        raise SystemExit(result)                 # its exit status

    mpiexec -n 5 python train.py                 rank 0 serves, ranks 1..4 train
    python train.py                              starts mpiexec itself (as `asgd train`)
    python train.py --backend sim --clients 8    the simulator, in this process

Keyword settings are config keys; the script's command-line flags (every `asgd train`
flag) override them, and a TOML file (`config=`) sits beneath both. Every hook takes the
callable itself or its `module:name` (`file.py:name`): the model and data factories, and
`loss=`, `metric=` and `optimizer=` (a factory of the user's, or a name: "adamw").
They must be top-level names: every rank, `asgd export` and `--resume` import them
again by name (a function in the script itself as `/abs/path/train.py:make_model`),
which is why the call sits under `if __name__ == "__main__":`.

`train` returns a `TrainResult`: the exit status, and what the run recorded (its
summary.json) on the process that recorded it: the simulator's, rank 0 of a job you
launched with mpiexec, or the script itself when it launched mpiexec (read back after
the job). The other ranks get the exit status alone.
"""
from __future__ import annotations

import functools
import sys
from dataclasses import fields
from typing import Any, Callable

from clients.user import code as usercode
from experiments.result import TrainResult
from runconfig.load import field_types
from runconfig.settings import USER_CODE_KEYS, ConfigError, RunConfig, model_args_text


def train(model: Callable | str, data: Callable | str, *, loss: Callable | str | None = None,
          config: str | None = None, argv: list[str] | None = None, **settings: Any) -> TrainResult:
    """Train `model` on `data` as `asgd train` would. A usage error in the command line's
    flags exits as argparse does (SystemExit 2), as `--help` exits 0."""
    from experiments.cli import main

    if usercode.importing:
        return TrainResult(_error(f"train: called while {usercode.importing[-1]} is imported to find a factory; "
                                  "put the call under `if __name__ == \"__main__\":`"))
    try:
        model, settings = _keywords_as_model_args(model, settings)
        hooks = {"model": model, "data": data, "loss": loss,
                 **{key: settings.pop(key) for key in USER_CODE_KEYS if key in settings}}  # metric, optimizer
        specs = {key: usercode.spec_of(value, key) for key, value in hooks.items() if value is not None}
        flags = settings_flags({**settings, **specs})
    except ConfigError as error:
        return TrainResult(_error(str(error)))
    given = sys.argv[1:] if argv is None else argv
    status = main(["train", *([config] if config else []), *flags, *given])
    return status if isinstance(status, TrainResult) else TrainResult(status)  # refused before a run directory


def _keywords_as_model_args(model: Any, settings: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """A `functools.partial` of a top-level factory: the factory, its keywords `model_args`,
    recorded so that every rank, export and resume call it alike."""
    if not isinstance(model, functools.partial):
        return model, settings
    if model.args:
        raise ConfigError("model: a functools.partial with positional arguments cannot be recorded; bind "
                          "keywords only (they become model_args)")
    if settings.get("model_args"):
        raise ConfigError("model_args: given beside a functools.partial's keywords; give them in one place")
    return model.func, {**settings, "model_args": model.keywords}


def settings_flags(settings: dict[str, Any]) -> list[str]:
    """`asgd train` flags for config keys (so a job that re-launches itself carries them)."""
    known, kinds = {f.name for f in fields(RunConfig)}, field_types()
    flags = []
    for key, value in settings.items():
        if key not in known:
            raise ConfigError(f"train: unknown setting {key!r} (the config keys are asgd train's flags)")
        flag = "--" + key.replace("_", "-")
        if kinds[key] is bool:
            if not isinstance(value, bool):
                raise ConfigError(f"{key}: expected bool, got {value!r}")
            flags += [flag] if value else []
        elif value is not None:
            flags += [flag, model_args_text(value) if key == "model_args" else str(value)]
    return flags


def _error(message: str) -> int:
    from experiments.cli import _error as say
    return say(message)
