"""E2 features: hand-computed values, train-only normalisation, and no look-ahead."""

from __future__ import annotations

import math
import time

import numpy as np
import pandas as pd
import pytest

from jaxdqn.config import DataConfig, FeatureConfig, SyntheticConfig
from jaxdqn.market import data, splits
from jaxdqn.market import features as F
from jaxdqn.market.data import COLUMNS, DataError


@pytest.fixture(scope="module")
def sp500() -> pd.DataFrame:
    return data.load_ohlcv("sp500")


def _bars(n: int, seed: int) -> pd.DataFrame:
    """Consistent random bars with varied volume (a small, fully random OHLCV series)."""
    df = data.synthetic(SyntheticConfig(num_bars=n, seed=seed, vol=0.02, volume_sigma=0.8))
    return df[list(COLUMNS)]


def _perturb_after(df: pd.DataFrame, t: int, seed: int) -> pd.DataFrame:
    """Replace every bar after t by an unrelated consistent path continuing from close[t].

    Prices of a different random market are rescaled so their close at t equals ours, which
    keeps open[t+1] / close[t] a plausible gap and every bar OHLC-consistent; volume is
    replaced by an unrelated lognormal series 10x larger.
    """
    other = data.synthetic(
        SyntheticConfig(num_bars=len(df), seed=seed, vol=0.03, phi=-0.4, volume_sigma=1.0)
    )
    out = df.copy()
    k = df["close"].iloc[t] / other["close"].iloc[t]
    for c in ("open", "high", "low", "close"):
        out.iloc[t + 1 :, out.columns.get_loc(c)] = other[c].to_numpy()[t + 1 :] * k
    out.iloc[t + 1 :, out.columns.get_loc("volume")] = other["volume"].to_numpy()[t + 1 :] * 10
    data.validate_ohlcv(out, "perturbed")
    return out


# ---------------------------------------------------------------------------------------------
# Shapes, names, warmup
# ---------------------------------------------------------------------------------------------


def test_e2_features_on_sp500(sp500):
    cfg = FeatureConfig()
    s = splits.split(sp500, DataConfig(), F.warmup_length(cfg) + cfg.window - 1)
    f = F.compute_features(sp500, cfg, s.train)
    assert f.names == F.FEATURE_NAMES and len(f.names) == 11
    assert f.warmup == 49 == F.warmup_length(cfg)
    assert f.values.shape == (5031, 11) and f.values.dtype == np.float32
    assert f.sigma.shape == (5031,) and f.sigma.dtype == np.float64
    assert f.mean.shape == f.std.shape == (11,)
    assert f.mean.dtype == f.std.dtype == np.float64
    assert np.all(f.values[: f.warmup] == 0.0)
    assert np.isfinite(f.values).all() and np.isfinite(f.sigma).all()
    assert np.abs(f.values).max() <= cfg.clip
    # Train rows after the warmup are standardised (before clipping: mean 0, std 1).
    raw, _ = F.raw_features(sp500, cfg)
    z = (raw[f.warmup : s.train[1]] - f.mean) / f.std
    np.testing.assert_allclose(z.mean(0), 0.0, atol=1e-9)
    np.testing.assert_allclose(z.std(0), 1.0, atol=1e-9)
    # Daily S&P vol: about 1% typically, above 4% in October 2008.
    assert 0.005 < np.median(f.sigma[f.warmup :]) < 0.015
    assert f.sigma[sp500.index.get_loc(pd.Timestamp("2008-10-28"))] > 0.04


def test_e2_warmup_follows_vol_span():
    assert F.warmup_length(FeatureConfig(vol_span=20)) == 49
    assert F.warmup_length(FeatureConfig(vol_span=80)) == 81
    df = _bars(300, 0)
    f = F.compute_features(df, FeatureConfig(vol_span=80), (0, 200))
    assert f.warmup == 81 and np.all(f.values[:81] == 0) and np.any(f.values[81] != 0)


def test_e2_features_fast():
    df = _bars(5000, 1)
    cfg = FeatureConfig(gap=True)
    best = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        F.compute_features(df, cfg, (0, 3500))
        best = min(best, time.perf_counter() - t0)
    assert best < 0.25, best


