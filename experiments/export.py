"""`asgd export RUN [--out FILE] [--best]`: a run's last weights (or, with --best, those of
its curve's best point, kept by `keep_best`) as a torch state_dict.

    asgd export runs/<name>                  -> runs/<name>/model.pt
    model = make_model(shape, num_classes)   # the run's model, built as the run built it
    model.load_state_dict(torch.load("runs/<name>/model.pt"))

The model is rebuilt from the run's config (a built-in name, or the user's factory,
imported again by name), its parameters set from `checkpoint/latest.npz` (`checkpoint/best.npz`), and, for a
model with BatchNorm, its running statistics estimated from training batches as every
evaluation does (`clients.evaluate.recalibrate`). `--out FILE.safetensors` writes
safetensors instead (`make setup` installs the package; elsewhere `pip install safetensors`),
with tensors that share memory (a language model's embedding tied to its output head)
saved once, under one of their names, as `safetensors.torch.save_model` does; load it
back with `safetensors.torch.load_model(model, FILE)`, which is strict and ties them again:

    from safetensors.torch import load_model
    load_model(make_model(...), "runs/<name>/model.safetensors")
"""
from __future__ import annotations

from pathlib import Path

import torch

from clients.data import DataError, load_dataset
from clients.evaluate import has_running_stats, recalibrate
from clients.models import load_flat, run_model
from experiments.run.resume import recorded_config
from runconfig.load import load_config
from runconfig.settings import ConfigError
from rundir.durable import load_arrays
from rundir.layout import RunDir


def export(run_path: str, out: str | None = None, best: bool = False) -> int:
    """`best`: the weights of the curve's best point (`keep_best`), not the last ones."""
    run = RunDir(run_path)
    if not run.record("config"):
        raise ConfigError(f"export: {run_path} is not a run directory (no config.json)")
    weights = run.best_path if best else run.checkpoint_path
    if not weights.exists():
        raise ConfigError(f"export: {run_path} has no {weights.relative_to(run.path)} to export"
                          + (" (the run was not trained with keep_best)" if best else ""))
    cfg = load_config(None, recorded_config(run_path))
    try:
        dataset = load_dataset(cfg.data, cfg.data_dir or None)
    except DataError as error:
        raise ConfigError(f"export: {error}") from None
    model = run_model(cfg, dataset)
    load_flat(model, load_arrays(weights)["weights"])
    if has_running_stats(model):
        recalibrate(model, dataset.train, cfg.seed)
    target = Path(out) if out else run.path / "model.pt"
    model.cpu()
    if target.suffix == ".safetensors":
        _save_safetensors(model, target)
    else:
        torch.save({k: v.detach().contiguous() for k, v in model.state_dict().items()}, target)
    stored = {v.data_ptr(): v.numel() for v in model.state_dict().values()}  # a tied tensor once
    print(f"{target}: state_dict of {cfg.model} ({sum(stored.values())} values)")
    return 0


def _save_safetensors(model: torch.nn.Module, target: Path) -> None:
    """safetensors refuses two names of one tensor in a plain dict (`save_file`);
    `save_model` keeps one name of each, which its `load_model` knows to tie again."""
    try:
        from safetensors.torch import save_model
    except ImportError:
        raise ConfigError("export: --out *.safetensors needs the safetensors package; pip install safetensors "
                          "(make setup installs it)") from None
    save_model(model, str(target), force_contiguous=True)
