"""Bars (E2): the bundled S&P 500, user CSV/Parquet files and the synthetic market.

Every loader returns a pandas DataFrame indexed by a ``DatetimeIndex`` named ``date`` (tz-naive,
nanosecond unit, strictly increasing) with float64 columns exactly ``open, high, low, close,
volume``; the synthetic market adds a float64 ``oracle`` column. ``df.attrs["source"]`` names
where the bars came from, so later errors (e.g. from :func:`jaxdqn.market.splits.split`) can
name the file.

Bad data never escapes as a pandas/pyarrow traceback: every problem raises :class:`DataError`
with a one-line message naming the file and, where it applies, the row's date and the column.
Dates are parsed by :mod:`jaxdqn.market.timestamps`; the synthetic market is
:mod:`jaxdqn.market.synthetic`.
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from jaxdqn.config import DataConfig
from jaxdqn.market import timestamps
from jaxdqn.market.errors import DataError, first_line
from jaxdqn.market.errors import show_value as _show
from jaxdqn.market.synthetic import synthetic

__all__ = [
    "COLUMNS",
    "DataError",
    "as_close_only",
    "bars_from_table",
    "close_only_bars",
    "file_kind",
    "info",
    "load",
    "load_ohlcv",
    "read_source",
    "row_label",
    "synthetic",
    "validate_ohlcv",
]

COLUMNS: tuple[str, ...] = ("open", "high", "low", "close", "volume")
"""The canonical value columns, in order (the index is the ``date``)."""

_PRICES = ("open", "high", "low", "close")
_CANONICAL = ("date", *COLUMNS)
DATE_ALIASES = ("date", "datetime", "timestamp", "time")
"""Lower-cased, stripped header spellings of the date column recognised without a column map."""
_ADJ_CLOSE_ALIASES = ("adj close", "adj_close", "adjclose", "adjusted close", "adjusted_close")
MIN_ROWS = 2
"""Fewest bars :func:`load_ohlcv` accepts (one return). :func:`split` asks for more."""

_BUNDLED = {"sp500": "sp500.csv.gz", "sp500_20": "sp500_20.csv.gz"}
"""Bundled data sets (``jaxdqn/assets``, see its PROVENANCE.md): the S&P 500 index's bars, and
the 20 stocks' adjusted closes of the wide panel table (:func:`jaxdqn.market.panel.load_wide`)."""


# ---------------------------------------------------------------------------------------------
# Reading files
# ---------------------------------------------------------------------------------------------


def file_kind(path: Path) -> str | None:
    """``csv`` or ``parquet`` from a file's suffix (None for another)."""
    name = path.name.lower()
    if name.endswith((".csv", ".csv.gz", ".csv.bz2", ".csv.zip", ".csv.xz", ".txt")):
        return "csv"
    if name.endswith((".parquet", ".pq", ".parq")):
        return "parquet"
    return None


def _read_table(path: Path, kind: str, name: str) -> pd.DataFrame:
    """Read ``path`` as a CSV or Parquet table; any failure becomes a :class:`DataError`."""
    if not path.exists():
        raise DataError(f"{name}: no such file")
    if path.is_dir():
        raise DataError(f"{name}: is a directory, not a {kind} file")
    if path.stat().st_size == 0:
        raise DataError(f"{name}: empty file")
    try:
        if kind == "parquet":
            frame = pd.read_parquet(path)
        else:
            frame = pd.read_csv(path)
            if frame.shape[1] == 1 and ";" in str(frame.columns[0]):
                # A continental-European export: same table, semicolon separated.
                frame = pd.read_csv(path, sep=";")
    except pd.errors.EmptyDataError:
        raise DataError(f"{name}: empty file (no header, no rows)") from None
    except Exception as e:  # pandas/pyarrow/gzip/unicode errors all mean "not readable"
        why = first_line(e).replace(str(path), path.name)
        raise DataError(f"{name}: not a readable {kind} table ({why})") from None
    if not isinstance(frame, pd.DataFrame):
        raise DataError(f"{name}: not a {kind} table")
    # A date index (a Parquet file written from an indexed frame) becomes an ordinary column.
    if not isinstance(frame.index, pd.RangeIndex) or frame.index.name is not None:
        idx_name = frame.index.name
        if idx_name is None and isinstance(frame.index, pd.DatetimeIndex):
            idx_name = "date"
        if idx_name is not None and idx_name not in frame.columns:
            frame = frame.rename_axis(idx_name).reset_index()
    return frame


