"""Field helpers shared by the config sections: documented, validated dataclass fields."""

from __future__ import annotations

from dataclasses import field
from typing import Any

__all__ = ["BACKENDS", "ConfigError"]


class ConfigError(ValueError):
    """A bad configuration: unknown key, wrong type or value out of range (one-line message)."""


def _f(default: Any, help: str, *, choices: tuple | None = None, lo=None, hi=None):
    """A dataclass field with documentation and validation metadata."""
    meta = {"help": help, "choices": choices, "lo": lo, "hi": hi}
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def _sub(cls, help: str):
    return field(default_factory=cls, metadata={"help": help})


BACKENDS = ("auto", "pallas", "interpret", "reference")
