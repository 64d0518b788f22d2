"""The one error of bad market data (E2), and the helpers its messages share."""

from __future__ import annotations

import numpy as np

__all__ = ["DataError", "first_line", "show_value"]


class DataError(Exception):
    """Bad or insufficient market data; the message is one line naming the file (and row)."""


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    msg = text[0] if text else type(e).__name__
    return msg if len(msg) <= 160 else msg[:157] + "..."


def show_value(value: object) -> str:
    """A cell value as the user wrote it (strings quoted, numbers plain)."""
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, np.generic):
        value = value.item()
    return str(value)
