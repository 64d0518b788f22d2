"""A panel's market (E2, issue 29): every instrument's bars, features and splits in one set of
device arrays, so one compiled program can trade any instrument.

Instrument ``i`` (of ``I``, ordered by name) occupies rows ``[offset_i, offset_i + T_i)`` of the
concatenated :class:`~jaxdqn.market.env.MarketData`. Everything that looks at more than one
bar is computed inside each instrument before the concatenation: its splits (by date or by
fraction, :func:`jaxdqn.market.splits.split`), its causal features normalised on **its own**
train rows (:func:`jaxdqn.market.features.compute_features`), σ̂ and the trailing dollar volume
(:func:`jaxdqn.market.env.make_market`). Its first decision bar is ``offset_i +
first_decision`` (the features' warm-up plus the observation window), so no observation
window reaches into the previous instrument. :meth:`PanelPrepared.ranges` gives the ``[I, 2]``
global ``[lo, hi)`` decision ranges of a split, from which an episode picks an instrument and
then a start as a single instrument's episode does.

The bar clock is resolved on the instrument with the longest train split (every instrument has
the panel's one bar frequency, :func:`jaxdqn.market.panel.load_panel`).

An instrument with fewer than ``data.min_bars`` bars, or too few for one of its splits or the
warm-up, is dropped with a note when ``data.min_bars`` > 0, and refused by name otherwise.

:class:`PanelPrepared` answers what the trainer and the agent's builder ask of one
instrument's :class:`~jaxdqn.market.market.Prepared` (market, env parameters, clock, notes,
train closes); the walks read its instruments and :meth:`PanelPrepared.ranges`.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
import pandas as pd

from jaxdqn.config import Config, DataConfig
from jaxdqn.market import clock as clock_lib
from jaxdqn.market import data, env
from jaxdqn.market import features as features_lib
from jaxdqn.market import splits as splits_lib
from jaxdqn.market.decisions import SPLIT_NAMES, first_decision, resolve_clock
from jaxdqn.market.errors import DataError
from jaxdqn.market.market_data import with_episodes
from jaxdqn.market.panel import Panel

__all__ = ["SAMPLING", "Instrument", "PanelPrepared", "admit", "prepare_panel"]

_NOT_PER_BAR = ("episode_ranges", "episode_cdf", "reward_scale")
"""MarketData fields that are not ``[T, ...]`` arrays, so not concatenated."""


class Instrument(NamedTuple):
    """One instrument of a panel market.

    Attributes:
      name: the instrument's name.
      offset: its first row in the concatenated arrays.
      bars: its validated bars ``[T_i]``.
      splits: its train/val/test rows, in its own row numbers.
      features: its features, normalised on its own train rows.
    """

    name: str
    offset: int
    bars: pd.DataFrame
    splits: splits_lib.Splits
    features: features_lib.Features

    @property
    def num_bars(self) -> int:
        return len(self.bars)


class PanelPrepared(NamedTuple):
    """Everything the panel's programs read (the panel counterpart of
    :class:`~jaxdqn.market.market.Prepared`).

    Attributes:
      instruments: the instruments, ordered by name.
      market: their concatenated device arrays (``[sum T_i]`` rows).
      env_params: static environment parameters (``hold_orders`` for close-only panels).
      first_decision: the first decision bar within each instrument.
      bar_clock: the panel's bar clock.
      log_notes: log lines (the panel's, dropped instruments, then the clock's).
    """

    instruments: tuple[Instrument, ...]
    market: env.MarketData
    env_params: env.EnvParams
    first_decision: int
    bar_clock: clock_lib.BarClock
    log_notes: tuple[str, ...]

    is_panel = True

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.instruments)

    @property
    def bars_per_year(self) -> float:
        return self.bar_clock.bars_per_year

    @property
    def close_only(self) -> bool:
        return bool(self.env_params.hold_orders)

    @property
    def has_volume(self) -> bool:
        return all(data.info(i.bars)[1] for i in self.instruments)

    @property
    def num_features(self) -> int:
        return int(self.market.num_features)

    def notes(self) -> list[str]:
        return list(self.log_notes)

    def bar_range(self, split: str) -> tuple[int, int]:
        """The global rows ``[lo, hi)`` spanning every instrument's ``split`` (episodes draw
        their instrument's own range; this is only the agent's nominal range)."""
        r = self.ranges(split)
        return int(r[:, 0].min()), int(r[:, 1].max())

    def train_closes(self) -> list[np.ndarray]:
        """Each instrument's (float32) closes of its train split's decidable bars."""
        close = np.asarray(self.market.close)
        return [close[lo:hi] for lo, hi in self.ranges("train")]

    def dates_of(self, i: int) -> pd.DatetimeIndex:
        """Instrument ``i``'s bar timestamps ``[T_i]``."""
        return pd.DatetimeIndex(self.instruments[i].bars.index)

    def ranges(self, split: str, *, walk: bool = False) -> np.ndarray:
        """int32 ``[I, 2]``: each instrument's global ``[lo, hi)`` of ``split`` — the episode
        range of :meth:`Prepared.bar_range` or, with ``walk``, the walk range of
        :meth:`Prepared.eval_range` (the first decision one bar before the split)."""
        if split not in SPLIT_NAMES:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLIT_NAMES}")
        out = []
        for inst in self.instruments:
            lo, hi = getattr(inst.splits, split)
            lo = max(lo, self.first_decision)
            if walk:
                lo = max(lo - 1, self.first_decision)
            out.append((inst.offset + lo, inst.offset + hi))
        return np.asarray(out, dtype=np.int32)

    def instrument_of(self, row: int) -> int:
        """The index of the instrument holding global row ``row``."""
        offsets = np.array([i.offset for i in self.instruments])
        if not 0 <= row < self.market.num_bars:
            raise IndexError(f"row {row} outside the panel's {self.market.num_bars} rows")
        return int(np.searchsorted(offsets, row, side="right") - 1)


