"""The data section of the config (E2): where the bars come from (one instrument, a panel, the
synthetic market or a synthetic panel) and how they are split."""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from jaxdqn.config.fields import ConfigError, _f, _sub

__all__ = ["DataConfig", "SyntheticConfig", "SyntheticInstrument", "date_range", "instant_after"]


def instant_after(text: str, when: datetime.datetime) -> datetime.datetime:
    """The first instant after ``when``, parsed from ``text``, that a range ending there does not
    hold: the next midnight when ``text`` is a bare date (the whole day belongs to it), else
    ``when`` plus one microsecond."""
    bare = len(text.strip()) == 10
    return when + (datetime.timedelta(days=1) if bare else datetime.timedelta(microseconds=1))


def date_range(key: str, values: tuple[str, ...]) -> tuple[datetime.datetime, datetime.datetime]:
    """``[first, last]`` of ``data.<key>`` (split=dates) as the half-open ``[start, stop)`` of
    the timestamps it holds: ``first`` itself, and the instant after ``last`` — the next day's
    midnight when ``last`` is a bare date (the whole day belongs to it), else ``last`` plus one
    microsecond.

    Raises:
      ConfigError: not two ISO dates or timestamps, or ``last`` before ``first``.
    """
    if len(values) != 2:
        raise ConfigError(f"data.{key}: split=dates needs [first, last], got {list(values)}")
    try:
        first, last = (datetime.datetime.fromisoformat(str(v)) for v in values)
    except ValueError:
        raise ConfigError(
            f"data.{key}: not ISO dates or timestamps (YYYY-MM-DD[THH:MM:SS]): {list(values)}"
        ) from None
    stop = instant_after(str(values[1]), last)
    if stop <= first:
        raise ConfigError(f"data.{key}: its last date is before its first: {list(values)}")
    return first, stop


@dataclass(frozen=True)
class SyntheticInstrument:
    """One instrument of a synthetic panel: ``data.synthetic``'s market with these settings."""

    name: str = _f("", "the instrument's name (unique in the panel)")
    num_bars: int | None = _f(None, "its number of bars (null: data.synthetic.num_bars)", lo=300)
    seed: int | None = _f(
        None, "its generator seed (null: data.synthetic.seed + 1 + its place in the list)"
    )
    phi: float | None = _f(
        None, "its AR(1) coefficient (null: data.synthetic.phi)", lo=-0.99, hi=0.99
    )
    vol: float | None = _f(None, "its innovation sd (null: data.synthetic.vol)", lo=1e-5, hi=0.2)
    drift: float | None = _f(
        None, "its mean daily log return (null: data.synthetic.drift)", lo=-0.05, hi=0.05
    )
    start_date: str | None = _f(None, "its first date (null: data.synthetic.start_date)")


@dataclass(frozen=True)
class SyntheticConfig:
    """The synthetic market with a planted, known signal (E2)."""

    num_bars: int = _f(4000, "number of daily bars generated", lo=300)
    seed: int = _f(0, "seed of the generator (the market is a pure function of the config)")
    phi: float = _f(
        0.15,
        "AR(1) coefficient of close-to-close log returns (the planted signal)",
        lo=-0.99,
        hi=0.99,
    )
    vol: float = _f(0.01, "standard deviation of daily log-return innovations", lo=1e-5, hi=0.2)
    drift: float = _f(0.0, "unconditional mean daily log return", lo=-0.05, hi=0.05)
    start_price: float = _f(100.0, "first close", lo=1e-3)
    start_date: str = _f("2000-01-03", "date of the first bar (business-day calendar)")
    gap_frac: float = _f(
        0.25, "sd of the overnight gap log(open/prev close), in units of vol", lo=0.0, hi=1.0
    )
    intrabar_vol: float = _f(
        1.0, "sd of the intrabar Brownian bridge open->close (high/low: its extrema), x vol", lo=0.0
    )
    intrabar_steps: int = _f(78, "steps of the intrabar path (78: 5-minute bars of a day)", lo=2)
    volume_median: float = _f(1.0e6, "median bar volume (volume is lognormal)", lo=1.0)
    volume_sigma: float = _f(0.3, "sd of log volume", lo=0.0, hi=5.0)
    panel: tuple[SyntheticInstrument, ...] = _f(
        (),
        "a synthetic panel: one market per entry, each these settings with the entry's own "
        "(name, and any of num_bars, seed, phi, vol, drift, start_date); empty: one market",
    )


