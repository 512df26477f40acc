"""gpu-asgd's public import, for a script of your own:

    from asgd import train

    result = train(make_model, make_data, loss=..., metric=..., optimizer="adamw", steps=200)

`train` (experiments/api.py) and what it returns (`TrainResult`), the run config
(`RunConfig`, `load_config`) and the one error bad settings raise (`ConfigError`). The
packages behind it keep the design's names (paramserver/, clients/, experiments/,
plots/); this name is the one a user's code depends on.
"""
from experiments.api import train
from experiments.result import TrainResult
from paramserver.config import ConfigError, RunConfig, load_config

__all__ = ["ConfigError", "RunConfig", "TrainResult", "load_config", "train"]
