"""gpu-asgd's public import, for a script of your own:

    from asgd import train

    result = train(make_model, make_data, loss=..., metric=..., optimizer="adamw", steps=200)

`train` (experiments/api.py) and what it returns (`TrainResult`), the run config
(`RunConfig`, `load_config`) and the one error bad settings raise (`ConfigError`). The
packages behind it keep the design's names (paramserver/, clients/, experiments/,
plots/); this name is the one a user's code depends on.

The `asgd` command is asgd/command.py; so that it starts without torch, these names are
imported on first use (PEP 562), not when the package is.
"""
from __future__ import annotations

import importlib

_WHERE = {"train": "experiments.api", "TrainResult": "experiments.result", "ConfigError": "runconfig.settings",
          "RunConfig": "runconfig.settings", "load_config": "runconfig.load"}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'asgd' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
