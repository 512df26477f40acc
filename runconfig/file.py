"""A run's TOML config file read into flat keys.

A key may stand at top level (`lr_warmup = 100`, as every file before groups had it) or
in its group's table (`[schedule]` then `lr_warmup = 100`), one meaning either way; the
groups are runconfig.settings's, passed in, so the help and the file share one table.
A key in another group's table, or given both at top level and in its table, is refused.
"""
from __future__ import annotations

import tomllib
from typing import Any, Mapping

from runconfig.require import ConfigError

TABLE_KEYS = ("model_args",)  # keys whose value is itself a table


def read_toml(path: str, group_of: Mapping[str, str]) -> dict[str, Any]:
    """The file's keys, flat, each where it was found checked against `group_of` (key ->
    group). Unknown top-level keys are left for the caller, which names them."""
    table = _load(path)
    groups = dict.fromkeys(group_of.values())
    values: dict[str, Any] = {}
    where: dict[str, str] = {}
    for key, value in table.items():
        if key in groups and isinstance(value, dict):
            for inner, item in value.items():
                _place(path, values, where, inner, item, group_of, key)
        elif isinstance(value, dict) and key not in TABLE_KEYS:
            raise ConfigError(f"config {path}: unknown section [{key}] (keys are top-level or in one of the "
                              f"sections {', '.join(groups)})")
        else:
            _place(path, values, where, key, value, group_of, None)
    return values


def _place(path: str, values: dict[str, Any], where: dict[str, str], key: str, value: Any,
           group_of: Mapping[str, str], group: str | None) -> None:
    """One key into `values`, refusing a key of another group's table and one given twice."""
    if group is not None:
        if key not in group_of:
            raise ConfigError(f"config {path}: unknown key {key!r} in [{group}]")
        if group_of[key] != group:
            raise ConfigError(f"config {path}: {key} belongs in [{group_of[key]}] (or at top level), not in [{group}]")
        if isinstance(value, dict) and key not in TABLE_KEYS:
            raise ConfigError(f"config {path}: [{group}] {key}: expected a value, got a table")
    here = "at top level" if group is None else f"in [{group}]"
    if key in where:
        raise ConfigError(f"config {path}: {key} given twice, {where[key]} and {here}")
    values[key], where[key] = value, here


def _load(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"config {path}: cannot read ({e.strerror})") from None
    except ValueError as e:  # TOMLDecodeError, bytes that are not UTF-8, an int of over 4300 digits
        raise ConfigError(f"config {path}: not valid TOML ({e})") from None