# ---------------------------------------------------------------------------------------------
# Hand-computed values
# ---------------------------------------------------------------------------------------------


def _ewm_mean(x: list[float], alpha: float) -> float:
    """sum_i (1-alpha)^i x_{t-i} / sum_i (1-alpha)^i over the whole list (last = newest)."""
    w = [(1 - alpha) ** i for i in range(len(x))]
    return sum(wi * xi for wi, xi in zip(w, reversed(x), strict=True)) / sum(w)


def test_e2_features_hand_computed():
    df = _bars(90, 5)
    o, h, lo, c, v = (df[k].tolist() for k in COLUMNS)
    cfg = FeatureConfig(gap=True)
    raw, sigma = F.raw_features(df, cfg)
    col = {name: raw[:, j] for j, name in enumerate(F.feature_names(cfg))}
    span = cfg.vol_span
    r = [math.log(c[0] / o[0])] + [math.log(c[i] / c[i - 1]) for i in range(1, 90)]

    def sig(t: int, sp: int = span) -> float:
        return math.sqrt(_ewm_mean([x * x for x in r[: t + 1]], 2 / (sp + 1)))

    for t in (0, 1, 7, 48, 60, 89):
        assert sigma[t] == pytest.approx(sig(t), rel=1e-12)
    for t in (49, 63, 89):
        s_t, s_p = sig(t), sig(t - 1)
        assert col["ret_1"][t] == pytest.approx(r[t] / s_p, rel=1e-10)
        assert col["ret_5"][t] == pytest.approx(math.log(c[t] / c[t - 5]) / (s_p * 5**0.5))
        assert col["ret_20"][t] == pytest.approx(math.log(c[t] / c[t - 20]) / (s_p * 20**0.5))
        assert col["log_vol"][t] == pytest.approx(math.log(s_t), rel=1e-12)
        assert col["vol_ratio"][t] == pytest.approx(math.log(sig(t, 5) / s_t), rel=1e-9)
        ups = _ewm_mean([max(x, 0.0) for x in r[1 : t + 1]], 1 / 14)
        downs = _ewm_mean([max(-x, 0.0) for x in r[1 : t + 1]], 1 / 14)
        assert col["rsi"][t] == pytest.approx((ups - downs) / (ups + downs), rel=1e-9)
        for n in (10, 50):
            sma = sum(c[t - n + 1 : t + 1]) / n
            assert col[f"ma_{n}"][t] == pytest.approx(math.log(c[t] / sma) / s_t, rel=1e-9)
        assert col["range"][t] == pytest.approx(math.log(h[t] / lo[t]) / s_p, rel=1e-12)
        assert col["clv"][t] == pytest.approx((2 * c[t] - h[t] - lo[t]) / (h[t] - lo[t]))
        assert col["gap"][t] == pytest.approx(math.log(o[t] / c[t - 1]) / s_p, rel=1e-12)
        lv = [math.log1p(x) for x in v[t - 19 : t + 1]]
        mu = sum(lv) / 20
        sd = math.sqrt(sum((x - mu) ** 2 for x in lv) / 20)
        assert col["volume_z"][t] == pytest.approx((lv[-1] - mu) / sd, rel=1e-8)
    assert np.isnan(raw[:49]).all() and np.isfinite(raw[49:]).all()


def test_e2_features_edge_cases():
    # A rising market: every return up -> rsi = +1, price above its averages.
    n = 80
    c = 100.0 * np.exp(0.01 * np.arange(n))
    o = np.concatenate([[c[0]], c[:-1]])
    df = pd.DataFrame(
        {"open": o, "high": c, "low": o, "close": c, "volume": np.full(n, 5.0)},
        index=pd.bdate_range("2020-01-01", periods=n, name="date"),
    )
    raw, sigma = F.raw_features(df, FeatureConfig())
    col = {name: raw[:, j] for j, name in enumerate(F.FEATURE_NAMES)}
    np.testing.assert_allclose(col["rsi"][49:], 1.0)
    np.testing.assert_allclose(col["clv"][49:], 1.0)  # closes at the high
    np.testing.assert_allclose(col["volume_z"][49:], 0.0)  # constant volume: z = 0, not NaN
    np.testing.assert_allclose(col["ret_1"][49:], 0.01 / sigma[48:-1], rtol=1e-9)
    assert (col["ma_10"][49:] > 0).all()
    # Flat prices and zero volume: everything finite (sigma floored, rsi/clv/volume_z = 0).
    flat = pd.DataFrame(
        {"open": 1.0, "high": 1.0, "low": 1.0, "close": 1.0, "volume": 0.0},
        index=pd.bdate_range("2020-01-01", periods=n, name="date"),
    )
    f = F.compute_features(flat, FeatureConfig(), (0, 70))
    assert np.isfinite(f.values).all() and np.all(f.sigma == 0.0)


