"""How a run's config is read: a config file's values, then the command line's (each
flag typed as its field is), into a checked RunConfig (runconfig/settings.py)."""
from __future__ import annotations

from dataclasses import fields
from typing import Any, Callable

from runconfig.checks import AUTO_KEYS, ConfigError, base_types, model_args_text
from runconfig.file import read_toml
from runconfig.settings import RunConfig


def field_types() -> dict[str, type]:
    """The base type of each field (Optional[int] -> int)."""
    return dict(base_types(RunConfig))


def flag_type(name: str) -> Callable[[str], Any]:
    """How a command-line value of `name` is read: its field's type, and for momentum,
    fresh_batch and servers also the word `auto`."""
    if name in AUTO_KEYS:
        kind = field_types()[name]

        def auto(text: str) -> float | int | str:
            return text if text == "auto" else kind(text)
        auto.__name__ = name  # argparse names it in a refusal: "invalid momentum value"
        return auto
    return field_types()[name]


def group_of() -> dict[str, str]:
    """Each field's group (a key of GROUPS), in declaration order: what --help's sections
    and a config file's tables both read."""
    return {f.name: f.metadata["group"] for f in fields(RunConfig)}


def load_config(path: str | None = None, overrides: dict[str, Any] | None = None) -> RunConfig:
    """The config file's values, then the overrides (flags given on the command line)."""
    return RunConfig(**config_values(path, overrides))


def config_values(path: str | None = None, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The settings asked for, not yet checked against each other: the config file's
    values, then the overrides (None: not given). Unknown keys are refused here."""
    values: dict[str, Any] = {}
    if path:
        values.update(read_toml(path, group_of()))
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    if "model_args" in values:
        values["model_args"] = model_args_text(values["model_args"])
    known = {f.name for f in fields(RunConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"{f'config {path}: ' if path else ''}unknown key {unknown[0]!r}")
    return values