@dataclass(frozen=True)
class DataConfig:
    """Where the bars come from and how they are split (E2)."""

    source: str = _f(
        "sp500",
        "bars: bundled S&P 500 daily (1999-2018), the bundled panel of 20 US stocks' daily "
        "adjusted closes (1990-2022, sp500_20), a CSV or Parquet file or panel, or the synthetic "
        "market (a panel with data.synthetic.panel)",
        choices=("sp500", "sp500_20", "csv", "parquet", "synthetic"),
    )
    path: str | None = _f(
        None,
        "what to read when source is csv or parquet: a file (one instrument), or a panel: a "
        "directory or a glob of files (one instrument each, named by file stem)",
    )
    symbol_column: str | None = _f(
        None,
        "the column naming each row's instrument: data.path is then one long file of a panel",
    )
    instruments: tuple[str, ...] = _f(
        (),
        "panels: trade only these instruments (names as the panel gives them; empty: all), "
        "e.g. to hold some out and evaluate on them later",
    )
    min_bars: int = _f(
        0,
        "panels: drop (with a log line) every instrument with fewer bars, or too few for a "
        "split; 0: such an instrument is an error naming it",
        lo=0,
    )
    columns: dict[str, str] = _f(
        {}, "map of the file's column names to date/open/high/low/close/volume (e.g. {Px: close})"
    )
    date_format: str | None = _f(
        None,
        "strftime pattern of the file's dates (e.g. '%d.%m.%Y %H:%M:%S.%f'); null: ISO dates, "
        "YYYYMMDD integers or what pandas infers",
    )
    dayfirst: bool | None = _f(
        None,
        "dates written d/m/y or m/d/y (e.g. 01.02.2017) are day-first (true) or month-first "
        "(false); null: detected from a field > 12, and a column without one is refused",
    )
    close_only: bool | None = _f(
        None,
        "bars from closes alone (open = previous close, high/low = the larger/smaller of the "
        "two; orders held at market, now); null: when the table has no open, high or low",
    )
    bars_per_year: float | str = _f(
        "auto",
        "bars per year of every annualised number (Sharpe, volatility, return, turnover, ...); "
        "auto: inferred from the train split's timestamps (daily 252, 7-day markets 365, "
        "intraday bars per session x sessions per year; see jaxdqn/market/clock.py)",
    )
    split: str = _f(
        "date",
        "how train/val/test are cut: at two dates (date), as three date ranges (dates: the "
        "same calendar for every instrument of a panel), by fractions, or as explicit bar "
        "ranges (bars)",
        choices=("date", "dates", "fraction", "bars"),
    )
    train_end: str = _f("2012-12-31", "last date of the train split (split=date)")
    val_end: str = _f("2015-12-31", "last date of the val split; test runs to the end (split=date)")
    train_frac: float = _f(0.7, "fraction of bars in train (split=fraction)", lo=0.05, hi=0.95)
    val_frac: float = _f(0.15, "fraction of bars in val (split=fraction)", lo=0.01, hi=0.9)
    train_bars: tuple[int, ...] = _f(
        (), "[start, stop): the train split's rows (split=bars; a walk-forward fold writes them)"
    )
    val_bars: tuple[int, ...] = _f(
        (), "[start, stop): val rows (split=bars); val start >= train stop (a gap = purge)"
    )
    test_bars: tuple[int, ...] = _f(
        (), "[start, stop): test rows (split=bars); test start >= val stop, stop <= the bars"
    )
    train_dates: tuple[str, ...] = _f(
        (),
        "[first, last]: the train split's bars, both included (split=dates; a bare date holds "
        "the whole day; a panel's walk-forward fold writes them); earlier bars only feed the "
        "features",
    )
    val_dates: tuple[str, ...] = _f(
        (), "[first, last]: val bars (split=dates); first after train's last (a gap = purge)"
    )
    test_dates: tuple[str, ...] = _f(
        (), "[first, last]: test bars (split=dates); first after val's last; later bars unused"
    )
    min_split_rows: int = _f(
        20, "fewest bars each of train (after the feature warmup), val and test may have", lo=2
    )
    synthetic: SyntheticConfig = _sub(SyntheticConfig, "synthetic market (source=synthetic)")
