"""Bars (E2): the bundled S&P 500, user CSV/Parquet files and the synthetic market.

Every loader returns a pandas DataFrame indexed by a ``DatetimeIndex`` named ``date`` (tz-naive,
nanosecond unit, strictly increasing) with float64 columns exactly ``open, high, low, close,
volume``; the synthetic market adds a float64 ``oracle`` column. ``df.attrs["source"]`` names
where the bars came from, so later errors (e.g. from :func:`jaxdqn.market.splits.split`) can
name the file.

Bad data never escapes as a pandas/pyarrow traceback: every problem raises :class:`DataError`
with a one-line message naming the file and, where it applies, the row's date and the column.
"""

from __future__ import annotations

import importlib.resources
import math
import warnings
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.signal import lfilter

from jaxdqn.config import DataConfig, SyntheticConfig

__all__ = [
    "COLUMNS",
    "DataError",
    "load",
    "load_ohlcv",
    "synthetic",
    "validate_ohlcv",
]

COLUMNS: tuple[str, ...] = ("open", "high", "low", "close", "volume")
"""The canonical value columns, in order (the index is the ``date``)."""

_PRICES = ("open", "high", "low", "close")
_CANONICAL = ("date", *COLUMNS)
# Lower-cased, whitespace-stripped header spellings recognised without a column map.
_DATE_ALIASES = ("date", "datetime", "timestamp", "time")
_ADJ_CLOSE_ALIASES = ("adj close", "adj_close", "adjclose", "adjusted close", "adjusted_close")
MIN_ROWS = 2
"""Fewest bars :func:`load_ohlcv` accepts (one return). :func:`split` asks for more."""

_BUNDLED = {"sp500": "sp500.csv.gz"}


class DataError(Exception):
    """Bad or insufficient market data; the message is one line naming the file (and row)."""


# ---------------------------------------------------------------------------------------------
# Reading files
# ---------------------------------------------------------------------------------------------


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    msg = text[0] if text else type(e).__name__
    return msg if len(msg) <= 160 else msg[:157] + "..."


def _show(value: object) -> str:
    """A cell value as the user wrote it (strings quoted, numbers plain)."""
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, np.generic):
        value = value.item()
    return str(value)


def _file_kind(path: Path) -> str | None:
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

    defaults = {c: (c,) for c in COLUMNS} | {"date": _DATE_ALIASES}
    for canon in _CANONICAL:
        if canon in chosen:
            continue
        hit = lookup(canon, defaults[canon])
        if hit is None and canon == "close":
            hit = lookup(canon, _ADJ_CLOSE_ALIASES)
        if hit is not None:
            chosen[canon] = hit

    missing = [c for c in _CANONICAL if c not in chosen]
    if len(missing) == len(_CANONICAL):
        raise DataError(
            f"{name}: not an OHLCV table: none of {', '.join(_CANONICAL)} among its columns "
            f"{_preview(labels)}"
        )
    if missing:
        hint = "/".join(_DATE_ALIASES) if missing[0] == "date" else missing[0]
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


def _parse_dates(raw: pd.Series, name: str, label: object) -> pd.DatetimeIndex:
    """Parse the date column; tz-aware stamps keep their wall time (mixed offsets: UTC)."""
    col = f"column {str(label)!r}"
    values = raw.reset_index(drop=True)
    if pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values):
        # Integers such as 20190104 (YYYYMMDD); other numbers (epoch seconds? days?) are
        # ambiguous, so they are refused rather than guessed.
        num = np.asarray(values, dtype=np.float64)
        ymd = np.isfinite(num) & (num == np.floor(num)) & (num >= 1e7) & (num < 1e8)
        if not ymd.all():
            i = int(np.argmax(~ymd))
            raise DataError(
                f"{name}: row {i}: {col}: unparseable date {_show(raw.iloc[i])} (numeric dates "
                "must be YYYYMMDD; write ISO dates such as 2019-01-04)"
            )
        values = pd.Series(num.astype(np.int64).astype(str))
        values = pd.to_datetime(values, format="%Y%m%d", errors="coerce")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # format-inference and mixed-offset chatter
            try:
                parsed = pd.to_datetime(values, errors="coerce")
                if not pd.api.types.is_datetime64_any_dtype(parsed):
                    raise ValueError("mixed time zones")
            except ValueError:  # mixed UTC offsets (e.g. across daylight saving)
                parsed = pd.to_datetime(values, errors="coerce", utc=True)
    except Exception as e:
        raise DataError(f"{name}: {col}: unparseable dates ({first_line(e)})") from None
    bad = parsed.isna().to_numpy()
    if bad.any():
        i = int(np.argmax(bad))
        raise DataError(f"{name}: row {i}: {col}: unparseable date {_show(raw.iloc[i])}")
    idx = pd.DatetimeIndex(parsed)
    if idx.tz is not None:
        idx = idx.tz_localize(None)
    return idx.as_unit("ns").rename("date")