# ---------------------------------------------------------------------------------------------
# Column resolution
# ---------------------------------------------------------------------------------------------


def _norm(label: object) -> str:
    return str(label).strip().lower()


def _resolve_columns(
    frame: pd.DataFrame, column_map: Mapping[str, str] | None, name: str
) -> dict[str, object]:
    """Map each canonical name (date, open, ..., volume) to one column label of ``frame``."""
    labels = list(frame.columns)
    by_norm: dict[str, list[object]] = {}
    for lab in labels:
        by_norm.setdefault(_norm(lab), []).append(lab)

    chosen: dict[str, object] = {}
    for user, canon in (column_map or {}).items():
        if not isinstance(canon, str) or _norm(canon) not in _CANONICAL:
            raise DataError(
                f"{name}: column map {user!r}: {canon!r} is not one of {', '.join(_CANONICAL)}"
            )
        canon = _norm(canon)
        if canon in chosen:
            raise DataError(f"{name}: column map sends two columns to {canon!r}")
        if user in labels:
            chosen[canon] = labels[labels.index(user)]
        elif len(by_norm.get(_norm(user), [])) == 1:
            chosen[canon] = by_norm[_norm(user)][0]
        else:
            raise DataError(
                f"{name}: column {user!r} (mapped to {canon}) not found; "
                f"columns are {_preview(labels)}"
            )

    used = set(chosen.values())

    def lookup(canon: str, aliases: tuple[str, ...]) -> object | None:
        for alias in aliases:
            hits = [lab for lab in by_norm.get(alias, []) if lab not in used]
            if len(hits) > 1:
                raise DataError(
                    f"{name}: column {canon!r} is ambiguous: {_preview(hits)} "
                    "(map one of them explicitly)"
                )
            if hits:
                return hits[0]
        return None

    defaults = {c: (c,) for c in COLUMNS} | {"date": DATE_ALIASES}
    for canon in _CANONICAL:
        if canon in chosen:
            continue
        hit = lookup(canon, defaults[canon])
        if hit is None and canon == "close":
            hit = lookup(canon, _ADJ_CLOSE_ALIASES)
        if hit is not None:
            chosen[canon] = hit

    # Optional: volume; open, high and low together (a close-only table has none of them).
    optional = ("volume",) + (_PRICES[:3] if not any(c in chosen for c in _PRICES[:3]) else ())
    missing = [c for c in _CANONICAL if c not in chosen and c not in optional]
    if len(chosen) == 0:
        raise DataError(
            f"{name}: not an OHLCV table: none of {', '.join(_CANONICAL)} among its columns "
            f"{_preview(labels)}"
        )
    if missing and missing[0] in _PRICES[:3]:
        have = [c for c in _PRICES[:3] if c in chosen]
        raise DataError(
            f"{name}: missing column {missing[0]!r}: the table has {', '.join(have)} but not all "
            f"of open, high and low (columns are {_preview(labels)}; a close-only table has "
            "none of them)"
        )
    if missing:
        hint = "/".join(DATE_ALIASES) if missing[0] == "date" else missing[0]
        raise DataError(
            f"{name}: missing column {missing[0]!r} (looked for {hint}, any case; columns are "
            f"{_preview(labels)}; map yours with data.columns, e.g. {{Px: {missing[0]}}})"
        )
    return chosen


def _preview(labels: list[object], n: int = 8) -> str:
    shown = ", ".join(repr(str(lab)) for lab in labels[:n])
    return f"[{shown}{', ...' if len(labels) > n else ''}]"


# ---------------------------------------------------------------------------------------------
# Parsing and validation
# ---------------------------------------------------------------------------------------------


def _stamp(stamp: pd.Timestamp) -> str:
    return stamp.strftime("%Y-%m-%d") if stamp == stamp.normalize() else stamp.isoformat()


def row_label(index: pd.DatetimeIndex, i: int) -> str:
    """``row i (date)`` for messages."""
    return f"row {i} ({_stamp(index[i])})"


