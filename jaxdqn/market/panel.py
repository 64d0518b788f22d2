"""Panels (E2, issue 29): many instruments, each read and validated like one file.

The data layer of the panel market (:func:`panel_of` reads the panel a config names). A panel
is

* a directory: every ``.csv`` / ``.csv.gz`` / ``.parquet`` file in it, one instrument each,
  named by the file's stem (``AAPL.csv.gz`` → ``AAPL``);
* a glob (``data/*.parquet``): the files it matches, likewise;
* one long file with a symbol column: its rows grouped by that column's value;
* a wide table of closes (:func:`load_wide`; the bundled 20 stocks, ``"sp500_20"``): one
  close-only instrument per column;
* a synthetic panel (:func:`synthetic_panel`, ``data.synthetic.panel``): one planted-signal
  market per entry.

Each instrument goes through :func:`jaxdqn.market.data.bars_from_table`: the same columns
(``data.columns``), dates (``data.date_format``, ``data.dayfirst``), close-only rule and
validation as a single file, and every error names the file and, in a long file, the symbol
(its rows counted within the symbol). Instruments may start and end on different dates and
have gaps. The panel must hold one bar frequency: each instrument passes
:func:`jaxdqn.market.clock.check_spacing`, and every instrument's median spacing is within a
factor of 2 of the panel's median. When some instruments have no open/high/low (or no
volume) the whole panel is read close-only (or without the volume feature), with a note: one
compiled program serves every instrument, so they share one observation and one execution
rule. Instruments are ordered by name.
"""

from __future__ import annotations

import dataclasses
import glob
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from jaxdqn.config import ConfigError, DataConfig, SyntheticConfig
from jaxdqn.market import clock as clock_lib
from jaxdqn.market import data
from jaxdqn.market.errors import DataError
from jaxdqn.market.synthetic import synthetic

__all__ = [
    "Panel",
    "instrument_name",
    "instrument_settings",
    "is_panel",
    "load_panel",
    "load_wide",
    "panel_files",
    "panel_of",
    "select",
    "synthetic_panel",
]

_SUFFIXES = (".csv.gz", ".csv.bz2", ".csv.zip", ".csv.xz", ".csv", ".txt", ".parquet", ".pq")


class Panel(NamedTuple):
    """The instruments of a panel, ordered by name.

    Attributes:
      names: instrument names (file stems or symbols), unique.
      bars: each instrument's validated bars, as :func:`jaxdqn.market.data.load` returns them
        (``attrs["source"]`` names the file and symbol).
      notes: log lines (what was detected or converted for the whole panel).
    """

    names: tuple[str, ...]
    bars: tuple[pd.DataFrame, ...]
    notes: tuple[str, ...]


def is_panel(path: str | None, symbol_column: str | None = None) -> bool:
    """Whether ``path`` names a panel (a directory, a glob, or a long file with a
    ``symbol_column``) rather than one instrument."""
    if not path:
        return False
    return symbol_column is not None or Path(path).is_dir() or glob.has_magic(path)


def instrument_name(path: Path) -> str:
    """A file's instrument name: its name without the data suffix (``AAPL.csv.gz`` → ``AAPL``)."""
    name = path.name
    lower = name.lower()
    for suffix in _SUFFIXES:
        if lower.endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def panel_files(spec: str) -> list[Path]:
    """The files of a directory or a glob, sorted by name (data files only).

    Raises:
      DataError: no such directory, or nothing matched.
    """
    path = Path(spec)
    if path.is_dir():
        files = [p for p in path.iterdir() if p.is_file() and data.file_kind(p) is not None]
        where = f"{spec}: no .csv, .csv.gz or .parquet files in the directory"
    else:
        files = [Path(p) for p in glob.glob(spec) if Path(p).is_file()]
        where = f"{spec}: the pattern matches no file"
    if not files:
        raise DataError(where)
    return sorted(files, key=lambda p: p.name)


