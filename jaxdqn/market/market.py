"""From a :class:`~jaxdqn.config.Config` to a ready market: bars → splits → features → env.

One function, :func:`prepare`, used by every program that needs the market (baselines, the
evaluator's CLI, the trainer), so they all see exactly the same bars, splits, normalisation
and costs:

1. ``df = data.load(cfg.data)`` — validated bars (real, user file or synthetic);
2. ``splits = splits_lib.split(df, cfg.data, first_decision)`` with
   ``first_decision = features.warmup_length(cfg.features) + cfg.features.window − 1``, the
   first bar whose whole observation window holds valid features; the bar clock
   (:mod:`jaxdqn.market.clock`: ``data.bars_per_year``, or inferred from the train split's
   timestamps) and the check that the file holds one bar frequency;
3. ``features = compute_features(df, cfg.features, splits.train)`` — normalised on train only;
4. ``market = env.make_market(df, features, cfg.env)`` and the static ``EnvParams``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd

from jaxdqn.config import Config
from jaxdqn.market import clock as clock_lib
from jaxdqn.market import data, env
from jaxdqn.market import features as features_lib
from jaxdqn.market import splits as splits_lib
from jaxdqn.market.decisions import SPLIT_NAMES, first_decision, resolve_clock
from jaxdqn.market.panel import panel_of
from jaxdqn.market.panel_market import PanelPrepared, prepare_panel

__all__ = [
    "SPLIT_NAMES",
    "PanelPrepared",
    "Prepared",
    "first_decision",
    "prepare",
    "resolve_clock",
]


class Prepared(NamedTuple):
    """Everything derived from the config's data section.

    Attributes:
      df: the validated bars ``[T]`` (plus ``oracle`` on the synthetic market).
      features: the causal, train-normalised :class:`~jaxdqn.market.features.Features`.
      splits: ordered half-open ``(start, stop)`` row ranges train / val / test.
      market: device arrays for the environment.
      env_params: static environment parameters (``window`` = ``cfg.features.window``).
      dates: ``df.index``, the bar timestamps ``[T]``.
      first_decision: first bar the agent can decide on (full valid observation window).
      bar_clock: the bar clock of every annualised number (:class:`~jaxdqn.market.clock.BarClock`).
    """

    df: pd.DataFrame
    features: features_lib.Features
    splits: splits_lib.Splits
    market: env.MarketData
    env_params: env.EnvParams
    dates: pd.DatetimeIndex
    first_decision: int
    bar_clock: clock_lib.BarClock

    @property
    def bars_per_year(self) -> float:
        """The annualisation factor of every annualised number (``bar_clock.bars_per_year``)."""
        return self.bar_clock.bars_per_year

    @property
    def close_only(self) -> bool:
        """Bars built from closes alone: the order branches are held (E1 ``hold_orders``)."""
        return data.info(self.df)[0]

    @property
    def has_volume(self) -> bool:
        """Whether the bars came with volume (without: no volume feature)."""
        return data.info(self.df)[1]

    is_panel = False

    @property
    def num_features(self) -> int:
        return int(self.features.values.shape[1])

    def train_closes(self) -> list:
        """The market's (float32) closes of the train split's decidable bars, one array per
        instrument (here one)."""
        lo, hi = self.bar_range("train")
        return [np.asarray(self.market.close)[lo:hi]]

    def notes(self) -> list[str]:
        """Log lines about the data: the bar clock, and what loading detected (day/month
        order, close-only bars, no volume)."""
        bc = self.bar_clock
        name = self.df.attrs.get("source", "data")
        head = f"{name}: bar clock {bc.bars_per_year:.6g} bars a year ({bc.rule})"
        return [head, *data.info(self.df)[2]]

    def bar_range(self, split: str) -> tuple[int, int]:
        """Half-open bar range ``(lo, hi)`` of ``split`` for the env; ``lo`` is raised to the
        first decidable bar (only matters for train, whose first rows feed the features)."""
        if split not in SPLIT_NAMES:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLIT_NAMES}")
        lo, hi = getattr(self.splits, split)
        return max(lo, self.first_decision), hi

    def eval_range(self, split: str) -> tuple[int, int]:
        """Decision range ``(lo, hi)`` whose walk realises the returns of exactly the split's
        bars: the first decision is taken after the bar *before* the split closes (its
        observation uses only earlier bars), so the first return lands on the split's first
        bar and the last on its last bar."""
        lo, hi = self.bar_range(split)
        return max(lo - 1, self.first_decision), hi


def prepare(cfg: Config) -> Prepared | PanelPrepared:
    """Load the bars named by ``cfg.data`` and build splits, features and the market: one
    instrument's :class:`Prepared`, or the :class:`~jaxdqn.market.panel_market.PanelPrepared`
    of a panel (:func:`jaxdqn.market.panel.panel_of`).

    Raises:
      DataError: unreadable or invalid data, or a split too short for the warm-up.
      ConfigError: an environment setting the data cannot support (e.g. impact without volume).
    """
    panel = panel_of(cfg.data)
    if panel is not None:
        return prepare_panel(cfg, panel, cfg.acting.instrument_sampling)
    df = data.load(cfg.data)
    first = first_decision(cfg)
    splits = splits_lib.split(df, cfg.data, first)
    bar_clock = resolve_clock(df, cfg.data.bars_per_year, splits.train)
    feats = features_lib.compute_features(df, cfg.features, splits.train)
    market = env.make_market(df, feats, cfg.env)
    close_only, _, _ = data.info(df)
    env_params = env.EnvParams.from_config(cfg.env, cfg.features.window, hold_orders=close_only)
    return Prepared(
        df=df,
        features=feats,
        splits=splits,
        market=market,
        env_params=env_params,
        dates=pd.DatetimeIndex(df.index),
        first_decision=first,
        bar_clock=bar_clock,
    )
