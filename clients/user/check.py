"""Before launch: the model (the user's or ours), training items through it and the loss,
test items read, a classifier's labels in range on both splits, the user's optimizer factory
and metric, and a stop rule that the run's outputs can reach (no stop_at_error without classes).

Whatever does not fit is one ConfigError line before any MPI process starts.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from clients.client import classifies
from clients.models import run_model
from clients.optimizers import user_optimizer
from clients.user.metric import MetricTally, metric_function, metric_traits
from clients.user.code import first_line, loss_function, optimizer_factory
from runconfig.settings import ConfigError, RunConfig


LABEL_SAMPLE = 256  # items of each split whose labels are read, where not every label is at hand


def check_user_code(cfg: RunConfig, dataset: Any) -> None:
    """Build the model (user's or not), run two training items forward and through the
    loss, read two of the test split and, for a classifier, check the labels of both splits
    against its outputs: whatever does not fit is a one-line ConfigError here, not a failure
    after launch (mid-training, or at the evaluation after it)."""
    model = run_model(cfg, dataset)
    _check_parameters(model, cfg.model)
    if factory := optimizer_factory(cfg.optimizer):  # the user's, built once on the model here
        user_optimizer(factory, model.parameters(), cfg.optimizer, lr=cfg.lr,
                       momentum=cfg.client_momentum(cfg.clients or 1), weight_decay=cfg.weight_decay)
    x, y = _first_items(dataset.train, "train")
    try:
        model.train()
        out = model(x)
    except Exception as error:  # noqa: BLE001
        raise ConfigError(f"model: a forward pass on data of shape {tuple(x.shape)} failed: "
                          f"{type(error).__name__}: {first_line(error)}") from None
    _check_test_items(model, dataset.test, x)
    if not cfg.loss:
        _check_class_axis(out, y, dataset.num_classes)
    if classifies(out, y):  # before the loss, which would fail on a first label out of range less clearly
        for role, split in (("train", dataset.train), ("test", dataset.test)):
            _check_label_range(_labels(split, role, cfg.seed), role, out.shape[1], dataset.num_classes)
    elif cfg.stop_at_error:
        raise ConfigError(f"stop_at_error: outputs {tuple(out.shape)} against targets {tuple(y.shape)} are no "
                          "classification, so the run has no error rate to stop at; use stop_at_loss or "
                          "stop_at_metric")
    _check_loss(cfg.loss, out, y)
    if cfg.metric:
        _check_metric(cfg.metric, out.detach(), y)


def _check_parameters(model: torch.nn.Module, spec: str) -> None:
    params = list(model.parameters())
    if not params:
        raise ConfigError(f"model: {spec} has no parameters to train")
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    if frozen:
        raise ConfigError(f"model: parameter {frozen[0]} has requires_grad=False; the flat weight vector holds "
                          "every parameter (register a frozen tensor as a buffer instead)")
    odd = [n for n, p in model.named_parameters() if p.dtype != torch.float32]
    if odd:
        raise ConfigError(f"model: parameter {odd[0]} is not float32; the server keeps float32 weights")


def _check_class_axis(out: Any, y: Any, classes: int | None) -> None:
    """The default loss, cross-entropy, takes axis 1 of the outputs as the classes whatever
    the model meant, and runs without a word on (B, T, V) logits against (B, T) targets
    when T = V. So it takes only the layouts where axis 1 is sure to be the classes:
    (B, C) against (B,) labels (or (B, C) probabilities), and (B, C, d1..dk) against
    (B, d1..dk) labels where C is the data's class count and the last axis could not be."""
    if not isinstance(out, torch.Tensor) or not isinstance(y, torch.Tensor) or out.ndim < 1:
        return  # the loss's own check says what is wrong
    labels = not (y.is_floating_point() or y.is_complex() or y.dtype == torch.bool)
    if out.ndim == 2 and (labels and y.ndim == 1 or y.is_floating_point() and y.shape == out.shape):
        return
    last = labels and y.shape == out.shape[:-1]  # the classes could be on the last axis
    axis = f"it would take axis 1 ({out.shape[1] if out.ndim > 1 else '-'}) as the classes"
    if out.ndim < 3 or not labels or y.shape != out.shape[:1] + out.shape[2:]:
        reason = (f"{axis}, and these outputs have theirs on the last axis" if last else
                  "it takes outputs (B, C) with targets (B,), or (B, C, d1..dk) with targets (B, d1..dk)")
    elif last:
        reason = f"{axis}, but the classes could as well be on the last axis"
    elif classes is None:
        reason = (f"{axis}, and the data declares no class count to confirm it (a `classes` or `num_classes` "
                  "attribute on the train Dataset)")
    elif out.shape[1] != classes:
        reason = f"{axis}, but the data has {classes} classes"
    else:
        return
    raise ConfigError(f"loss: the default cross-entropy on outputs {tuple(out.shape)} and targets {tuple(y.shape)}: "
                      f"{reason}; pass --loss module:function, a loss of your own")


def _check_loss(spec: str, out: torch.Tensor, y: torch.Tensor) -> None:
    loss_fn = loss_function(spec)
    try:
        loss = loss_fn(out, y)
    except Exception as error:  # noqa: BLE001
        raise ConfigError(f"loss: {spec or 'cross-entropy'} on outputs {tuple(out.shape)} and targets "
                          f"{tuple(y.shape)} failed: {type(error).__name__}: {first_line(error)}") from None
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise ConfigError(f"loss: {spec or 'cross-entropy'} must return a scalar tensor, got {loss!r}")


def _check_metric(spec: str, out: torch.Tensor, y: torch.Tensor) -> None:
    """The user's metric on two items gives a number or a (total, count) pair, through its
    `finish` where it has one, as evaluation sums it (clients/user/metric.py); its name and
    direction are a str and a bool."""
    metric_traits(spec)
    tally = MetricTally(metric_function(spec))
    try:
        tally.add(out, y)
        tally.value()
    except Exception as error:  # noqa: BLE001 - the user's code, in one line
        raise ConfigError(f"metric: {spec} on outputs {tuple(out.shape)} and targets {tuple(y.shape)} did not give "
                          f"a number or a (total, count) pair: {type(error).__name__}: {first_line(error)}") from None


def _first_items(split: Any, role: str) -> tuple[torch.Tensor, torch.Tensor]:
    return _read(split, np.arange(min(2, len(split))), role)


def _read(split: Any, idx: np.ndarray, role: str) -> tuple[torch.Tensor, torch.Tensor]:
    try:
        return split.batch(idx)
    except Exception as error:  # noqa: BLE001 - a user's __getitem__ raising anything
        raise ConfigError(f"data: reading {len(idx)} items of the {role} split failed: "
                          f"{type(error).__name__}: {first_line(error)}") from None


def _check_test_items(model: torch.nn.Module, test: Any, train_x: torch.Tensor) -> None:
    """Two test items, forward in eval mode as the evaluation after training runs them."""
    x, _ = _first_items(test, "test")
    if not isinstance(x, torch.Tensor) or (x.shape[1:], x.dtype) != (train_x.shape[1:], train_x.dtype):
        raise ConfigError(f"data: the test split's inputs are {_kind(x)}, the train split's {_kind(train_x)}")
    try:
        model.eval()
        with torch.no_grad():
            model(x)
    except Exception as error:  # noqa: BLE001
        raise ConfigError(f"model: a forward pass in eval mode on test data of shape {tuple(x.shape)} failed: "
                          f"{type(error).__name__}: {first_line(error)}") from None


def _kind(x: Any) -> str:
    return f"{x.dtype} of shape {tuple(x.shape[1:])}" if isinstance(x, torch.Tensor) else type(x).__name__


def _labels(split: Any, role: str, seed: int) -> torch.Tensor:
    """Every label where the split holds them (arrays, a TensorDataset, an image folder),
    else those of LABEL_SAMPLE items drawn from `seed`: bounded, as this runs on every
    `asgd train`."""
    known = split.labels()
    if known is not None:
        return torch.as_tensor(known)
    n = len(split)
    idx = np.sort(np.random.default_rng(seed).choice(n, min(LABEL_SAMPLE, n), replace=False))
    return _read(split, idx, role)[1]


def _check_label_range(labels: Any, role: str, outputs: int, declared: int | None) -> None:
    """Labels within the model's outputs and the classes the data declares (a label past
    them would train an output no class owns)."""
    if not isinstance(labels, torch.Tensor):
        raise ConfigError(f"data: the {role} split's targets are {type(labels).__name__}, not tensors or numbers")
    classes = outputs if declared is None else min(outputs, declared)
    low, high = labels.min().item(), labels.max().item()
    bad = high if high >= classes else low if low < 0 else None
    if bad is not None:
        bound = f"the model's {outputs} outputs" if classes == outputs else f"the data's {declared} classes"
        raise ConfigError(f"data: label {bad} in the {role} split is out of range for {bound} "
                          f"(labels must be 0..{classes - 1})")