def _numeric(raw: pd.Series, index: pd.DatetimeIndex, name: str, col: str) -> np.ndarray:
    """``raw`` as finite float64 (a :class:`DataError` naming the first bad row otherwise)."""
    try:
        num = pd.to_numeric(raw, errors="coerce")
    except Exception:
        num = pd.Series(np.nan, index=raw.index)
    arr = np.asarray(num, dtype=np.float64)
    text_bad = np.isnan(arr) & np.asarray(raw.notna())
    if text_bad.any():
        i = int(np.argmax(text_bad))
        raise DataError(
            f"{name}: {row_label(index, i)}: column {col!r}: non-numeric value {_show(raw.iloc[i])}"
        )
    nonfinite = ~np.isfinite(arr)
    if nonfinite.any():
        i = int(np.argmax(nonfinite))
        what = "missing or NaN value" if np.isnan(arr[i]) else "infinite value"
        raise DataError(f"{name}: {row_label(index, i)}: column {col!r}: {what}")
    return arr


def _positive(price: np.ndarray, index: pd.DatetimeIndex, name: str, col: str) -> None:
    bad = price <= 0
    if bad.any():
        i = int(np.argmax(bad))
        raise DataError(
            f"{name}: {row_label(index, i)}: column {col!r}: non-positive price {price[i]}"
        )


def close_only_bars(close: np.ndarray) -> dict[str, np.ndarray]:
    """Bars from closes alone: ``open_t = close_{t−1}`` (``open_0 = close_0``), ``high`` and
    ``low`` the larger and smaller of the two (float64 ``[T]`` each). The bar's range is then
    its close-to-close move: nothing is invented inside it."""
    close = np.asarray(close, dtype=np.float64)
    open_ = np.concatenate([close[:1], close[:-1]])
    return {
        "open": open_,
        "high": np.maximum(open_, close),
        "low": np.minimum(open_, close),
        "close": close,
    }


def validate_ohlcv(frame: pd.DataFrame, name: str = "<frame>") -> pd.DataFrame:
    """Check canonical bars; return them as float64 (raises :class:`DataError` on the first fault).

    ``frame`` must already be indexed by a DatetimeIndex and have columns ``open, high, low,
    close, volume`` (numeric or numeric strings). Checks, in order: dates unique and strictly
    increasing; every value numeric and finite; prices > 0; volume >= 0;
    ``high >= max(open, close)`` and ``low <= min(open, close)``; at least :data:`MIN_ROWS` rows.
    """
    index = frame.index
    if not isinstance(index, pd.DatetimeIndex):
        raise DataError(f"{name}: the index is not a date index")
    if len(frame) < MIN_ROWS:
        rows = f"{len(frame)} row{'' if len(frame) == 1 else 's'}"
        raise DataError(f"{name}: {rows} of data; at least {MIN_ROWS} are needed")
    stamps = index.asi8
    dup = index.duplicated(keep="first")
    if dup.any():
        i = int(np.argmax(dup))
        raise DataError(f"{name}: {row_label(index, i)}: column 'date': duplicate timestamp")
    back = np.flatnonzero(np.diff(stamps) <= 0)
    if back.size:
        i = int(back[0]) + 1
        raise DataError(
            f"{name}: {row_label(index, i)}: column 'date': timestamps not strictly increasing "
            f"(previous row is {_stamp(index[i - 1])})"
        )
    out = {col: _numeric(frame[col], index, name, col) for col in COLUMNS}
    for col in _PRICES:
        _positive(out[col], index, name, col)
    bad = out["volume"] < 0
    if bad.any():
        i = int(np.argmax(bad))
        raise DataError(
            f"{name}: {row_label(index, i)}: column 'volume': negative volume {out['volume'][i]}"
        )
    o, h, lo, c = out["open"], out["high"], out["low"], out["close"]
    bad = h < np.maximum(o, c)
    if bad.any():
        i = int(np.argmax(bad))
        raise DataError(
            f"{name}: {row_label(index, i)}: column 'high': {h[i]} is below max(open, close) = "
            f"{max(o[i], c[i])}"
        )
    bad = lo > np.minimum(o, c)
    if bad.any():
        i = int(np.argmax(bad))
        raise DataError(
            f"{name}: {row_label(index, i)}: column 'low': {lo[i]} is above min(open, close) = "
            f"{min(o[i], c[i])}"
        )
    df = pd.DataFrame(out, index=pd.DatetimeIndex(index, name="date").as_unit("ns"))
    df.attrs["source"] = name
    return df


