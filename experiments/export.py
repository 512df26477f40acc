"""`asgd export RUN [--out FILE]`: a run's last weights as a torch state_dict.

    asgd export runs/<name>                  -> runs/<name>/model.pt
    model = make_model(shape, num_classes)   # the run's model, built as the run built it
    model.load_state_dict(torch.load("runs/<name>/model.pt"))

The model is rebuilt from the run's config (a built-in name, or the user's factory,
imported again by name), its parameters set from `checkpoint/latest.npz`, and, for a
model with BatchNorm, its running statistics estimated from training batches as every
evaluation does (`clients.evaluate.recalibrate`). `--out FILE.safetensors` writes
safetensors instead (`make setup` installs the package; elsewhere `pip install safetensors`).
"""
from __future__ import annotations

from pathlib import Path

import torch

from clients.data import DataError, load_dataset
from clients.evaluate import has_running_stats, recalibrate
from clients.models import load_flat, run_model
from paramserver.config import ConfigError, load_config
from paramserver.rundir.durable import load_arrays
from paramserver.rundir.layout import RunDir
from paramserver.rundir.resume import recorded_config


def export(run_path: str, out: str | None = None) -> int:
    run = RunDir(run_path)
    if not run.record("config"):
        raise ConfigError(f"export: {run_path} is not a run directory (no config.json)")
    if not run.checkpoint_path.exists():
        raise ConfigError(f"export: {run_path} has no checkpoint/latest.npz to export")
    cfg = load_config(None, recorded_config(run_path))
    try:
        dataset = load_dataset(cfg.data, cfg.data_dir or None)
    except DataError as error:
        raise ConfigError(f"export: {error}") from None
    model = run_model(cfg, dataset)
    load_flat(model, load_arrays(run.checkpoint_path)["weights"])
    if has_running_stats(model):
        recalibrate(model, dataset.train, cfg.seed)
    target = Path(out) if out else run.path / "model.pt"
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if target.suffix == ".safetensors":
        try:
            from safetensors.torch import save_file
        except ImportError:
            raise ConfigError("export: --out *.safetensors needs the safetensors package; pip install safetensors "
                              "(make setup installs it)") from None
        save_file(state, str(target))
    else:
        torch.save(state, target)
    print(f"{target}: state_dict of {cfg.model} ({sum(v.numel() for v in state.values())} values)")
    return 0
