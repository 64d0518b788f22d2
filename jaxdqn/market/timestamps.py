"""Timestamps as users write them (E2): the date column of a bar file to a ``DatetimeIndex``.

:func:`parse_dates` reads ISO strings and whatever ``pandas.to_datetime`` infers, ``YYYYMMDD``
integers, or an strftime pattern the user gives (``data.date_format``). Dates written
day/month/year or month/day/year (``13.01.2017``, ``1/13/2017``) are read in the order
``data.dayfirst`` gives or, when it is null, the order the column shows: a first field > 12 in
some row makes it day-first, a second field > 12 month-first (with a note for the log); a
column that shows neither (every field <= 12: ``03.01.2017`` may be 3 January or 1 March) or
both is refused rather than guessed. Dates outside pandas' nanosecond range (1677-09-21 ..
2262-04-11) are refused naming the row. Time-zone-aware stamps keep their wall time; mixed
offsets are converted to UTC; the result is tz-naive, nanosecond unit.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from jaxdqn.market.errors import DataError, first_line
from jaxdqn.market.errors import show_value as _show

__all__ = ["parse_dates"]

_DM_LEADING = r"^\s*(\d{1,2})[./-](\d{1,2})[./-](\d{2}|\d{4})(?:\D|$)"
"""Dates written day/month/year or month/day/year (``13.01.2017``, ``1/13/2017 09:30``)."""
_NS_RANGE = f"{pd.Timestamp.min.date()} .. {pd.Timestamp.max.date()}"


def _day_month_order(
    text: pd.Series, name: str, col: str, dayfirst: bool | None
) -> tuple[bool | None, str | None]:
    """``(dayfirst, note)`` for a column of day/month-leading dates (``(None, None)`` when the
    column is not written that way: ISO dates need no order).

    A first field > 12 somewhere makes the column day-first, a second field > 12 month-first;
    both (in different rows) is a mixed column, neither an ambiguous one: both are refused
    unless ``dayfirst`` says the order (then a row that contradicts it is refused)."""
    parts = text.str.extract(_DM_LEADING)
    if text.empty or parts.isna().any(axis=None):
        return None, None  # not (only) day/month-leading dates: pandas' own inference
    first, second = parts[0].astype(int).to_numpy(), parts[1].astype(int).to_numpy()
    day_rows, month_rows = np.flatnonzero(first > 12), np.flatnonzero(second > 12)

    def row(i: int) -> str:
        return f"row {i} ({text.iloc[i]!r})"

    if day_rows.size and month_rows.size:
        a, b = sorted((int(day_rows[0]), int(month_rows[0])))
        raise DataError(
            f"{name}: {col}: {row(b)} and {row(a)} are written in different day/month orders "
            "(a partly day-first column); write every date the same way"
        )
    if dayfirst is True and month_rows.size:
        raise DataError(
            f"{name}: {row(int(month_rows[0]))}: {col}: not a day-first date (data.dayfirst "
            "is true)"
        )
    if dayfirst is False and day_rows.size:
        raise DataError(
            f"{name}: {row(int(day_rows[0]))}: {col}: not a month-first date (data.dayfirst "
            "is false)"
        )
    if dayfirst is not None:
        return dayfirst, None
    if day_rows.size:
        return True, (
            f"{name}: dates read day-first ({row(int(day_rows[0]))} has a first field > 12); "
            "set data.dayfirst to say so"
        )
    if month_rows.size:
        return False, (
            f"{name}: dates read month-first ({row(int(month_rows[0]))} has a second field "
            "> 12); set data.dayfirst to say so"
        )
    raise DataError(
        f"{name}: {col}: dates such as {text.iloc[0]!r} may be day-first or month-first and no "
        "row has a field > 12 to tell; set data.dayfirst (true or false) or data.date_format"
    )


def _unparsed(raw: pd.Series, i: int, name: str, col: str, how: str) -> DataError:
    """The error of the first row ``i`` that did not parse: out of pandas' nanosecond range,
    or not a date (``how``: what the parse expected)."""
    value = raw.iloc[i]
    try:
        stamp = pd.Timestamp(str(value).strip())
    except Exception:
        stamp = None
    if (
        stamp is not None
        and not pd.isna(stamp)
        and not (pd.Timestamp.min <= stamp <= pd.Timestamp.max)
    ):
        return _out_of_range(name, i, col, value)
    return DataError(f"{name}: row {i}: {col}: unparseable date {_show(value)}{how}")


def _out_of_range(name: str, i: int, col: str, value: object) -> DataError:
    return DataError(
        f"{name}: row {i}: {col}: date {_show(value)} is outside the range of nanosecond "
        f"timestamps ({_NS_RANGE})"
    )


def parse_dates(
    raw: pd.Series,
    name: str,
    label: object,
    *,
    date_format: str | None = None,
    dayfirst: bool | None = None,
) -> tuple[pd.DatetimeIndex, list[str]]:
    """Parse the date column; tz-aware stamps keep their wall time (mixed offsets: UTC).

    ``date_format``: an strftime pattern every row must match. Else integers are YYYYMMDD,
    day/month-leading strings are read in the order ``dayfirst`` gives or the column shows
    (:func:`_day_month_order`), and other strings as pandas infers them. Returns the index and
    the notes for the log (the detected day/month order)."""
    col = f"column {str(label)!r}"
    values = raw.reset_index(drop=True)
    notes: list[str] = []
    how = ""
    if date_format is not None:
        how = f" (data.date_format is {date_format!r})"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                parsed = pd.to_datetime(values.astype(str), format=date_format, errors="coerce")
        except Exception as e:
            raise DataError(
                f"{name}: data.date_format {date_format!r}: not a usable format ({first_line(e)})"
            ) from None
    elif pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values):
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
        parsed = pd.to_datetime(values, format="%Y%m%d", errors="coerce")
    else:
        text = values.astype(str)
        dayfirst, note = _day_month_order(text, name, col, dayfirst)
        if note:
            notes.append(note)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # format-inference and mixed-offset chatter
                kw = {} if dayfirst is None else {"dayfirst": dayfirst}
                try:
                    parsed = pd.to_datetime(values, errors="coerce", **kw)
                    if not pd.api.types.is_datetime64_any_dtype(parsed):
                        raise ValueError("mixed time zones")
                except ValueError:  # mixed UTC offsets (e.g. across daylight saving)
                    parsed = pd.to_datetime(values, errors="coerce", utc=True, **kw)
        except Exception as e:
            raise DataError(f"{name}: {col}: unparseable dates ({first_line(e)})") from None
    bad = parsed.isna().to_numpy()
    if bad.any():
        raise _unparsed(raw, int(np.argmax(bad)), name, col, how)
    idx = pd.DatetimeIndex(parsed)
    if idx.tz is not None:
        idx = idx.tz_localize(None)
    outside = (idx < pd.Timestamp.min) | (idx > pd.Timestamp.max)
    if outside.any():
        i = int(np.argmax(outside))
        raise _out_of_range(name, i, col, raw.iloc[i])
    return idx.as_unit("ns").rename("date"), notes
