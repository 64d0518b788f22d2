"""Strictly causal bar features and the volatility estimate sigma_hat (E2).

Row t of every output depends on bars 0..t only (a test perturbs every bar after t and checks
that nothing at or before t moves). Features are normalised with the mean and standard
deviation of the train rows only, then clipped.

Notation: O, H, L, C, V are the bar's open, high, low, close, volume; r_t = log(C_t / C_{t-1})
(t >= 1) is the close-to-close log return; sigma_t is the EWMA volatility below and
s_t = max(sigma_t, SIGMA_FLOOR). Returns, trend distances and ranges are measured in units of
per-bar volatility, which keeps them comparable across calm and turbulent regimes (the S&P train
split contains 2008; raw returns normalised on it would put every calm year near zero).

=============  ============================================================  =============
name           definition at row t                                           first valid t
=============  ============================================================  =============
ret_1          r_t / s_{t-1}                                                 vol_span + 1
ret_5          log(C_t / C_{t-5}) / (s_{t-1} sqrt 5)                         vol_span + 1
ret_20         log(C_t / C_{t-20}) / (s_{t-1} sqrt 20)                       max(20, vs+1)
log_vol        log s_t                                                       vol_span
vol_ratio      log(s5_t / s_t); s5 = the same EWMA with span 5               vol_span
rsi            (U_t - D_t) / (U_t + D_t) in [-1, 1] = (RSI - 50) / 50;        14
               U, D = EWMA(alpha 1/14) of max(r, 0), max(-r, 0)
ma_10, ma_50   log(C_t / SMA_n(C)_t) / s_t                                   max(n-1, vs)
range          log(H_t / L_t) / s_{t-1}   (~ (H - L) / C in vol units)       vol_span + 1
clv            (2 C_t - H_t - L_t) / (H_t - L_t) in [-1, 1] (0 if H = L)     0
volume_z       (lv_t - mean_20(lv)_t) / std_20(lv)_t, lv = log(1 + V);        19
               0 when the 20-bar std is 0 (e.g. no volume data)
gap            log(O_t / C_{t-1}) / s_{t-1}   (overnight gap; only with      vol_span + 1
               ``features.gap = true``)
autocorr       EWMA_n(x_t x_{t-1}) / EWMA_n(x_t^2), x_t = ret_1, n =          autocorr_span
               ``features.autocorr_span`` (only when > 0): the lag-1
               autocorrelation of recent returns, in [-1, 1] up to the
               EWMAs' difference in support
=============  ============================================================  =============

The gap is off by default: in the bundled S&P 500 series (as published by Yahoo) the open
equals the previous close on ~96% of days before 2006 and almost never after, so a gap feature
would mostly tell the network which era it is in. Turn it on for data with real opens.

The autocorrelation is off by default. It is the one feature kept in absolute units: it is
divided by :data:`AUTOCORR_SCALE` and never centred or scaled by its train statistics, because
on a panel those are fitted per instrument, and centring on an instrument's own train mean would
erase exactly what the feature measures (how strong that instrument's lag-1 dependence is: the
planted phi of a synthetic instrument, 0 on one without a signal). The other features measure
the current bar against the instrument's own history, which per-instrument normalisation keeps.

``warmup = max(49, vol_span + 1, autocorr_span)`` (49 at the defaults): the first row where every
feature is valid. All rolling windows end at t (trailing, inclusive).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import pandas as pd

from jaxdqn.config import FeatureConfig
from jaxdqn.market import data
from jaxdqn.market.data import COLUMNS, DataError

__all__ = [
    "ABSOLUTE_SCALES",
    "AUTOCORR_FEATURE",
    "AUTOCORR_SCALE",
    "FEATURE_NAMES",
    "GAP_FEATURE",
    "Features",
    "causal_sigma",
    "compute_features",
    "feature_names",
    "fit_normaliser",
    "has_volume",
    "lag1_autocorrelation",
    "normalise",
    "raw_features",
    "warmup_length",
]

FEATURE_NAMES: tuple[str, ...] = (
    "ret_1",
    "ret_5",
    "ret_20",
    "log_vol",
    "vol_ratio",
    "rsi",
    "ma_10",
    "ma_50",
    "range",
    "clv",
    "volume_z",
)
"""The default feature set, in column order; ``features.gap`` appends :data:`GAP_FEATURE`."""
GAP_FEATURE = "gap"
AUTOCORR_FEATURE = "autocorr"
AUTOCORR_SCALE = 0.1
"""The fixed unit of the autocorrelation feature (normalised value = autocorrelation / 0.1)."""
ABSOLUTE_SCALES: dict[str, float] = {AUTOCORR_FEATURE: AUTOCORR_SCALE}
"""Features normalised by a fixed unit instead of their train mean and std (module docstring)."""
RETURN_HORIZONS = (1, 5, 20)
MA_WINDOWS = (10, 50)
RSI_PERIOD = 14
FAST_VOL_SPAN = 5
VOLUME_WINDOW = 20
SIGMA_FLOOR = 1e-6
"""Lower bound on sigma where it divides (a constant price series would give 0/0)."""


class Features(NamedTuple):
    """Normalised causal features of one bar series.

    values: float32 [T, F], (raw - mean) / std clipped to [-clip, clip]; rows < warmup are 0.
    names: the F feature names (:func:`feature_names`: FEATURE_NAMES [+ "gap"]).
    warmup: first row whose features are all valid.
    sigma: float64 [T], causal per-bar volatility sigma_hat_t (a fraction; see
      :func:`causal_sigma`); defined on every row, reliable from ``warmup``.
    mean, std: float64 [F], fitted on train rows ``max(train.start, warmup) .. train.stop``.
    """

    values: np.ndarray
    names: tuple[str, ...]
    warmup: int
    sigma: np.ndarray
    mean: np.ndarray
    std: np.ndarray


VOLUME_FEATURE = "volume_z"


def feature_names(cfg: FeatureConfig, volume: bool = True) -> tuple[str, ...]:
    """Names of the feature columns ``cfg`` produces, in order; ``volume``: whether the bars
    have volume (without it :data:`VOLUME_FEATURE` is left out)."""
    names = (*FEATURE_NAMES, GAP_FEATURE) if cfg.gap else FEATURE_NAMES
    if cfg.autocorr_span:
        names = (*names, AUTOCORR_FEATURE)
    return names if volume else tuple(n for n in names if n != VOLUME_FEATURE)


def has_volume(df: pd.DataFrame) -> bool:
    """Whether the bars ``df`` came with volume (:func:`jaxdqn.market.data.info`)."""
    return data.info(df)[1]


def warmup_length(cfg: FeatureConfig) -> int:
    """First row index at which every feature is valid (see the module table)."""
    return max(
        MA_WINDOWS[-1] - 1,
        max(RETURN_HORIZONS),
        RSI_PERIOD,
        VOLUME_WINDOW - 1,
        cfg.vol_span + 1,
        cfg.autocorr_span,
    )


def _ewm_rms(x: pd.Series, span: int) -> np.ndarray:
    # adjust=True: weights w^i / sum_{j<=t} w^j over the observations so far, so early rows
    # are proper averages of what has been seen rather than biased towards zero.
    return np.sqrt(x.pow(2).ewm(span=span, adjust=True).mean().to_numpy())


def causal_sigma(df: pd.DataFrame, span: int) -> np.ndarray:
    """EWMA (RiskMetrics-style, zero mean) per-bar volatility, a fraction, float64 [T].

        sigma_t^2 = sum_{i=0}^{t} w^i r_{t-i}^2 / sum_{i=0}^{t} w^i,   w = 1 - 2 / (span + 1),

    with r_t = log(C_t / C_{t-1}) for t >= 1 and r_0 = log(C_0 / O_0) (the first bar's own
    move, so sigma_0 is defined). Uses bars <= t only.
    """
    close = df["close"].to_numpy(np.float64)
    open_ = df["open"].to_numpy(np.float64)
    r = np.empty_like(close)
    r[1:] = np.log(close[1:] / close[:-1])
    if len(r):
        r[0] = math.log(close[0] / open_[0])
    return _ewm_rms(pd.Series(r), span)


def lag1_autocorrelation(x: np.ndarray, span: int) -> np.ndarray:
    """Causal EWMA lag-1 autocorrelation of ``x`` (float64 [T], NaN before its first value):

        rho_t = sum_i w^i x_{t-i} x_{t-i-1} / sum_i w^i x_{t-i}^2,   w = 1 - 2 / (span + 1),

    both sums over the rows where ``x_{t-i}`` and ``x_{t-i-1}`` are defined (adjusted EWMAs:
    proper averages of what has been seen). Uncentred: returns in vol units have mean ~0. Rows
    <= t only; 0 where the denominator is 0; NaN before the first defined pair.
    """
    prev = np.concatenate([[np.nan], x[:-1]])
    pair = np.isfinite(x) & np.isfinite(prev)
    num = pd.Series(np.where(pair, x * prev, np.nan)).ewm(span=span, adjust=True).mean()
    den = pd.Series(np.where(pair, x * x, np.nan)).ewm(span=span, adjust=True).mean()
    num, den = num.to_numpy(), den.to_numpy()
    return np.where(
        den > 0, num / np.where(den > 0, den, 1.0), np.where(np.isnan(den), np.nan, 0.0)
    )


def raw_features(df: pd.DataFrame, cfg: FeatureConfig) -> tuple[np.ndarray, np.ndarray]:
    """Unnormalised causal features and sigma (volume left out of bars without it).

    Args:
      df: validated bars with columns open, high, low, close, volume (T rows).
      cfg: feature config (vol_span).

    Returns:
      ``(raw, sigma)``: raw float64 [T, F] in the order of :func:`feature_names`, NaN on rows
      before :func:`warmup_length`; sigma float64 [T] from :func:`causal_sigma`.
    """
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        name = df.attrs.get("source", "data")
        raise DataError(f"{name}: missing column {missing[0]!r} for features")
    o, h, lo, c, v = (df[k].to_numpy(np.float64) for k in COLUMNS)
    t_len = len(c)
    close = pd.Series(c)

    sigma = causal_sigma(df, cfg.vol_span)
    s = np.maximum(sigma, SIGMA_FLOOR)
    s_prev = np.concatenate([[np.nan], s[:-1]])
    log_c = np.log(c)

    def lag_diff(x: np.ndarray, k: int) -> np.ndarray:
        out = np.full(t_len, np.nan)
        out[k:] = x[k:] - x[:-k]
        return out

    cols: dict[str, np.ndarray] = {}
    for k in RETURN_HORIZONS:
        cols[f"ret_{k}"] = lag_diff(log_c, k) / (s_prev * math.sqrt(k))
    cols["log_vol"] = np.log(s)
    cols["vol_ratio"] = np.log(np.maximum(causal_sigma(df, FAST_VOL_SPAN), SIGMA_FLOOR) / s)

    r = pd.Series(lag_diff(log_c, 1))
    ups = r.clip(lower=0.0).ewm(alpha=1.0 / RSI_PERIOD, min_periods=RSI_PERIOD).mean()
    downs = (-r).clip(lower=0.0).ewm(alpha=1.0 / RSI_PERIOD, min_periods=RSI_PERIOD).mean()
    u, d = ups.to_numpy(), downs.to_numpy()
    tot = u + d
    cols["rsi"] = np.where(tot > 0, (u - d) / np.where(tot > 0, tot, 1.0), 0.0)
    cols["rsi"][np.isnan(tot)] = np.nan

    for n in MA_WINDOWS:
        sma = close.rolling(n, min_periods=n).mean().to_numpy()
        cols[f"ma_{n}"] = np.log(c / sma) / s

    cols["range"] = np.log(h / lo) / s_prev
    width = h - lo
    cols["clv"] = np.where(width > 0, (2.0 * c - h - lo) / np.where(width > 0, width, 1.0), 0.0)
    prev_c = np.concatenate([[np.nan], c[:-1]])
    cols["gap"] = np.log(o / prev_c) / s_prev

    lv = pd.Series(np.log1p(v))
    roll = lv.rolling(VOLUME_WINDOW, min_periods=VOLUME_WINDOW)
    mu, sd = roll.mean().to_numpy(), roll.std(ddof=0).to_numpy()
    flat = sd <= 1e-9 * np.maximum(np.abs(mu), 1.0)
    cols["volume_z"] = np.where(flat, 0.0, (lv.to_numpy() - mu) / np.where(flat, 1.0, sd))
    cols["volume_z"][np.isnan(sd)] = np.nan
    if cfg.autocorr_span:
        cols[AUTOCORR_FEATURE] = lag1_autocorrelation(cols["ret_1"], cfg.autocorr_span)

    names = feature_names(cfg, has_volume(df))
    raw = np.stack([cols[k] for k in names], axis=1)
    warmup = warmup_length(cfg)
    raw[:warmup] = np.nan
    bad = ~np.isfinite(raw[warmup:])
    if bad.any():
        i, j = np.argwhere(bad)[0]
        name = df.attrs.get("source", "data")
        when = df.index[warmup + i] if len(df.index) else warmup + i
        raise DataError(
            f"{name}: row {warmup + i} ({when}): feature {names[j]!r} is not finite "
            "(are the bars validated?)"
        )
    return raw, sigma


def fit_normaliser(
    raw: np.ndarray,
    warmup: int,
    train: tuple[int, int],
    names: tuple[str, ...] = (),
) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature mean and std (ddof 0) over train rows ``max(train[0], warmup) .. train[1]``.

    A feature constant on train gets std 1 (it is then only centred). A feature of ``names``
    (the columns' names) listed in :data:`ABSOLUTE_SCALES` gets mean 0 and its fixed unit as
    std instead. float64 [F] each.
    """
    lo, hi = max(train[0], warmup), train[1]
    if hi - lo < 2:
        raise DataError(
            f"features: the train rows {train[0]}..{train[1]} leave {max(hi - lo, 0)} rows after "
            f"the feature warmup of {warmup}; at least 2 are needed to fit the normaliser"
        )
    rows = raw[lo:hi]
    mean = rows.mean(axis=0)
    std = rows.std(axis=0)
    std = np.where(std > 1e-12, std, 1.0)
    for j, name in enumerate(names):
        if name in ABSOLUTE_SCALES:
            mean[j], std[j] = 0.0, ABSOLUTE_SCALES[name]
    return mean, std


def normalise(
    raw: np.ndarray, mean: np.ndarray, std: np.ndarray, clip: float, warmup: int
) -> np.ndarray:
    """float32 [T, F] = clip((raw - mean) / std, -clip, clip), rows before ``warmup`` set to 0."""
    z = np.clip((raw - mean) / std, -clip, clip)
    z[:warmup] = 0.0
    return z.astype(np.float32)


def compute_features(df: pd.DataFrame, cfg: FeatureConfig, train: tuple[int, int]) -> Features:
    """Causal features of ``df`` normalised with statistics of the train rows only.

    Args:
      df: validated bars (T rows), e.g. from :func:`jaxdqn.market.data.load`.
      cfg: feature config (vol_span, clip).
      train: the train split's half-open row range ``(start, stop)``.

    Returns:
      :class:`Features` with values float32 [T, F], F = len(feature_names(cfg, volume)) (11 by
      default; 10 for bars without volume).
    """
    raw, sigma = raw_features(df, cfg)
    warmup = warmup_length(cfg)
    names = feature_names(cfg, has_volume(df))
    mean, std = fit_normaliser(raw, warmup, train, names)
    values = normalise(raw, mean, std, cfg.clip, warmup)
    return Features(values, names, warmup, sigma, mean, std)
