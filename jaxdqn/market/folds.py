"""Walk-forward folds (E3): K folds of train | purge | val | purge | test as bar ranges.

Every range is half-open ``[start, stop)`` in rows of the bars (``T`` rows, dates ``d``). With
``L(stop, x)`` the start of a segment of length ``x`` that ends at row ``stop`` (exclusive):

* ``unit = bars``: ``L(stop, x) = stop − x``;
* ``unit = years``: the first row dated after ``d[stop − 1] − x`` (``x`` a whole number of
  months): the segment holds the bars of the ``x`` years up to and including its last bar.

The test segments follow each other and the last ends at the last bar: their boundaries are
``B_j`` for ``j = 0..K`` with ``B_K = T`` and ``B_j = T − (K − j)·test`` (bars) or the first row
dated after ``d[T − 1] − (K − j)·test`` (years: calendar-aligned with the last bar; a series
ending on 31 December gives calendar-year test segments). Fold ``k = 0..K−1`` is then, with
``p = purge``::

    test  = [B_k, B_{k+1})
    val   = [L(B_k − p, val), B_k − p)
    train = [0, val.start − p)                        (anchored)
          = [L(val.start − p, train), val.start − p)  (rolling)

so ``p`` bars lie between train and val and between val and test: their returns belong to no
split (the first val and test decisions are taken after the bar before the segment closes,
:meth:`jaxdqn.market.market.Prepared.eval_range`; they only observe the past).

**Embargo** (rolling only): the ``e`` bars right after each test segment, ``[B_{j+1}, B_{j+1} +
e)`` for fold ``j``, are never trained on by a later fold (de Prado's embargo: those bars are
serially correlated with the out-of-sample segment). A rolling window that would contain some of
them starts after the last such bar (it gets shorter). An anchored train range starts at the
first bar and holds every earlier test segment, so an anchored plan takes no embargo
(:func:`jaxdqn.config.check_cross_fields`).

Each fold is trained from scratch on its own ranges (``data.split = bars`` with these ranges:
:meth:`Fold.data_config`), so its features are normalised on its own train rows only and its
walks never reach past its test segment.

**Panels.** The folds are planned on the panel's calendar (:func:`calendar`: the union of its
instruments' dates) and each fold's ranges become the dates of their first and last bar
(``data.split = dates``: :meth:`Fold.date_config`), which cut every instrument at the same
dates, each on its own bars (an instrument with a gap or a later start has fewer bars in a
range; one with too few is dropped or refused as ``data.min_bars`` says).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import pandas as pd

from jaxdqn.config import DataConfig, WalkForwardConfig
from jaxdqn.market.data import DataError
from jaxdqn.market.splits import split as split_rows

__all__ = ["Fold", "calendar", "check_folds", "embargo_zones", "plan_folds", "stamp"]


class Fold(NamedTuple):
    """One fold's half-open row ranges ``(start, stop)``; ``index`` is k (0-based)."""

    index: int
    train: tuple[int, int]
    val: tuple[int, int]
    test: tuple[int, int]

    def data_config(self, data: DataConfig) -> DataConfig:
        """``data`` with ``split = bars`` and this fold's ranges."""
        return dataclasses.replace(
            data, split="bars", train_bars=self.train, val_bars=self.val, test_bars=self.test
        )

    def date_config(self, data: DataConfig, dates: pd.DatetimeIndex) -> DataConfig:
        """``data`` with ``split = dates`` and this fold's ranges as the dates of their first and
        last bar in ``dates`` (a panel's calendar: every instrument is cut at the same dates)."""

        def span(r: tuple[int, int]) -> tuple[str, str]:
            return stamp(dates[r[0]]), stamp(dates[r[1] - 1])

        return dataclasses.replace(
            data,
            split="dates",
            train_dates=span(self.train),
            val_dates=span(self.val),
            test_dates=span(self.test),
        )


def stamp(ts: pd.Timestamp) -> str:
    """A bar's timestamp as config and JSON write it: the ISO date of a bar at midnight, else the
    ISO timestamp."""
    return ts.date().isoformat() if ts == ts.normalize() else ts.isoformat()


def calendar(indexes) -> pd.DatetimeIndex:
    """The sorted union of a panel's instruments' timestamps (the panel's calendar)."""
    out = pd.DatetimeIndex([])
    for index in indexes:
        out = out.union(pd.DatetimeIndex(index))
    return out.sort_values()


