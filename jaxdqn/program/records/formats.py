"""How the program writes values: JSON-ready values, numeric arrays, ``H:MM:SS`` durations and
the fixed-digit numbers and Markdown tables of the reports.

The one definition of each conversion, shared by the log (``metrics.jsonl``, TensorBoard, the
progress line), the result files (``summary.json``) and the report.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "as_float",
    "bar_clock_text",
    "cell",
    "clock",
    "fixed",
    "markdown_table",
    "numeric",
    "to_jsonable",
]


def to_jsonable(value: Any, name: str = "value") -> Any:
    """``value`` as plain JSON types; non-finite floats → None.

    Accepts None, bool, int, float, str, numpy scalars and arrays, anything with
    ``__array__`` (jax arrays), mappings (keys made ``str``), lists, tuples and paths. Arrays
    become (nested) lists of their shape; bools stay bools.

    Raises:
      TypeError: an object of another type (``name`` says which entry).
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, np.generic):
        return to_jsonable(value.item(), name)
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v, f"{name}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v, f"{name}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if hasattr(value, "__array__"):
        arr = np.asarray(value)
        if arr.dtype.kind not in "biufUS":
            try:  # e.g. bfloat16, which numpy sees as an opaque dtype
                arr = arr.astype(np.float64)
            except (TypeError, ValueError):
                raise TypeError(f"{name}: cannot log an array of dtype {arr.dtype}") from None
        return to_jsonable(arr.tolist(), name)
    raise TypeError(f"{name}: cannot log a value of type {type(value).__name__}")


def numeric(value: Any) -> np.ndarray | None:
    """``value`` as a float64 array of its shape (None entries of a list → NaN, bools → 0/1), or
    None when ``value`` is None, a string or not numeric."""
    if value is None or isinstance(value, str):
        return None
    try:
        return np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        return None


def clock(seconds: float) -> str:
    """``H:MM:SS`` of ``seconds`` rounded to the second (hours unbounded); ``-:--:--`` when not
    finite."""
    if not math.isfinite(seconds):
        return "-:--:--"
    s = round(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def bar_clock_text(bar_clock: Any) -> str:
    """One line for a ``bar_clock`` entry (``{"bars_per_year", "inferred", "rule"}``, as
    ``summary.json`` holds it): ``"252 bars a year (inferred: daily bars, ...)"``."""
    bpy = as_float(bar_clock.get("bars_per_year"))
    rule = bar_clock.get("rule") or ("inferred" if bar_clock.get("inferred") else "set")
    return f"{bpy:.6g} bars a year ({rule})"


def as_float(value: Any) -> float:
    """``float(value)``; NaN for None and for what is not a number."""
    try:
        return math.nan if value is None else float(value)
    except (TypeError, ValueError):
        return math.nan


def fixed(value: Any, digits: int = 3) -> str:
    """``value`` with ``digits`` decimals; ``"nan"`` for None, NaN, ±inf and non-numbers."""
    x = as_float(value)
    return f"{x:.{digits}f}" if math.isfinite(x) else "nan"


def cell(value: Any) -> str:
    """A report table's cell: an integer as an integer, a bool as ``true``/``false``, another
    number with 3 decimals (±inf as ``inf``/``-inf``), None and NaN as ``"nan"``, anything else
    as its text."""
    if value is None:
        return "nan"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    try:
        f = float(value)
    except (TypeError, ValueError):
        return str(value)
    return "nan" if math.isnan(f) else f"{f:.3f}"


def markdown_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """The lines of a Markdown table: ``head``, a rule (first column left, the others right
    aligned) and one line per row of cells."""
    return [
        "| " + " | ".join(head) + " |",
        "| --- | " + " | ".join("---:" for _ in head[1:]) + " |",
        *("| " + " | ".join(r) + " |" for r in rows),
    ]
