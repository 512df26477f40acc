"""Before launch: the model (the user's or ours), one training sample through it and the loss.

Whatever does not fit is one ConfigError line before any MPI process starts.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from clients.models import run_model
from clients.usercode import first_line, loss_function
from paramserver.config import ConfigError, RunConfig


def check_user_code(cfg: RunConfig, dataset: Any) -> None:
    """Build the model (user's or not) and run one training sample forward and through the
    loss; whatever does not fit is a one-line ConfigError."""
    model = run_model(cfg, dataset)
    params = list(model.parameters())
    if not params:
        raise ConfigError(f"model: {cfg.model} has no parameters to train")
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    if frozen:
        raise ConfigError(f"model: parameter {frozen[0]} has requires_grad=False; the flat weight vector holds "
                          "every parameter (register a frozen tensor as a buffer instead)")
    odd = [n for n, p in model.named_parameters() if p.dtype != torch.float32]
    if odd:
        raise ConfigError(f"model: parameter {odd[0]} is not float32; the server keeps float32 weights")
    x, y = dataset.train.batch(np.arange(min(2, len(dataset.train))))
    try:
        model.train()
        out = model(x)
    except Exception as error:  # noqa: BLE001
        raise ConfigError(f"model: a forward pass on data of shape {tuple(x.shape)} failed: "
                          f"{type(error).__name__}: {first_line(error)}") from None
    loss_fn = loss_function(cfg.loss)
    try:
        loss = loss_fn(out, y)
    except Exception as error:  # noqa: BLE001
        raise ConfigError(f"loss: {cfg.loss or 'cross-entropy'} on outputs {tuple(out.shape)} and targets "
                          f"{tuple(y.shape)} failed: {type(error).__name__}: {first_line(error)}") from None
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise ConfigError(f"loss: {cfg.loss or 'cross-entropy'} must return a scalar tensor, got {loss!r}")
