"""The one error bad settings raise, and how a check raises it: one line, `field: reason`."""
from __future__ import annotations

from typing import Any, Callable


class ConfigError(ValueError):
    """A config value is wrong; the message is one line: `field: reason`."""


def require(ok: bool, field: str, reason: str) -> None:
    if not ok:
        raise ConfigError(f"{field}: {reason}")


def parsed(parse: Callable[[str], Any], text: str) -> Any:
    """`parse(text)`, or None where it raises ValueError."""
    try:
        return parse(text)
    except ValueError:
        return None