def test_e2_gap_feature_is_optional():
    df = _bars(120, 2)
    f0 = F.compute_features(df, FeatureConfig(), (0, 100))
    f1 = F.compute_features(df, FeatureConfig(gap=True), (0, 100))
    assert f1.names == (*F.FEATURE_NAMES, "gap") and f1.values.shape == (120, 12)
    np.testing.assert_array_equal(f1.values[:, :11], f0.values)


def test_e2_autocorr_feature_is_optional_and_matches_a_hand_computed_ewma():
    """Off by default (the feature set unchanged); on, one column more whose row t is the
    EWMA of x_i x_{i-1} over the EWMA of x_i² (span 60) computed here by hand."""
    df = _bars(400, 4)
    f0 = F.compute_features(df, FeatureConfig(), (0, 300))
    f1 = F.compute_features(df, FeatureConfig(autocorr_span=60), (0, 300))
    assert f0.names == F.FEATURE_NAMES
    assert f1.names == (*F.FEATURE_NAMES, "autocorr") and f1.warmup == 60
    raw0, _ = F.raw_features(df, FeatureConfig())
    raw, _ = F.raw_features(df, FeatureConfig(autocorr_span=60))
    np.testing.assert_array_equal(raw[60:, :11], raw0[60:, :11])  # the others unchanged
    assert np.all(np.isnan(raw[:60]))  # the warmup grew to the span
    # x_t = ret_1 = r_t / s_{t-1}, defined from row 1 (raw hides rows before the warmup, so
    # rebuild it; it equals raw's column where raw shows it)
    log_c = np.log(df["close"].to_numpy())
    sig = np.maximum(F.causal_sigma(df, 20), F.SIGMA_FLOOR)
    x = np.full(len(df), np.nan)
    x[1:] = np.diff(log_c) / sig[:-1]
    np.testing.assert_allclose(x[60:], raw0[60:, 0], rtol=1e-12)
    w = 1.0 - 2.0 / 61.0
    for t in (60, 61, 200, 399):
        rows = range(2, t + 1)  # every row with x_i and x_{i-1} defined
        num = sum(w ** (t - i) * x[i] * x[i - 1] for i in rows)
        den = sum(w ** (t - i) * x[i] * x[i] for i in rows)
        assert raw[t, -1] == pytest.approx(num / den, rel=1e-10)


def test_e2_autocorr_keeps_absolute_units_where_other_features_are_centred():
    """The autocorrelation is divided by AUTOCORR_SCALE, not centred on the train mean: an
    AR(1) market with phi 0.3 keeps its ~3 units, one without a signal ~0, so a panel
    normalised per instrument can still tell them apart."""
    cfg = FeatureConfig(autocorr_span=200)
    out = {}
    for phi in (0.0, 0.3):
        df = data.synthetic(SyntheticConfig(num_bars=6000, seed=11, phi=phi))
        f = F.compute_features(df, cfg, (0, 4000))
        j = f.names.index("autocorr")
        assert (f.mean[j], f.std[j]) == (0.0, F.AUTOCORR_SCALE)
        out[phi] = f.values[f.warmup : 4000, j].mean()
        # every other feature is centred on its train rows
        assert abs(f.values[f.warmup : 4000, 0].mean()) < 1e-5
    assert abs(out[0.0]) < 0.5 and 2.3 < out[0.3] < 3.3, out


def test_e2_autocorr_span_too_short_is_refused():
    from jaxdqn import config

    with pytest.raises(config.ConfigError, match=r"features\.autocorr_span: 5 bars cannot"):
        config.load(None, ["features.autocorr_span=5"])