SAMPLING = ("length", "uniform")
"""How a training episode picks its instrument: in proportion to its train bars, or uniformly."""


def admit(
    panel: Panel, data_cfg: DataConfig, warmup: int
) -> tuple[list[tuple[str, pd.DataFrame, splits_lib.Splits]], list[str]]:
    """The instruments of ``panel`` that ``data_cfg``'s splits can cut (each with its splits) and
    the reasons of those dropped: an instrument with fewer than ``data.min_bars`` bars, or too
    few for one of its splits after the ``warmup``, is dropped when ``data.min_bars`` > 0.

    Raises:
      DataError: such an instrument when ``data.min_bars`` is 0 (naming it), or none left.
    """
    min_bars = data_cfg.min_bars
    kept, dropped = [], []
    for name, bars in zip(panel.names, panel.bars, strict=True):
        if len(bars) < min_bars:
            dropped.append(f"{name} ({len(bars)} bars < data.min_bars={min_bars})")
            continue
        try:
            sp = splits_lib.split(bars, data_cfg, warmup)
        except DataError as e:
            if min_bars > 0:
                dropped.append(f"{name} ({e})")
                continue
            raise DataError(f"instrument {name}: {e} (or set data.min_bars to drop it)") from None
        kept.append((name, bars, sp))
    if not kept:
        raise DataError(f"the panel has no instrument left: {'; '.join(dropped)}")
    return kept, dropped


def prepare_panel(cfg: Config, panel: Panel, sampling: str = "length") -> PanelPrepared:
    """The market of ``panel`` under ``cfg``'s data (splits), features, env and clock settings;
    its training episodes draw an instrument by ``sampling`` (:data:`SAMPLING`) and then a start
    in that instrument's train range (:func:`~jaxdqn.market.market_data.with_episodes`).

    Raises:
      DataError: an instrument too short for its splits or the features' warm-up (naming it),
        or a bar clock that cannot be inferred.
      ConfigError: an environment setting the data cannot support (impact without volume).
    """
    first = first_decision(cfg)
    kept, dropped = admit(panel, cfg.data, first)
    instruments, markets, offset = [], [], 0
    for name, bars, sp in kept:
        feats = features_lib.compute_features(bars, cfg.features, sp.train)
        markets.append(env.make_market(bars, feats, cfg.env))
        instruments.append(Instrument(name, offset, bars, sp, feats))
        offset += len(bars)
    drop_notes = [f"dropped instrument {d}" for d in dropped]
    longest = max(instruments, key=lambda i: i.splits.train[1] - i.splits.train[0])
    bar_clock = resolve_clock(longest.bars, cfg.data.bars_per_year, longest.splits.train)
    market = env.MarketData(
        **{  # the per-bar arrays; the episodes are set below, the reward scale at placement
            f.name: jnp.concatenate([getattr(m, f.name) for m in markets], axis=0)
            for f in dataclasses.fields(env.MarketData)
            if f.name not in _NOT_PER_BAR
        }
    )
    close_only = all(data.info(i.bars)[0] for i in instruments)
    env_params = env.EnvParams.from_config(cfg.env, cfg.features.window, hold_orders=close_only)
    clock_note = (
        f"panel of {len(instruments)} instruments: bar clock {bar_clock.bars_per_year:.6g} bars "
        f"a year ({bar_clock.rule}, on {longest.name}'s train split)"
    )
    notes = (*panel.notes, *drop_notes, clock_note)
    out = PanelPrepared(tuple(instruments), market, env_params, first, bar_clock, notes)
    train = out.ranges("train")
    if sampling not in SAMPLING:
        raise ValueError(f"sampling: {sampling!r} is not one of {SAMPLING}")
    weights = train[:, 1] - train[:, 0] if sampling == "length" else np.ones(len(train))
    return out._replace(market=with_episodes(market, train, weights))
