"""Which bars a run can decide on, and how its bars are counted: the split names, the first
decision bar (after the features' warm-up and the observation window) and the bar clock of a
split (:mod:`jaxdqn.market.clock`), shared by one instrument's market
(:mod:`jaxdqn.market.market`) and a panel's (:mod:`jaxdqn.market.panel_market`)."""

from __future__ import annotations

import pandas as pd

from jaxdqn.config import Config
from jaxdqn.market import clock as clock_lib
from jaxdqn.market import data
from jaxdqn.market import features as features_lib

__all__ = ["SPLIT_NAMES", "check_one_frequency", "first_decision", "resolve_clock"]

SPLIT_NAMES = ("train", "val", "test")


def first_decision(cfg: Config) -> int:
    """The first bar whose whole observation window holds valid features: the features'
    warmup + ``features.window`` − 1."""
    return features_lib.warmup_length(cfg.features) + cfg.features.window - 1


def check_one_frequency(df: pd.DataFrame, name: str) -> None:
    """Raises DataError naming the first row of ``df`` (called ``name``) where the bar
    frequency changes (:func:`jaxdqn.market.clock.check_spacing`)."""
    index = pd.DatetimeIndex(df.index)
    changed = clock_lib.check_spacing(index)
    if changed is not None:
        row, why = changed
        raise data.DataError(f"{name}: {data.row_label(index, row)}: column 'date': {why}")


def resolve_clock(
    df: pd.DataFrame, setting: float | str, train: tuple[int, int]
) -> clock_lib.BarClock:
    """The clock of ``data.bars_per_year`` = ``setting`` for the bars ``df`` whose train split
    is the rows ``train``, after checking that ``df`` holds one bar frequency.

    Raises:
      DataError: the file mixes frequencies (naming the row), or ``auto`` cannot infer a clock.
    """
    name = df.attrs.get("source", "data")
    check_one_frequency(df, name)
    index = pd.DatetimeIndex(df.index)
    try:
        return clock_lib.resolve(setting, index[train[0] : train[1]])
    except clock_lib.ClockError as e:
        raise data.DataError(
            f"{name}: data.bars_per_year: cannot infer the bar clock ({e}); set the number, "
            "e.g. data.bars_per_year=252"
        ) from None