def test_e2_features_carry_the_planted_signal():
    df = data.synthetic(SyntheticConfig(num_bars=4000, seed=3, phi=0.15))
    f = F.compute_features(df, FeatureConfig(), (0, 2800))
    r = np.diff(np.log(df["close"].to_numpy()))  # r[t] = r_{t+1}
    w = f.warmup
    ret_1 = f.values[w:-1, f.names.index("ret_1")]
    assert np.corrcoef(ret_1, r[w:])[0, 1] > 0.1


def test_e2_normaliser_needs_train_rows():
    df = _bars(200, 0)
    with pytest.raises(DataError, match="warmup of 49"):
        F.compute_features(df, FeatureConfig(), (0, 50))


# ---------------------------------------------------------------------------------------------
# Train-only normalisation and causality
# ---------------------------------------------------------------------------------------------


def test_e2_normaliser_fitted_on_train_only(sp500):
    cfg = FeatureConfig()
    s = splits.split(sp500, DataConfig(), F.warmup_length(cfg))
    f = F.compute_features(sp500, cfg, s.train)
    # Rewrite val and test completely: the statistics do not move.
    other = _perturb_after(sp500, s.train[1] - 1, seed=9)
    g = F.compute_features(other, cfg, s.train)
    np.testing.assert_array_equal(g.mean, f.mean)
    np.testing.assert_array_equal(g.std, f.std)
    np.testing.assert_array_equal(g.values[: s.train[1]], f.values[: s.train[1]])
    assert not np.array_equal(g.values[s.val[0] :], f.values[s.val[0] :])
    # ...while changing a train bar does move them (the test above can fail).
    h = F.compute_features(_perturb_after(sp500, s.train[1] - 300, seed=9), cfg, s.train)
    assert not np.array_equal(h.mean, f.mean)


@pytest.mark.parametrize(("gap", "autocorr_span"), [(False, 0), (True, 0), (False, 100)])
def test_e2_no_lookahead(sp500, gap, autocorr_span):
    """Perturb every bar after t: no feature (raw or normalised) and no sigma at <= t moves."""
    cfg = FeatureConfig(gap=gap, autocorr_span=autocorr_span)
    df = sp500.iloc[:1500]
    raw, sigma = F.raw_features(df, cfg)
    train = (0, 1000)
    base = F.compute_features(df, cfg, train)
    for k, t in enumerate((0, 5, 30, 48, 49, 50, 400, 999, 1200, 1498)):
        other = _perturb_after(df, t, seed=100 + k)
        raw2, sigma2 = F.raw_features(other, cfg)
        np.testing.assert_array_equal(raw2[: t + 1], raw[: t + 1])
        np.testing.assert_array_equal(sigma2[: t + 1], sigma[: t + 1])
        z2 = F.normalise(raw2, base.mean, base.std, cfg.clip, base.warmup)
        np.testing.assert_array_equal(z2[: t + 1], base.values[: t + 1])
        # The perturbation is real: later rows do change.
        assert not np.allclose(sigma2[t + 1 :], sigma[t + 1 :])
        if t + 1 >= base.warmup:
            assert not np.allclose(raw2[t + 1 :], raw[t + 1 :])
        if t + 1 >= train[1]:  # whole pipeline: train untouched, so nothing at <= t moves
            f2 = F.compute_features(other, cfg, train)
            np.testing.assert_array_equal(f2.values[: t + 1], base.values[: t + 1])
            np.testing.assert_array_equal(f2.mean, base.mean)


def test_e2_no_lookahead_per_row(sp500):
    """Each feature row t equals the features of the data truncated at t (prefix invariance)."""
    cfg = FeatureConfig(gap=True, autocorr_span=60)
    df = sp500.iloc[:400]
    raw, sigma = F.raw_features(df, cfg)
    for t in (60, 61, 150, 399):
        raw_t, sigma_t = F.raw_features(df.iloc[: t + 1], cfg)
        np.testing.assert_array_equal(raw_t, raw[: t + 1])
        np.testing.assert_array_equal(sigma_t, sigma[: t + 1])