def _long_file(path: str, col: str) -> list[tuple[str, pd.DataFrame, str]]:
    """``(symbol, rows, name)`` of a long file's instruments."""
    frame, name = data.read_source(path)
    labels = list(frame.columns)
    hits = [lab for lab in labels if str(lab) == col] or [
        lab for lab in labels if str(lab).strip().lower() == str(col).strip().lower()
    ]
    if len(hits) != 1:
        raise DataError(
            f"{name}: symbol column {col!r} "
            + ("is ambiguous" if hits else f"not found; columns are {labels[:8]}")
        )
    symbols = frame[hits[0]]
    missing = symbols.isna().to_numpy()
    if missing.any():
        raise DataError(f"{name}: row {int(np.argmax(missing))}: column {col!r}: no symbol")
    rows = frame.drop(columns=[hits[0]])
    out = []
    for sym, group in rows.groupby(symbols.astype(str).str.strip(), sort=True):
        out.append((str(sym), group, f"{name} [symbol {sym}]"))
    return out


def _files(spec: str) -> list[tuple[str, pd.DataFrame, str]]:
    out, seen = [], {}
    for path in panel_files(spec):
        inst = instrument_name(path)
        if inst in seen:
            raise DataError(f"{path}: instrument {inst!r} again (also {seen[inst]})")
        seen[inst] = path.name
        frame, name = data.read_source(path)
        out.append((inst, frame, name))
    return out


def _check_one_frequency(names: list[str], bars: list[pd.DataFrame]) -> None:
    steps = []
    for inst, df in zip(names, bars, strict=True):
        index = pd.DatetimeIndex(df.index)
        changed = clock_lib.check_spacing(index)
        if changed is not None:
            row, why = changed
            src = df.attrs.get("source", inst)
            raise DataError(f"{src}: {data.row_label(index, row)}: column 'date': {why}")
        if len(index) > 1:
            steps.append(float(np.median(np.diff(index.as_unit("ns").asi8))) / 1e9)
        else:
            steps.append(float("nan"))
    median = float(np.nanmedian(steps)) if np.isfinite(steps).any() else float("nan")
    for inst, df, step in zip(names, bars, steps, strict=True):
        if np.isfinite(step) and not median / 2 <= step <= 2 * median:
            raise DataError(
                f"{df.attrs.get('source', inst)}: bars every {clock_lib.spacing_text(step)}, the "
                f"panel's every {clock_lib.spacing_text(median)}: a panel holds one bar frequency"
            )


def load_wide(source: str, cfg: DataConfig) -> Panel:
    """A wide table of closes as a panel: a date column and one column of closes per instrument
    (the bundled ``"sp500_20"``, or a CSV/Parquet path), each column a close-only instrument
    named by its header. Empty cells are gaps (that instrument has no bar there); the dates are
    read as ``cfg``'s ``date_format`` and ``dayfirst`` say.

    Raises:
      DataError: no date column, no instrument column, or a column that does not load (naming
        it and the row).
    """
    frame, name = data.read_source(source)
    labels = [str(lab) for lab in frame.columns]
    dates = [lab for lab in frame.columns if str(lab).strip().lower() in data.DATE_ALIASES]
    if len(dates) != 1:
        raise DataError(
            f"{name}: a wide table of closes needs one date column; columns are {labels[:8]}"
        )
    others = [lab for lab in frame.columns if lab != dates[0]]
    if not others:
        raise DataError(f"{name}: a wide table of closes without instrument columns")
    names, bars = [], []
    for lab in sorted(others, key=str):
        rows = frame[[dates[0], lab]].dropna(subset=[lab])
        bars.append(
            data.bars_from_table(
                rows,
                f"{name} [column {lab}]",
                {str(dates[0]): "date", str(lab): "close"},
                date_format=cfg.date_format,
                dayfirst=cfg.dayfirst,
                close_only=True,
            )
        )
        names.append(str(lab))
    _check_one_frequency(names, bars)
    return Panel(tuple(names), tuple(bars), ())


