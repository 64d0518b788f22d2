"""The market as device arrays (E1): :class:`MarketData` and :func:`make_market`.

One instrument's bars and causal per-bar inputs, or a panel's instruments concatenated
(:mod:`jaxdqn.market.panel_market`), whose training episodes then draw an instrument before
their start (:func:`with_episodes`, :func:`draw_episode_range`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxdqn.config import ConfigError, EnvConfig

if TYPE_CHECKING:
    import pandas as pd

    from jaxdqn.market.features import Features

__all__ = ["MarketData", "draw_episode_range", "make_market", "with_episodes"]


@struct.dataclass
class MarketData:
    """Bars and causal per-bar inputs of one instrument (or a panel's, concatenated), as device
    arrays.

    Attributes (float32, ``[T]`` unless noted):
      open, high, low, close, volume: the bars.
      sigma: ``σ̂_t``, causal per-bar volatility (fraction) using bars ≤ t; 0 before warm-up.
      adv: average dollar volume per bar, the mean of ``close · volume`` over the last
        ``env.adv_window`` bars up to and including t (fewer at the start).
      features: ``[T, F]`` normalised causal features (row t uses bars ≤ t).
      oracle: the synthetic market's oracle direction for the decision after bar t
        (zeros on real data).
      episode_ranges: a panel's int32 ``[I, 2]`` global ``[lo, hi)`` train ranges, one per
        instrument, or None (one instrument: an episode stays in the range it was given).
      episode_cdf: float32 ``[I]`` cumulative probabilities of drawing each instrument
        (the last is 1), or None.
      reward_scale: float32 ``[]``, the learning-reward scale resolved on this market's train
        split (``loss.reward_scale``; set by the trainer's placement), or None (the agent's
        constant is used). As data it keeps the training iteration's program the same for
        markets that differ only in their bars (walk-forward folds reuse the first fold's
        compiled program).
    """

    open: jax.Array
    high: jax.Array
    low: jax.Array
    close: jax.Array
    volume: jax.Array
    sigma: jax.Array
    adv: jax.Array
    features: jax.Array
    oracle: jax.Array
    episode_ranges: jax.Array | None = None
    episode_cdf: jax.Array | None = None
    reward_scale: jax.Array | None = None

    @property
    def num_bars(self) -> int:
        return self.close.shape[0]

    @property
    def num_features(self) -> int:
        return self.features.shape[1]


def make_market(df: pd.DataFrame, features: Features, env_cfg: EnvConfig) -> MarketData:
    """Device arrays for the environment from validated bars and their causal features.

    Args:
      df: bars with float columns ``open, high, low, close, volume`` (``T`` rows) and, for the
        synthetic market, ``oracle``.
      features: ``Features`` with ``values [T, F]`` and ``sigma [T]`` (NaN before warm-up is
        replaced by 0; those bars are never decision bars).
      env_cfg: ``cfg.env`` (uses ``adv_window``; checks volume when impact is on).

    Raises:
      ConfigError: impact is on (``env.impact_eta > 0``) but some bar's trailing dollar volume
        is zero, so ``traded / ADV`` is undefined.
      ValueError: ``features`` does not have one row per bar (a programming error).
    """
    num_bars = len(df)
    values = np.asarray(features.values, dtype=np.float32)
    sigma = np.asarray(features.sigma, dtype=np.float64)
    if values.ndim != 2 or values.shape[0] != num_bars or sigma.shape != (num_bars,):
        raise ValueError(
            f"features must have one row per bar: {num_bars} bars, "
            f"values {values.shape}, sigma {sigma.shape}"
        )
    col = {c: df[c].to_numpy(dtype=np.float64) for c in ("open", "high", "low", "close", "volume")}
    dollar = col["close"] * col["volume"]
    csum = np.concatenate([[0.0], np.cumsum(dollar)])
    idx = np.arange(num_bars)
    start = np.maximum(idx + 1 - int(env_cfg.adv_window), 0)
    adv = (csum[idx + 1] - csum[start]) / (idx + 1 - start)
    if env_cfg.impact_eta > 0 and np.any(adv <= 0):
        first = int(np.argmax(adv <= 0))
        raise ConfigError(
            f"env.impact_eta: square-root impact needs positive dollar volume, but the trailing "
            f"{env_cfg.adv_window}-bar volume at row {first} is zero (set env.impact_eta=0)"
        )
    oracle = df["oracle"].to_numpy(dtype=np.float64) if "oracle" in df else np.zeros(num_bars)
    f32 = lambda x: jnp.asarray(np.asarray(x, dtype=np.float32))
    return MarketData(
        open=f32(col["open"]),
        high=f32(col["high"]),
        low=f32(col["low"]),
        close=f32(col["close"]),
        volume=f32(col["volume"]),
        sigma=f32(np.nan_to_num(sigma, nan=0.0, posinf=0.0, neginf=0.0)),
        adv=f32(adv),
        features=jnp.asarray(values),
        oracle=f32(oracle),
    )


def with_episodes(market: MarketData, ranges: np.ndarray, weights: np.ndarray) -> MarketData:
    """``market`` whose training episodes draw instrument ``i`` with probability
    ``weights[i] / sum(weights)`` and then a start in its ``ranges[i]`` (int ``[I, 2]``).

    Raises:
      ValueError: shapes that disagree, an empty range, or weights that are not positive.
    """
    ranges = np.asarray(ranges, dtype=np.int64)
    weights = np.asarray(weights, dtype=np.float64)
    if ranges.ndim != 2 or ranges.shape[1] != 2 or weights.shape != (ranges.shape[0],):
        raise ValueError(
            f"with_episodes: ranges [I, 2] and weights [I], got {ranges.shape}, {weights.shape}"
        )
    if np.any(ranges[:, 1] <= ranges[:, 0]) or np.any(ranges < 0):
        raise ValueError(f"with_episodes: empty or negative ranges {ranges.tolist()}")
    if np.any(ranges[:, 1] > market.num_bars):
        raise ValueError("with_episodes: a range ends after the market's last bar")
    if not np.all(np.isfinite(weights)) or np.any(weights <= 0):
        raise ValueError(f"with_episodes: weights must be positive, got {weights.tolist()}")
    cdf = np.cumsum(weights) / weights.sum()
    cdf[-1] = 1.0
    return market.replace(
        episode_ranges=jnp.asarray(ranges, jnp.int32), episode_cdf=jnp.asarray(cdf, jnp.float32)
    )


def draw_episode_range(market: MarketData, key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(lo, hi)`` (int32 scalars) of the instrument a panel's new episode trades: ``i`` =
    the first index with ``u < cdf[i]``, ``u ~ U[0, 1)`` from ``key``."""
    u = jax.random.uniform(key, (), jnp.float32)
    i = jnp.minimum(jnp.sum(u >= market.episode_cdf), market.episode_cdf.shape[0] - 1)
    row = market.episode_ranges[i]
    return row[0], row[1]