def _months(years: float) -> pd.DateOffset:
    return pd.DateOffset(months=round(12 * years))


def _back(dates: pd.DatetimeIndex, stop: int, length: float, unit: str, what: str) -> int:
    """``L(stop, length)`` of the module docstring; DataError when it starts before row 0."""
    if stop < 1:
        raise DataError(f"walk-forward: {what} would end before the first bar")
    if unit == "bars":
        start = stop - int(length)
    else:
        first = dates[stop - 1] - _months(length)
        start = int(dates.searchsorted(first, side="right")) if first >= dates[0] else -1
    if start < 0:
        raise DataError(
            f"walk-forward: {what} of {length:g} {unit} (ending {dates[stop - 1].date()}) would "
            f"start before the first bar ({dates[0].date()}); use fewer or shorter folds"
        )
    return start


def _test_bounds(dates: pd.DatetimeIndex, cfg: WalkForwardConfig) -> list[int]:
    """``B_0 .. B_K`` (module docstring)."""
    n, k = len(dates), cfg.folds
    if cfg.unit == "bars":
        bounds = [n - (k - j) * int(cfg.test) for j in range(k + 1)]
    else:
        ends = [dates[-1] - _months(cfg.test * (k - j)) for j in range(k)]
        if ends[0] < dates[0]:
            raise DataError(
                f"walk-forward: {k} test segments of {cfg.test:g} years need bars from "
                f"{ends[0].date()}; the data starts {dates[0].date()}"
            )
        bounds = [int(dates.searchsorted(e, side="right")) for e in ends] + [n]
    if bounds[0] < 0:
        raise DataError(
            f"walk-forward: {k} test segments of {cfg.test:g} bars need {k * int(cfg.test)} "
            f"bars; the data has {n}"
        )
    return bounds


def embargo_zones(folds: list[Fold], embargo: int) -> list[tuple[int, int]]:
    """``[test.stop, test.stop + embargo)`` of every fold (empty ranges when embargo = 0)."""
    return [(f.test[1], f.test[1] + embargo) for f in folds]


def plan_folds(dates: pd.DatetimeIndex, cfg: WalkForwardConfig) -> list[Fold]:
    """The K folds of ``cfg`` on bars dated ``dates`` (module docstring).

    Raises:
      DataError: the data is too short for the folds (a segment would start before the first
        bar, or a rolling window would be emptied by the embargo).
    """
    dates = pd.DatetimeIndex(dates)
    bounds = _test_bounds(dates, cfg)
    p = cfg.purge
    folds: list[Fold] = []
    for k in range(cfg.folds):
        test = (bounds[k], bounds[k + 1])
        val_stop = test[0] - p
        val = (_back(dates, val_stop, cfg.val, cfg.unit, f"fold {k}'s val"), val_stop)
        train_stop = val[0] - p
        if cfg.mode == "anchored":
            start = 0
        else:
            start = _back(dates, train_stop, cfg.train, cfg.unit, f"fold {k}'s train window")
            for lo, hi in embargo_zones(folds, cfg.embargo):
                if lo < hi and lo < train_stop and hi > start:  # it holds embargoed bars
                    start = hi
        if start >= train_stop:
            raise DataError(
                f"walk-forward: fold {k}'s train range is empty (rows {start}..{train_stop}; "
                "the embargo or the data start leaves nothing)"
            )
        folds.append(Fold(k, (start, train_stop), val, test))
    return folds


def check_folds(df: pd.DataFrame, folds: list[Fold], data: DataConfig, warmup: int) -> None:
    """Every fold's ranges as :func:`jaxdqn.market.splits.split` would cut them (enough bars
    after the warmup, ``data.min_split_rows`` in each split), before anything is trained.

    Raises:
      DataError: naming the fold.
    """
    for f in folds:
        for which in ("train", "val", "test"):
            lo, hi = getattr(f, which)
            if hi <= lo:
                raise DataError(f"walk-forward fold {f.index}: its {which} range is empty")
        try:
            split_rows(df, f.data_config(data), warmup)
        except DataError as e:
            raise DataError(f"walk-forward fold {f.index}: {e}") from None