def load_panel(path: str, cfg: DataConfig, symbol_column: str | None = None) -> Panel:
    """The panel at ``path`` (see the module docstring), each instrument read with ``cfg``'s
    ``columns``, ``date_format``, ``dayfirst`` and ``close_only``.

    Raises:
      DataError: a file or symbol that does not load (naming it), two files of one instrument,
        no instrument, or instruments of different bar frequencies.
    """
    tables = _long_file(path, symbol_column) if symbol_column is not None else _files(path)
    if not tables:
        raise DataError(f"{path}: a panel without instruments")
    kw = dict(date_format=cfg.date_format, dayfirst=cfg.dayfirst, close_only=cfg.close_only)
    names, bars = [], []
    for inst, frame, name in tables:
        bars.append(data.bars_from_table(frame, name, cfg.columns or None, **kw))
        names.append(inst)
    notes: list[str] = []
    short = [n for n, b in zip(names, bars, strict=True) if data.info(b)[0]]
    if short and len(short) < len(bars) and cfg.close_only is not False:
        notes.append(
            f"{path}: {', '.join(short)} have closes only: every instrument is read as "
            "close-only bars (one execution rule for the panel)"
        )
        bars = [b if data.info(b)[0] else data.as_close_only(b) for b in bars]
    no_volume = [n for n, b in zip(names, bars, strict=True) if not data.info(b)[1]]
    if no_volume and len(no_volume) < len(bars):
        notes.append(
            f"{path}: {', '.join(no_volume)} have no volume: the volume feature is left out "
            "for every instrument"
        )
        for b in bars:
            b.attrs["volume"] = False
    _check_one_frequency(names, bars)
    return Panel(tuple(names), tuple(bars), tuple(notes))


def instrument_settings(base: SyntheticConfig, i: int) -> SyntheticConfig:
    """The generator settings of entry ``i`` of ``base.panel``: ``base`` with the entry's own
    settings (those it gives), the seed ``base.seed + 1 + i`` when it gives none, no panel."""
    inst = base.panel[i]
    own = {
        f.name: getattr(inst, f.name)
        for f in dataclasses.fields(inst)
        if f.name != "name" and getattr(inst, f.name) is not None
    }
    own.setdefault("seed", base.seed + 1 + i)
    return dataclasses.replace(base, panel=(), **own)


def synthetic_panel(cfg: DataConfig) -> Panel:
    """The synthetic panel of ``cfg.synthetic.panel``: instrument ``i`` is the market of
    :func:`jaxdqn.market.synthetic.synthetic` under ``cfg.synthetic`` with the entry's own
    settings; an entry without a seed gets ``cfg.synthetic.seed + 1 + i``, so no two share one
    unless the config says so. Close-only when ``cfg.close_only`` is true."""
    names, bars = [], []
    for i, inst in enumerate(cfg.synthetic.panel):
        df = synthetic(instrument_settings(cfg.synthetic, i))
        df.attrs["source"] = f"synthetic {inst.name.strip()} ({df.attrs['source']})"
        bars.append(data.as_close_only(df) if cfg.close_only else df)
        names.append(inst.name.strip())
    order = np.argsort(names, kind="stable")
    return Panel(tuple(names[i] for i in order), tuple(bars[i] for i in order), ())


def select(panel: Panel, names: tuple[str, ...]) -> Panel:
    """The instruments ``names`` of ``panel`` (all when empty), in the panel's order.

    Raises:
      DataError: a name the panel does not have.
    """
    if not names:
        return panel
    missing = [n for n in names if n not in panel.names]
    if missing:
        raise DataError(
            f"data.instruments: {', '.join(missing)} not in the panel "
            f"(it has {', '.join(panel.names[:12])}{', ...' if len(panel.names) > 12 else ''})"
        )
    keep = [i for i, n in enumerate(panel.names) if n in names]
    return Panel(
        tuple(panel.names[i] for i in keep), tuple(panel.bars[i] for i in keep), panel.notes
    )


def panel_of(cfg: DataConfig) -> Panel | None:
    """The panel ``cfg`` names (the bundled ``sp500_20``, a synthetic panel, a directory, a glob
    or a long file with ``symbol_column``), restricted to ``cfg.instruments`` when given, or
    None when it names one instrument.

    Raises:
      DataError: what :func:`load_panel` / :func:`load_wide` raise, or an unknown instrument.
      ConfigError: ``data.instruments`` given for one instrument.
    """
    if cfg.source == "sp500_20":
        panel = load_wide("sp500_20", cfg)
    elif cfg.source == "synthetic" and cfg.synthetic.panel:
        panel = synthetic_panel(cfg)
    elif cfg.source in ("csv", "parquet") and is_panel(cfg.path, cfg.symbol_column):
        panel = load_panel(str(cfg.path), cfg, cfg.symbol_column)
    else:
        if cfg.instruments:
            raise ConfigError("data.instruments: selects instruments of a panel; this is one")
        return None
    return select(panel, tuple(cfg.instruments))
