"""The bar clock (E2): how many bars make a year, for every annualised number of a run.

Sharpe, Sortino, volatility, return, turnover and Calmar, the bootstrap intervals, the cost
stress, walk-forward and the baselines' volatility target all scale per-bar statistics by
``bars_per_year``; PSR and DSR use the per-bar Sharpe and do not depend on it. The number is
``data.bars_per_year`` when the user sets one, else (``auto``) it is inferred from the
timestamps of the train split by :func:`infer`:

Let ``Δ`` be the median spacing of consecutive train bars and ``w`` the bars per week
(bars ÷ weeks spanned, the span being last − first + Δ).

==================  ===========================================================================
Δ                   bars per year
==================  ===========================================================================
< 20 h (intraday)   bars per session × sessions per year, both observed: a session is a
                    calendar day holding a bar, sessions per year = sessions ÷ years spanned
                    (365.2425 days). Their product is the split's bars per elapsed year.
20 h .. 4 d (daily) 252 (trading days) when w < 5.5; 365 (a 7-day market, e.g. crypto) when
                    w ≥ 6.5; w × 52.1775 between (e.g. a 6-day week)
4 .. 10 d           52 (weekly)
25 .. 35 d          12 (monthly)
80 .. 100 d         4 (quarterly)
350 .. 380 d        1 (yearly)
==================  ===========================================================================

Limits: the intraday rule counts the bars a split holds, so a split with long holes in its
data (missing weeks) under-counts; a split shorter than :data:`MIN_SPAN_DAYS` days cannot tell a
week's pattern and is refused, as is a spacing between the rows of the table. In those cases set
``data.bars_per_year``. Daily bars give exactly 252 (or 365), so daily runs keep the numbers
they always had.

:func:`check_spacing` refuses a file whose bar frequency changes part-way (daily rows, then
hourly rows), naming the first row where the spacing changes.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd

__all__ = [
    "MIN_SPAN_DAYS",
    "BarClock",
    "ClockError",
    "check_spacing",
    "infer",
    "resolve",
    "seconds",
    "spacing_text",
]

_HOUR = 3600.0
_DAY = 24 * _HOUR
DAYS_PER_YEAR = 365.2425
WEEKS_PER_YEAR = DAYS_PER_YEAR / 7.0
MIN_SPAN_DAYS = 28
"""Fewest calendar days an ``auto`` train split must span."""
_RUN = 5  # consecutive rows of another frequency that make a file mixed
# (lowest spacing, highest spacing, bars per year, name) of the coarser-than-daily clocks
_COARSE = (
    (4 * _DAY, 10 * _DAY, 52.0, "weekly"),
    (25 * _DAY, 35 * _DAY, 12.0, "monthly"),
    (80 * _DAY, 100 * _DAY, 4.0, "quarterly"),
    (350 * _DAY, 380 * _DAY, 1.0, "yearly"),
)


class ClockError(ValueError):
    """The bar clock cannot be inferred, or the file mixes bar frequencies (one line)."""


class BarClock(NamedTuple):
    """The run's bar clock.

    Attributes:
      bars_per_year: the annualisation factor (bars per year), > 0.
      inferred: True when ``data.bars_per_year`` was ``auto``.
      rule: how the number was obtained, one line (for the log, the report and summary.json).
    """

    bars_per_year: float
    inferred: bool
    rule: str

    def to_json(self) -> dict:
        return {"bars_per_year": self.bars_per_year, "inferred": self.inferred, "rule": self.rule}


def spacing_text(seconds: float) -> str:
    """A spacing in words: ``5 min``, ``1 h``, ``1.5 d``."""
    if seconds < _HOUR:
        return f"{seconds / 60:.3g} min"
    if seconds < _DAY:
        return f"{seconds / _HOUR:.3g} h"
    return f"{seconds / _DAY:.3g} d"


def seconds(dates: pd.DatetimeIndex) -> np.ndarray:
    """float64 seconds since the epoch (whatever the index's unit)."""
    return np.asarray(pd.DatetimeIndex(dates).as_unit("ns").asi8, dtype=np.float64) / 1e9


def infer(dates: pd.DatetimeIndex) -> BarClock:
    """Bars per year from the timestamps ``dates`` (strictly increasing) by the module's rule.

    Raises:
      ClockError: fewer than 3 bars, a span under :data:`MIN_SPAN_DAYS` days, or a median
        spacing none of the rules covers.
    """
    stamps = seconds(dates)
    if stamps.size < 3:
        raise ClockError(f"{stamps.size} bars are too few to infer the bar clock")
    step = float(np.median(np.diff(stamps)))
    span = stamps[-1] - stamps[0] + step
    if span < MIN_SPAN_DAYS * _DAY:
        raise ClockError(
            f"the train split spans {span / _DAY:.3g} days, too few to infer the bar clock "
            f"(at least {MIN_SPAN_DAYS})"
        )
    n = stamps.size
    if step < 20 * _HOUR:
        days = pd.DatetimeIndex(dates).normalize()
        sessions = int(days.nunique())
        years = span / (DAYS_PER_YEAR * _DAY)
        per_session, per_year = n / sessions, sessions / years
        bpy = per_session * per_year
        return BarClock(
            bpy,
            True,
            f"inferred: intraday bars every {spacing_text(step)}, {per_session:.4g} a session x "
            f"{per_year:.4g} sessions a year = {bpy:.6g} bars a year",
        )
    if step < 4 * _DAY:
        weekly = n / (span / (7 * _DAY))
        if weekly < 5.5:
            bpy, why = 252.0, "252 trading days a year"
        elif weekly >= 6.5:
            bpy, why = 365.0, "a 7-day market: 365 days a year"
        else:
            bpy = weekly * WEEKS_PER_YEAR
            why = f"{weekly:.3g} days a week x {WEEKS_PER_YEAR:.6g} weeks = {bpy:.6g} a year"
        return BarClock(bpy, True, f"inferred: daily bars, {weekly:.3g} a week; {why}")
    for lo, hi, bpy, name in _COARSE:
        if lo <= step < hi:
            return BarClock(bpy, True, f"inferred: {name} bars, {bpy:g} a year")
    raise ClockError(
        f"bars every {spacing_text(step)} (median) fit no known clock (intraday, daily, weekly, "
        "monthly, quarterly, yearly)"
    )


def resolve(setting: float | str, dates: pd.DatetimeIndex) -> BarClock:
    """The clock of ``data.bars_per_year`` = ``setting`` (a number, or ``"auto"``: inferred
    from the train split's ``dates``)."""
    if setting == "auto":
        return infer(dates)
    return BarClock(float(setting), False, f"set: data.bars_per_year = {float(setting):g}")


def _first_run(mask: np.ndarray, length: int) -> int | None:
    """Index of the first element of the first run of ``length`` True values, if any."""
    if length <= 1:
        hits = np.flatnonzero(mask)
        return int(hits[0]) if hits.size else None
    run = np.convolve(mask.astype(np.int64), np.ones(length, np.int64), mode="valid")
    hits = np.flatnonzero(run == length)
    return int(hits[0]) if hits.size else None


def check_spacing(dates: pd.DatetimeIndex) -> tuple[int, str] | None:
    """``(row, why)`` of the first row where the bar frequency changes, or None.

    With ``Δ`` the file's median spacing: one bar per day or coarser (Δ ≥ 20 h): a spacing
    under Δ/3 (intraday rows in a daily file), or :data:`_RUN` spacings in a row of ≥ 5 Δ
    (weekly rows in a daily file). Intraday (Δ < 20 h): a spacing within a day under Δ/3
    (5-minute rows in an hourly file), :data:`_RUN` same-day spacings in a row of ≥ 3 Δ
    (hourly rows in a 5-minute file), or :data:`_RUN` sessions in a row holding one bar each
    (daily rows in an intraday file)."""
    idx = pd.DatetimeIndex(dates)
    if len(idx) < 3:
        return None
    gaps = np.diff(seconds(idx))
    step = float(np.median(gaps))

    def changed(row: int, was: float) -> tuple[int, str]:
        return row, (
            f"the bars' spacing changes from {spacing_text(step)} (the file's median) to "
            f"{spacing_text(was)}: one file must hold bars of one frequency"
        )

    if step >= 20 * _HOUR:
        first = _first_run(gaps < step / 3, 1)
        coarse = _first_run(gaps >= 5 * step, _RUN)
        hits = [h for h in (first, coarse) if h is not None]
        if not hits:
            return None
        i = min(hits)
        return changed(i + 1, gaps[i])
    days = np.asarray(idx.normalize().asi8)
    same_day = days[1:] == days[:-1]
    fine = _first_run(same_day & (gaps < step / 3), 1)
    coarse = _first_run(same_day & (gaps >= 3 * step), _RUN)
    # sessions holding a single bar: a day differing from both neighbours
    starts = np.flatnonzero(np.concatenate([[True], ~same_day]))
    counts = np.diff(np.concatenate([starts, [len(idx)]]))
    single = _first_run(counts == 1, _RUN)
    hits = []
    if fine is not None:
        hits.append(changed(fine + 1, gaps[fine]))
    if coarse is not None:
        hits.append(changed(coarse + 1, gaps[coarse]))
    if single is not None:
        row = int(starts[single])
        hits.append(
            (
                row,
                f"the bars change from intraday ({spacing_text(step)} apart, the file's median) "
                "to one a day: one file must hold bars of one frequency",
            )
        )
    return min(hits) if hits else None
