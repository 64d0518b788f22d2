"""The synthetic market (E2): daily OHLCV bars with a planted AR(1) signal and its oracle."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from jaxdqn.config import SyntheticConfig
from jaxdqn.market.errors import DataError

__all__ = ["synthetic"]


def synthetic(cfg: SyntheticConfig) -> pd.DataFrame:
    """Daily OHLCV bars with a planted AR(1) signal, intrabar paths and the oracle's direction.

    Close-to-close log returns r_t = log(C_t / C_{t-1}) follow a stationary AR(1)
    ``r_t - mu = phi (r_{t-1} - mu) + eps_t``, eps_t ~ N(0, vol^2), started from its stationary
    law, with C_0 = start_price (r_0 := 0). The best one-bar forecast after bar t closes is
    E[r_{t+1} | r_t] = mu + phi (r_t - mu), so ``oracle[t] = sign(mu + phi (r_t - mu))`` for
    t >= 1 and 0 on the first bar. Overnight gap g_t ~ N(0, (gap_frac vol)^2), independent of
    the past (the edge is also there for orders at the next open): O_t = C_{t-1} e^{g_t}.

    High and low are the extrema of a discretised intrabar log-price path, a Brownian bridge
    from a = log O_t to b = log C_t in n = ``intrabar_steps`` steps with diffusion sd
    s = ``intrabar_vol`` * vol over the bar, ``X_k = a + (k/n)(b - a) + W_k - (k/n) W_n`` with
    ``W_k = z_1 + ... + z_k``, z_j ~ N(0, s^2/n), k = 0..n (so X_0 = a, X_n = b):
    H_t = exp(max_k X_k), L_t = exp(min_k X_k), so L <= min(O, C) <= max(O, C) <= H. As
    n -> inf, P(max_k X_k - max(a, b) > m) = exp(-2 m (m + |b - a|) / s^2) for m >= 0 (the
    bridge-maximum law; a path of n steps falls short of it by about 0.5826 s / sqrt(n)). The
    wicks shrink as the body |b - a| grows, and a buy limit below the open is reached mostly by
    paths that end lower: fills carry adverse selection, as in a real market. Volume is
    lognormal (median ``volume_median``, log-sd ``volume_sigma``); dates are business days from
    ``start_date``. Deterministic in ``cfg``: closes, gaps, volume and oracle come from
    ``default_rng(cfg.seed)`` with the draws of the generator before intrabar paths (so those
    columns are unchanged), the bridges from ``default_rng([cfg.seed, 1])``.

    Returns:
      DataFrame [num_bars] like :func:`load_ohlcv` plus float64 column ``oracle`` in {-1, 0, 1}.
    """
    try:
        dates = pd.bdate_range(start=pd.Timestamp(cfg.start_date), periods=cfg.num_bars)
    except Exception as e:
        raise DataError(f"synthetic: start_date {cfg.start_date!r} is not a date ({e})") from None
    if dates[-1] > pd.Timestamp.max:  # pandas counts nanoseconds: its calendar ends in 2262
        raise DataError(
            f"synthetic: {cfg.num_bars} business days from {cfg.start_date} run past "
            f"{pd.Timestamp.max.date()}; set an earlier data.synthetic.start_date"
        )
    n, phi, vol, mu = cfg.num_bars, cfg.phi, cfg.vol, cfg.drift
    rng = np.random.default_rng(cfg.seed)
    eps = rng.normal(0.0, vol, size=n)
    gaps = rng.normal(0.0, cfg.gap_frac * vol, size=n)
    rng.standard_normal(2 * n)  # the old independent wicks: dropped, but the stream is kept
    log_volume = rng.normal(math.log(cfg.volume_median), cfg.volume_sigma, size=n)

    # Deviations x_t = r_t - mu; x_1 drawn from the stationary law N(0, vol^2 / (1 - phi^2)).
    x = np.zeros(n)
    if n > 1:
        x0 = eps[1] / math.sqrt(1.0 - phi * phi)
        from scipy.signal import lfilter  # imported here: 0.6 s, only synthetic markets need it

        x[1:] = lfilter([1.0], [1.0, -phi], np.concatenate([[x0], eps[2:]]))
    r = np.where(np.arange(n) > 0, mu + x, 0.0)

    close = cfg.start_price * np.exp(np.cumsum(r))
    prev_close = np.concatenate([[cfg.start_price], close[:-1]])
    open_ = prev_close * np.exp(gaps)
    sd, bridge_rng = cfg.intrabar_vol * vol, np.random.default_rng([cfg.seed, 1])
    top, bottom = _bridge_extremes(np.log(open_), np.log(close), sd, cfg.intrabar_steps, bridge_rng)
    oracle = np.sign(mu + phi * (r - mu))
    oracle[0] = 0.0

    df = pd.DataFrame(
        {
            "open": open_,
            # exp(log(x)) need not round back to x: the ends are taken in again
            "high": np.maximum(np.exp(top), np.maximum(open_, close)),
            "low": np.minimum(np.exp(bottom), np.minimum(open_, close)),
            "close": close,
            "volume": np.exp(log_volume),
            "oracle": oracle.astype(np.float64),
        },
        index=pd.DatetimeIndex(dates, name="date").as_unit("ns"),
    )
    df.attrs["source"] = f"synthetic(seed={cfg.seed}, phi={phi})"
    return df


_BRIDGE_CHUNK = 1 << 20  # most path points (bars x steps) held in memory at once


def _bridge_extremes(a, b, sd: float, steps: int, rng: np.random.Generator):
    """(max, min) over k = 0..steps of the bridges X_k of :func:`synthetic` from ``a`` [N] to
    ``b`` [N], float64 [N] each. Drawn in chunks of bars, row by row in bar order, so the
    result does not depend on the chunk size and memory stays O(_BRIDGE_CHUNK)."""
    frac = np.arange(1, steps + 1, dtype=np.float64) / steps  # k/n for k = 1..n
    hi, lo = np.maximum(a, b), np.minimum(a, b)
    rows = max(1, _BRIDGE_CHUNK // steps)
    for i in range(0, a.shape[0], rows):
        j = min(i + rows, a.shape[0])
        walk = np.cumsum(rng.standard_normal((j - i, steps)), axis=1) * (sd / math.sqrt(steps))
        path = a[i:j, None] + frac * (b[i:j] - a[i:j])[:, None] + walk - frac * walk[:, -1:]
        np.maximum(hi[i:j], path.max(axis=1), out=hi[i:j])
        np.minimum(lo[i:j], path.min(axis=1), out=lo[i:j])
    return hi, lo