def _stamp(stamp: pd.Timestamp) -> str:
    return stamp.strftime("%Y-%m-%d") if stamp == stamp.normalize() else stamp.isoformat()


def _row(index: pd.DatetimeIndex, i: int) -> str:
    return f"row {i} ({_stamp(index[i])})"


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
        raise DataError(f"{name}: {_row(index, i)}: column 'date': duplicate timestamp")
    back = np.flatnonzero(np.diff(stamps) <= 0)
    if back.size:
        i = int(back[0]) + 1
        raise DataError(
            f"{name}: {_row(index, i)}: column 'date': timestamps not strictly increasing "
            f"(previous row is {_stamp(index[i - 1])})"
        )
    out = {}
    for col in COLUMNS:
        raw = frame[col]
        try:
            num = pd.to_numeric(raw, errors="coerce")
        except Exception:
            num = pd.Series(np.nan, index=raw.index)
        arr = np.asarray(num, dtype=np.float64)
        text_bad = np.isnan(arr) & np.asarray(raw.notna())
        if text_bad.any():
            i = int(np.argmax(text_bad))
            raise DataError(
                f"{name}: {_row(index, i)}: column {col!r}: non-numeric value {_show(raw.iloc[i])}"
            )
        nonfinite = ~np.isfinite(arr)
        if nonfinite.any():
            i = int(np.argmax(nonfinite))
            what = "missing or NaN value" if np.isnan(arr[i]) else "infinite value"
            raise DataError(f"{name}: {_row(index, i)}: column {col!r}: {what}")
        out[col] = arr
    for col in _PRICES:
        bad = out[col] <= 0
        if bad.any():
            i = int(np.argmax(bad))
            raise DataError(
                f"{name}: {_row(index, i)}: column {col!r}: non-positive price {out[col][i]}"
            )
    bad = out["volume"] < 0
    if bad.any():
        i = int(np.argmax(bad))
        raise DataError(
            f"{name}: {_row(index, i)}: column 'volume': negative volume {out['volume'][i]}"
        )
    o, h, lo, c = out["open"], out["high"], out["low"], out["close"]
    bad = h < np.maximum(o, c)
    if bad.any():
        i = int(np.argmax(bad))
        raise DataError(
            f"{name}: {_row(index, i)}: column 'high': {h[i]} is below max(open, close) = "
            f"{max(o[i], c[i])}"
        )
    bad = lo > np.minimum(o, c)
    if bad.any():
        i = int(np.argmax(bad))
        raise DataError(
            f"{name}: {_row(index, i)}: column 'low': {lo[i]} is above min(open, close) = "
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

    Dates: ISO strings or anything ``pandas.to_datetime`` infers from the first row, or integers
    ``YYYYMMDD``. Time-zone-aware stamps keep their local wall time; mixed offsets are converted
    to UTC. The result is tz-naive.

    Returns:
      DataFrame, index ``DatetimeIndex`` named ``date``, float64 columns
      ``open, high, low, close, volume``; ``attrs["source"]`` = the file's name.

    Raises:
      DataError: one line naming the file (and row date and column) for: missing, empty,
        binary or otherwise unreadable file; missing or ambiguous column; unparseable date;
        duplicate or decreasing timestamps; non-numeric, NaN or inf value; price <= 0;
        negative volume; ``high < max(open, close)`` or ``low > min(open, close)``; fewer than
        :data:`MIN_ROWS` rows.
    """
    if isinstance(source, str) and source in _BUNDLED:
        name = f"{source} (bundled {_BUNDLED[source]})"
        resource = importlib.resources.files("jaxdqn") / "assets" / _BUNDLED[source]
        with importlib.resources.as_file(resource) as path:
            frame = _read_table(Path(path), "csv", name)
    else:
        path = Path(source)
        name = str(path)
        kind = fmt or _file_kind(path)
        if kind not in ("csv", "parquet"):
            raise DataError(
                f"{name}: unknown file type (expected .csv, .csv.gz or .parquet, "
                "or set data.source to csv or parquet)"
            )
        frame = _read_table(path, kind, name)

    chosen = _resolve_columns(frame, column_map, name)
    index = _parse_dates(frame[chosen["date"]], name, chosen["date"])
    values = pd.DataFrame(
        {c: frame[chosen[c]].to_numpy() for c in COLUMNS}, index=pd.RangeIndex(len(frame))
    )
    values.index = index
    return validate_ohlcv(values, name)


# ---------------------------------------------------------------------------------------------
# The synthetic market
# ---------------------------------------------------------------------------------------------


def synthetic(cfg: SyntheticConfig) -> pd.DataFrame:
    """Daily OHLCV bars with a planted AR(1) signal, intrabar paths and the oracle's direction.

    Close-to-close log returns r_t = log(C_t / C_{t-1}) follow a stationary AR(1)
    ``r_t - mu = phi (r_{t-1} - mu) + eps_t``, eps_t ~ N(0, vol^2), started from its stationary
    law, with C_0 = start_price (r_0 := 0). The best one-bar forecast after bar t closes is
    E[r_{t+1} | r_t] = mu + phi (r_t - mu), so ``oracle[t] = sign(mu + phi (r_t - mu))`` for
    t >= 1 and 0 on the first bar. Overnight gap g_t ~ N(0, (gap_frac vol)^2), independent of
    the past (the edge is also there for orders at the next open): O_t = C_{t-1} e^{g_t}.

    High and low are the extrema of a discretised intrabar log-price path, a Brownian bridge
    from a = log O_t to b = log C_t in n = ``intrabar_steps`` steps with diffusion sd
    s = ``intrabar_vol`` * vol over the bar, ``X_k = a + (k/n)(b - a) + W_k - (k/n) W_n`` with
    ``W_k = z_1 + ... + z_k``, z_j ~ N(0, s^2/n), k = 0..n (so X_0 = a, X_n = b):
    H_t = exp(max_k X_k), L_t = exp(min_k X_k), so L <= min(O, C) <= max(O, C) <= H. As
    n -> inf, P(max_k X_k - max(a, b) > m) = exp(-2 m (m + |b - a|) / s^2) for m >= 0 (the
    bridge-maximum law; a path of n steps falls short of it by about 0.5826 s / sqrt(n)). The
    wicks shrink as the body |b - a| grows, and a buy limit below the open is reached mostly by
    paths that end lower: fills carry adverse selection, as in a real market. Volume is
    lognormal (median ``volume_median``, log-sd ``volume_sigma``); dates are business days from
    ``start_date``. Deterministic in ``cfg``: closes, gaps, volume and oracle come from
    ``default_rng(cfg.seed)`` with the draws of the generator before intrabar paths (so those
    columns are unchanged), the bridges from ``default_rng([cfg.seed, 1])``.

    Returns:
      DataFrame [num_bars] like :func:`load_ohlcv` plus float64 column ``oracle`` in {-1, 0, 1}.
    """
    try:
        dates = pd.bdate_range(start=pd.Timestamp(cfg.start_date), periods=cfg.num_bars)
    except Exception as e:
        raise DataError(f"synthetic: start_date {cfg.start_date!r} is not a date ({e})") from None
    if dates[-1] > pd.Timestamp.max:  # pandas counts nanoseconds: its calendar ends in 2262
        raise DataError(
            f"synthetic: {cfg.num_bars} business days from {cfg.start_date} run past "
            f"{pd.Timestamp.max.date()}; set an earlier data.synthetic.start_date"
        )
    n, phi, vol, mu = cfg.num_bars, cfg.phi, cfg.vol, cfg.drift
    rng = np.random.default_rng(cfg.seed)
    eps = rng.normal(0.0, vol, size=n)
    gaps = rng.normal(0.0, cfg.gap_frac * vol, size=n)
    rng.standard_normal(2 * n)  # the old independent wicks: dropped, but the stream is kept
    log_volume = rng.normal(math.log(cfg.volume_median), cfg.volume_sigma, size=n)

    # Deviations x_t = r_t - mu; x_1 drawn from the stationary law N(0, vol^2 / (1 - phi^2)).
    x = np.zeros(n)
    if n > 1:
        x0 = eps[1] / math.sqrt(1.0 - phi * phi)
        x[1:] = lfilter([1.0], [1.0, -phi], np.concatenate([[x0], eps[2:]]))
    r = np.where(np.arange(n) > 0, mu + x, 0.0)

    close = cfg.start_price * np.exp(np.cumsum(r))
    prev_close = np.concatenate([[cfg.start_price], close[:-1]])
    open_ = prev_close * np.exp(gaps)
    sd, bridge_rng = cfg.intrabar_vol * vol, np.random.default_rng([cfg.seed, 1])
    top, bottom = _bridge_extremes(np.log(open_), np.log(close), sd, cfg.intrabar_steps, bridge_rng)
    oracle = np.sign(mu + phi * (r - mu))
    oracle[0] = 0.0

    df = pd.DataFrame(
        {
            "open": open_,
            # exp(log(x)) need not round back to x: the ends are taken in again
            "high": np.maximum(np.exp(top), np.maximum(open_, close)),
            "low": np.minimum(np.exp(bottom), np.minimum(open_, close)),
            "close": close,
            "volume": np.exp(log_volume),
            "oracle": oracle.astype(np.float64),
        },
        index=pd.DatetimeIndex(dates, name="date").as_unit("ns"),
    )
    df.attrs["source"] = f"synthetic(seed={cfg.seed}, phi={phi})"
    return df


_BRIDGE_CHUNK = 1 << 20  # most path points (bars x steps) held in memory at once


def _bridge_extremes(a, b, sd: float, steps: int, rng: np.random.Generator):
    """(max, min) over k = 0..steps of the bridges X_k of :func:`synthetic` from ``a`` [N] to
    ``b`` [N], float64 [N] each. Drawn in chunks of bars, row by row in bar order, so the
    result does not depend on the chunk size and memory stays O(_BRIDGE_CHUNK)."""
    frac = np.arange(1, steps + 1, dtype=np.float64) / steps  # k/n for k = 1..n
    hi, lo = np.maximum(a, b), np.minimum(a, b)
    rows = max(1, _BRIDGE_CHUNK // steps)
    for i in range(0, a.shape[0], rows):
        j = min(i + rows, a.shape[0])
        walk = np.cumsum(rng.standard_normal((j - i, steps)), axis=1) * (sd / math.sqrt(steps))
        path = a[i:j, None] + frac * (b[i:j] - a[i:j])[:, None] + walk - frac * walk[:, -1:]
        np.maximum(hi[i:j], path.max(axis=1), out=hi[i:j])
        np.minimum(lo[i:j], path.min(axis=1), out=lo[i:j])
    return hi, lo


def load(cfg: DataConfig) -> pd.DataFrame:
    """The bars ``cfg`` names: ``sp500`` | ``csv`` | ``parquet`` (``cfg.path``, ``cfg.columns``)
    | ``synthetic`` (``cfg.synthetic``)."""
    if cfg.source == "synthetic":
        return synthetic(cfg.synthetic)
    if cfg.source == "sp500":  # the bundled file has canonical names; data.columns is for files
        return load_ohlcv("sp500")
    if not cfg.path:
        raise DataError(f"data.path: required when data.source is {cfg.source}")
    return load_ohlcv(cfg.path, cfg.columns or None, fmt=cfg.source)
