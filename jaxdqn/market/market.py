"""From a :class:`~jaxdqn.config.Config` to a ready market: bars → splits → features → env.

One function, :func:`prepare`, used by every program that needs the market (baselines, the
evaluator's CLI, the trainer), so they all see exactly the same bars, splits, normalisation
and costs:

1. ``df = data.load(cfg.data)`` — validated bars (real, user file or synthetic);
2. ``splits = splits_lib.split(df, cfg.data, first_decision)`` with
   ``first_decision = features.warmup_length(cfg.features) + cfg.features.window − 1``, the
   first bar whose whole observation window holds valid features;
3. ``features = compute_features(df, cfg.features, splits.train)`` — normalised on train only;
4. ``market = env.make_market(df, features, cfg.env)`` and the static ``EnvParams``.
"""

from __future__ import annotations

from typing import NamedTuple

import pandas as pd

from jaxdqn.config import Config
from jaxdqn.market import data, env
from jaxdqn.market import features as features_lib
from jaxdqn.market import splits as splits_lib

__all__ = ["SPLIT_NAMES", "Prepared", "first_decision", "prepare"]

SPLIT_NAMES = ("train", "val", "test")


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
    """

    df: pd.DataFrame
    features: features_lib.Features
    splits: splits_lib.Splits
    market: env.MarketData
    env_params: env.EnvParams
    dates: pd.DatetimeIndex
    first_decision: int

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


def first_decision(cfg: Config) -> int:
    """The first bar whose whole observation window holds valid features: the features'
    warmup + ``features.window`` − 1."""
    return features_lib.warmup_length(cfg.features) + cfg.features.window - 1


def prepare(cfg: Config) -> Prepared:
    """Load the bars named by ``cfg.data`` and build splits, features and the market.

    Raises:
      DataError: unreadable or invalid data, or a split too short for the warm-up.
      ConfigError: an environment setting the data cannot support (e.g. impact without volume).
    """
    df = data.load(cfg.data)
    first = first_decision(cfg)
    splits = splits_lib.split(df, cfg.data, first)
    feats = features_lib.compute_features(df, cfg.features, splits.train)
    market = env.make_market(df, feats, cfg.env)
    env_params = env.EnvParams.from_config(cfg.env, cfg.features.window)
    return Prepared(
        df=df,
        features=feats,
        splits=splits,
        market=market,
        env_params=env_params,
        dates=pd.DatetimeIndex(df.index),
        first_decision=first,
    )