def load_ohlcv(
    source: str | Path,
    column_map: Mapping[str, str] | None = None,
    *,
    fmt: str | None = None,
    date_format: str | None = None,
    dayfirst: bool | None = None,
    close_only: bool | None = None,
) -> pd.DataFrame:
    """Load and validate daily (or intraday) OHLCV bars.

    Args:
      source: ``"sp500"`` for the bundled S&P 500 daily bars (1999-01-04 .. 2018-12-31, 5,031
        rows; see ``jaxdqn/assets/PROVENANCE.md``), or a path to a ``.csv`` / ``.csv.gz`` (comma
        or semicolon separated, one header row) or ``.parquet`` file.
      column_map: ``{file column: canonical name}`` with canonical names ``date, open, high,
        low, close, volume`` (e.g. ``{"Px": "close"}``). Explicit entries win; every other
        canonical column is found by name, ignoring case and surrounding spaces: the date as
        ``date``, ``datetime``, ``timestamp`` or ``time`` (a Parquet file's date index works
        too); prices and volume by their own names.
      fmt: ``"csv"`` or ``"parquet"`` to force the reader; ``None`` picks it from the suffix.

    The ``Adj Close`` rule: ``Adj Close`` (also ``adj_close``, ``adjusted close``) is ignored
    whenever a ``Close`` column exists, because open/high/low are unadjusted and mixing the two
    breaks bar consistency; it is used as the close only when there is no ``Close`` column (the
    OHLC checks below then tell you if the file's open/high/low do not match it). To prefer it
    anyway, map it explicitly: ``{"Adj Close": "close"}``.

    Dates: ``date_format`` (an strftime pattern) when given; else ISO strings or anything
    ``pandas.to_datetime`` infers from the first row, or integers ``YYYYMMDD``. Dates written
    day/month/year or month/day/year are read in the order ``dayfirst`` says or, when it is
    None, the order the column shows (a first field > 12 somewhere: day-first, with a note; a
    second one: month-first); a column that shows neither, or both, is refused. Time-zone-aware
    stamps keep their local wall time; mixed offsets are converted to UTC. The result is
    tz-naive; dates outside pandas' nanosecond range (1677-09-21 .. 2262-04-11) are refused.

    Close-only tables: with ``close_only`` true, or None and no open/high/low column, the bars
    are :func:`close_only_bars` of the closes. Without a volume column the volume is 0 and
    ``attrs["volume"]`` is False (the features leave volume out).

    Returns:
      DataFrame, index ``DatetimeIndex`` named ``date``, float64 columns
      ``open, high, low, close, volume``; ``attrs``: ``source`` (the file's name),
      ``close_only``, ``volume``, ``notes`` (see :func:`load`).

    Raises:
      DataError: one line naming the file (and row date and column) for: missing, empty,
        binary or otherwise unreadable file; missing or ambiguous column; unparseable,
        ambiguous (day/month), partly day-first or out-of-range date; a bad ``date_format``;
        duplicate or decreasing timestamps; non-numeric, NaN or inf value; price <= 0;
        negative volume; ``high < max(open, close)`` or ``low > min(open, close)``; fewer than
        :data:`MIN_ROWS` rows.
    """
    frame, name = read_source(source, fmt)
    return bars_from_table(
        frame,
        name,
        column_map,
        date_format=date_format,
        dayfirst=dayfirst,
        close_only=close_only,
    )


def read_source(source: str | Path, fmt: str | None = None) -> tuple[pd.DataFrame, str]:
    """``(table, name)`` of a bundled data set's name or a CSV/Parquet path (any failure is a
    :class:`DataError` naming the file)."""
    if isinstance(source, str) and source in _BUNDLED:
        name = f"{source} (bundled {_BUNDLED[source]})"
        resource = importlib.resources.files("jaxdqn") / "assets" / _BUNDLED[source]
        with importlib.resources.as_file(resource) as path:
            return _read_table(Path(path), "csv", name), name
    path = Path(source)
    name = str(path)
    kind = fmt or file_kind(path)
    if kind not in ("csv", "parquet"):
        raise DataError(
            f"{name}: unknown file type (expected .csv, .csv.gz or .parquet, "
            "or set data.source to csv or parquet)"
        )
    return _read_table(path, kind, name), name


