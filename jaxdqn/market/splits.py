"""Train / val / test splits (E2): ordered time ranges of the bars, by date, by fraction, or
as explicit bar or date ranges (``data.split = bars`` or ``dates``, what a walk-forward fold
uses on one instrument or on a panel: gaps between the ranges are purged bars, bars after test
are unused)."""

from __future__ import annotations

import math
from typing import NamedTuple

import pandas as pd

from jaxdqn.config import DataConfig
from jaxdqn.config.data_sections import date_range
from jaxdqn.market.errors import DataError, first_line

__all__ = ["Splits", "split"]


class Splits(NamedTuple):
    """Ordered, non-overlapping half-open row ranges ``(start, stop)``.

    By date or fraction they are contiguous (train.stop == val.start, val.stop == test.start),
    ``train`` starts at row 0 (its first ``warmup`` rows only feed the causal features) and
    ``test`` stops at the last row + 1. With ``split = bars`` they are the configured ranges:
    train.stop <= val.start and val.stop <= test.start (the bars between are in no split), the
    rows before train.start are only the features' causal history and rows after test.stop are
    unused.
    """

    train: tuple[int, int]
    val: tuple[int, int]
    test: tuple[int, int]


def split(df: pd.DataFrame, cfg: DataConfig, warmup: int) -> Splits:
    """Cut ``df`` into contiguous train/val/test row ranges.

    ``cfg.split == "date"``: train = bars dated on or before ``cfg.train_end`` (the whole day,
    so intraday bars of that day count), val = after that up to and including ``cfg.val_end``,
    test = the rest. ``"fraction"``: train = the first floor(train_frac T) bars, val = the next
    floor((train_frac + val_frac) T) - floor(train_frac T), test = the rest. ``"bars"``: the
    ranges ``cfg.train_bars``, ``cfg.val_bars`` and ``cfg.test_bars`` as given (ordered and
    non-overlapping: :func:`jaxdqn.config.check_cross_fields`).

    Args:
      df: bars indexed by date (from :func:`load` / :func:`load_ohlcv` / :func:`synthetic`).
      cfg: the data config (split, train_end, val_end, train_frac, val_frac, the bar ranges,
        min_split_rows).
      warmup: leading rows that cannot be decided on (features' warmup + window - 1).

    Raises:
      DataError: a date split leaves a split empty, a bar range runs past the last row, or
        train has fewer than
        ``cfg.min_split_rows`` bars after ``warmup``, or val or test has fewer than
        ``cfg.min_split_rows`` bars (T >= warmup + 3 min_split_rows is necessary).
    """
    name = df.attrs.get("source", "data")
    n = len(df)
    m = cfg.min_split_rows
    need = warmup + 3 * m
    if n < need:
        raise DataError(
            f"{name}: {n} rows; at least {need} are needed (warmup {warmup} + "
            f"{m} bars in each of train, val and test; see data.min_split_rows)"
        )
    if cfg.split == "date":
        index = df.index
        if not isinstance(index, pd.DatetimeIndex):
            raise DataError(f"{name}: split=date needs a date index")
        try:
            ends = [pd.Timestamp(cfg.train_end), pd.Timestamp(cfg.val_end)]
        except Exception as e:
            raise DataError(f"data.train_end/val_end: not dates ({first_line(e)})") from None
        # First row strictly after each end day (every time of day on the end date included).
        a, b = (int(index.searchsorted(e.normalize() + pd.Timedelta(days=1))) for e in ends)
        out = Splits((0, a), (a, b), (b, n))
        span = f"data covers {index[0].date()} to {index[-1].date()}"
        labels = {
            "train": f"on or before {cfg.train_end}",
            "val": f"after {cfg.train_end} up to {cfg.val_end}",
            "test": f"after {cfg.val_end}",
        }
        for which, (lo, hi) in out._asdict().items():
            if hi <= lo:
                raise DataError(
                    f"{name}: split {which!r} is empty: no bars {labels[which]} ({span})"
                )
    elif cfg.split == "dates":
        index = df.index
        if not isinstance(index, pd.DatetimeIndex):
            raise DataError(f"{name}: split=dates needs a date index")
        rows = []
        for key in ("train_dates", "val_dates", "test_dates"):
            start, stop = (pd.Timestamp(t) for t in date_range(key, getattr(cfg, key)))
            rows.append((int(index.searchsorted(start)), int(index.searchsorted(stop))))
        out = Splits(*rows)
        span = f"data covers {index[0]} to {index[-1]}"
        for which, (lo, hi) in out._asdict().items():
            if hi <= lo:
                dates = list(getattr(cfg, f"{which}_dates"))
                raise DataError(f"{name}: split {which!r} is empty: no bars in {dates} ({span})")
    elif cfg.split == "bars":
        out = Splits(tuple(cfg.train_bars), tuple(cfg.val_bars), tuple(cfg.test_bars))
        if out.test[1] > n:
            raise DataError(
                f"{name}: data.test_bars {list(out.test)} runs past the last of {n} rows"
            )
    else:
        a = math.floor(cfg.train_frac * n)
        b = math.floor((cfg.train_frac + cfg.val_frac) * n)
        out = Splits((0, a), (a, b), (b, n))
    for which, (lo, hi) in out._asdict().items():
        usable = hi - max(lo, warmup)
        if usable < m:
            extra = f" after the warmup of {warmup} rows" if which == "train" else ""
            raise DataError(
                f"{name}: split {which!r} has {max(usable, 0)} bars{extra}; at least {m} needed "
                "(data.min_split_rows)"
            )
    return out