def bars_from_table(
    frame: pd.DataFrame,
    name: str,
    column_map: Mapping[str, str] | None = None,
    *,
    date_format: str | None = None,
    dayfirst: bool | None = None,
    close_only: bool | None = None,
) -> pd.DataFrame:
    """The validated bars of one instrument's ``frame`` (a table read from ``name``): columns,
    dates, close-only construction and checks as :func:`load_ohlcv` describes."""
    frame = frame.reset_index(drop=True)
    chosen = _resolve_columns(frame, column_map, name)
    index, notes = timestamps.parse_dates(
        frame[chosen["date"]], name, chosen["date"], date_format=date_format, dayfirst=dayfirst
    )
    has_ohlc = all(c in chosen for c in _PRICES[:3])
    if not has_ohlc and close_only is False:
        raise DataError(
            f"{name}: missing column 'open' (a close-only table: set data.close_only=true or "
            "null to accept it, or map the columns with data.columns)"
        )
    closes_only = close_only is True or not has_ohlc
    if closes_only:
        if not has_ohlc:
            notes.append(
                f"{name}: no open, high or low column: close-only bars (open = previous close, "
                "high/low = the larger/smaller of the two); orders are held at market, now"
            )
        close = _numeric(frame[chosen["close"]].reset_index(drop=True), index, name, "close")
        _positive(close, index, name, "close")
        cols = close_only_bars(close)
    else:
        cols = {c: frame[chosen[c]].to_numpy() for c in _PRICES}
    has_volume = "volume" in chosen
    if has_volume:
        cols["volume"] = frame[chosen["volume"]].to_numpy()
    else:
        cols["volume"] = np.zeros(len(frame))
        notes.append(f"{name}: no volume column: the volume feature is left out of the observation")
    values = pd.DataFrame({c: cols[c] for c in COLUMNS}, index=pd.RangeIndex(len(frame)))
    values.index = index
    df = validate_ohlcv(values, name)
    df.attrs.update(close_only=closes_only, volume=has_volume, notes=tuple(notes))
    return df


def as_close_only(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with its open, high and low rebuilt from the closes (:func:`close_only_bars`);
    volume and any other column kept."""
    out = df.copy()
    for k, v in close_only_bars(df["close"].to_numpy()).items():
        out[k] = v
    out.attrs = {**df.attrs, "close_only": True}
    return out


def info(df: pd.DataFrame) -> tuple[bool, bool, tuple[str, ...]]:
    """``(close_only, has_volume, notes)`` of bars from :func:`load`."""
    return (
        bool(df.attrs.get("close_only", False)),
        bool(df.attrs.get("volume", True)),
        tuple(df.attrs.get("notes", ())),
    )


def load(cfg: DataConfig) -> pd.DataFrame:
    """The bars ``cfg`` names: ``sp500`` | ``csv`` | ``parquet`` (``cfg.path``, ``cfg.columns``,
    ``cfg.date_format``, ``cfg.dayfirst``) | ``synthetic`` (``cfg.synthetic``); close-only bars
    when ``cfg.close_only`` is true (a file without open/high/low is close-only unless it is
    false). ``df.attrs`` holds ``close_only``, ``volume`` (whether the bars have volume) and
    ``notes`` (log lines: detected day/month order, close-only or volume-less file)."""
    if cfg.source == "synthetic":
        df = synthetic(cfg.synthetic)
    elif cfg.source == "sp500":  # the bundled file has canonical names; data.columns is for files
        df = load_ohlcv("sp500")
    elif not cfg.path:
        raise DataError(f"data.path: required when data.source is {cfg.source}")
    else:
        return load_ohlcv(
            cfg.path,
            cfg.columns or None,
            fmt=cfg.source,
            date_format=cfg.date_format,
            dayfirst=cfg.dayfirst,
            close_only=cfg.close_only,
        )
    return as_close_only(df) if cfg.close_only else df
