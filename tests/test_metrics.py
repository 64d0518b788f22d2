"""E3 metrics: hand-computed cases, degenerate inputs, and equality with empyrical."""

from __future__ import annotations

import math
import warnings

import empyrical
import numpy as np
import pytest

from jaxdqn.evaluation import metrics
from jaxdqn.market import data

PPY = 252


def _empyrical(r: np.ndarray, ppy: int = PPY) -> dict[str, float]:
    return {
        "sharpe": empyrical.sharpe_ratio(r, annualization=ppy),
        "sortino": empyrical.sortino_ratio(r, annualization=ppy),
        "max_drawdown": empyrical.max_drawdown(r),
        "annual_return": empyrical.annual_return(r, annualization=ppy),
        "annual_volatility": empyrical.annual_volatility(r, annualization=ppy),
        "calmar": empyrical.calmar_ratio(r, annualization=ppy),
    }


def _assert_matches_empyrical(r: np.ndarray, ppy: int = PPY) -> None:
    ours = metrics.performance(r, ppy)
    ref = _empyrical(r, ppy)
    for k, v in ref.items():
        assert math.isfinite(v), (k, v)
        np.testing.assert_allclose(ours[k], v, rtol=1e-6, atol=1e-9, err_msg=k)
    # hit rate has no empyrical counterpart: the share of gaining bars among non-zero bars.
    nz = r[r != 0]
    assert ours["hit_rate"] == pytest.approx(np.mean(nz > 0), abs=1e-12)


def test_e3_metrics_hand_computed_one_year():
    # ppy = 4 and four bars: one year, so CAGR is the total return.
    r = np.array([0.1, -0.1, 0.0, 0.2])
    m = metrics.performance(
        r, 4, positions=np.array([1.0, -1.0, 0.0, 0.5]), traded=np.array([1.0, 2.0, 1.0, 0.5])
    )
    # wealth 1.1, 0.99, 0.99, 1.188; peak 1.1, 1.1, 1.1, 1.188 -> worst (0.99-1.1)/1.1 = -0.1
    assert m["max_drawdown"] == pytest.approx(-0.1, abs=1e-12)
    assert m["annual_return"] == pytest.approx(0.188, abs=1e-12)
    assert m["calmar"] == pytest.approx(1.88, abs=1e-10)
    # mean 0.05; squared deviations 0.0025+0.0225+0.0025+0.0225 = 0.05; var = 0.05/3 = 1/60
    # sharpe = 0.05 / sqrt(1/60) * sqrt(4) = sqrt(0.6); vol = sqrt(1/60) * 2
    assert m["sharpe"] == pytest.approx(math.sqrt(0.6), abs=1e-12)
    assert m["annual_volatility"] == pytest.approx(2 * math.sqrt(1 / 60), abs=1e-12)
    # downside deviation over all four bars: sqrt((0 + 0.01 + 0 + 0)/4) = 0.05
    # sortino = 0.05*4 / (0.05*sqrt(4)) = 2
    assert m["sortino"] == pytest.approx(2.0, abs=1e-12)
    # non-zero bars: +0.1, -0.1, +0.2 -> 2/3 (the zero bar is neither a win nor a loss)
    assert m["hit_rate"] == pytest.approx(2 / 3, abs=1e-12)
    assert m["exposure"] == pytest.approx((1 + 1 + 0 + 0.5) / 4, abs=1e-12)
    assert m["turnover"] == pytest.approx((1 + 2 + 1 + 0.5) / 4, abs=1e-12)
    assert m["annual_turnover"] == pytest.approx(4.5, abs=1e-12)


def test_e3_metrics_hand_computed_round_trip_loss():
    # +50% then -50%: wealth 1.5 then 0.75; drawdown from the 1.5 peak is -50%.
    m = metrics.performance([0.5, -0.5], periods_per_year=1)
    assert m["max_drawdown"] == pytest.approx(-0.5)
    assert m["annual_return"] == pytest.approx(math.sqrt(0.75) - 1)  # two years, 0.75 total
    assert m["calmar"] == pytest.approx((math.sqrt(0.75) - 1) / 0.5)
    assert m["sharpe"] == pytest.approx(0.0)
    assert m["sortino"] == pytest.approx(0.0)
    assert m["annual_volatility"] == pytest.approx(math.sqrt(0.5))
    assert m["hit_rate"] == pytest.approx(0.5)
    assert set(m) == set(metrics.RETURN_KEYS)  # no turnover/exposure without positions/traded


def test_e3_metrics_drawdown_from_first_bar_is_anchored_at_initial_wealth():
    # A loss on the very first bar is a drawdown from the starting equity of 1.
    m = metrics.performance([-0.2, 0.1, 0.1])
    assert m["max_drawdown"] == pytest.approx(-0.2)


def test_e3_metrics_degenerate_inputs_are_nan_or_zero_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        flat = metrics.performance(np.zeros(300), positions=np.zeros(300), traded=np.zeros(300))
        const = metrics.performance(np.full(10, 0.01))
        one = metrics.performance([0.05], positions=[1.0], traded=[1.0])
        empty = metrics.performance([], positions=[], traded=[])
    # all-zero returns (the flat strategy): undefined ratios NaN, defined quantities 0
    for k in ("sharpe", "sortino", "calmar", "hit_rate"):
        assert math.isnan(flat[k]), k
    for k in ("max_drawdown", "annual_return", "annual_volatility", "turnover", "exposure"):
        assert flat[k] == 0.0, k
    # constant positive returns: zero dispersion, no losing bar, no drawdown
    for k in ("sharpe", "sortino", "calmar"):
        assert math.isnan(const[k]), k
    assert const["annual_volatility"] == 0.0
    assert const["max_drawdown"] == 0.0
    assert const["annual_return"] == pytest.approx(1.01**252 - 1)
    assert const["hit_rate"] == 1.0
    # fewer than two bars: every return metric NaN
    for k in metrics.RETURN_KEYS:
        assert math.isnan(one[k]) and math.isnan(empty[k]), k
    assert one["turnover"] == 1.0 and one["exposure"] == 1.0
    assert math.isnan(empty["turnover"]) and math.isnan(empty["exposure"])


def test_e3_metrics_total_loss_is_minus_one_annual_return():
    m = metrics.performance([0.1, -1.0, 0.0])
    assert m["annual_return"] == -1.0
    assert m["max_drawdown"] == pytest.approx(-1.0)


def test_e3_metrics_reject_bad_shapes():
    with pytest.raises(ValueError, match="returns"):
        metrics.performance(np.zeros((3, 2)))
    with pytest.raises(ValueError, match="periods_per_year"):
        metrics.performance(np.zeros(3), periods_per_year=0)


def test_e3_metrics_equal_empyrical_on_real_sp500():
    close = data.load_ohlcv("sp500")["close"].to_numpy()
    r = close[1:] / close[:-1] - 1.0
    assert r.shape == (5030,)
    _assert_matches_empyrical(r)
    _assert_matches_empyrical(-0.5 * r)  # a half-size short: negative drift, large drawdown
    _assert_matches_empyrical(r[-756:], ppy=252)  # the test-split years alone
    _assert_matches_empyrical(r[:1000], ppy=52)  # another annualisation


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_e3_metrics_equal_empyrical_on_random_series(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(50, 3000))
    drift = [-0.001, -0.0002, 0.0, 0.0003, 0.001][seed]
    r = drift + 0.01 * rng.standard_t(df=4, size=n) * (1 + seed) / 2
    r[rng.random(n) < 0.1] = 0.0  # flat bars, as a strategy that is sometimes out produces
    _assert_matches_empyrical(r)


def test_e3_metrics_nan_bars_are_missing_as_in_empyrical():
    rng = np.random.default_rng(7)
    r = rng.normal(0.0002, 0.01, 500)
    r[[3, 100, 499]] = np.nan
    ours = metrics.performance(r)
    for k, v in _empyrical(r).items():
        np.testing.assert_allclose(ours[k], v, rtol=1e-6, err_msg=k)


def test_o5_sharpe_se_formula():
    """SE of an annualised Sharpe from n i.i.d. returns (Lo 2002): with s = sharpe/sqrt(ppy),
    SE = sqrt((1 + s²/2)/n) · sqrt(ppy)."""
    assert metrics.sharpe_se(0.0, 600, 252) == pytest.approx(math.sqrt(252 / 600))  # ≈ 0.648
    assert metrics.sharpe_se(0.0, 6000, 252) == pytest.approx(math.sqrt(252 / 6000))  # ≈ 0.205
    s = 2.0 / math.sqrt(252)
    want = math.sqrt((1 + s * s / 2) / 1000) * math.sqrt(252)
    assert metrics.sharpe_se(2.0, 1000, 252) == pytest.approx(want, rel=1e-12)
    assert metrics.sharpe_se(-2.0, 1000, 252) == metrics.sharpe_se(2.0, 1000, 252)
    assert metrics.sharpe_se(1.0, 50, 1) == pytest.approx(math.sqrt(1.5 / 50))
    # a non-finite Sharpe counts as 0; fewer than two returns: no information
    assert metrics.sharpe_se(math.nan, 600, 252) == metrics.sharpe_se(0.0, 600, 252)
    assert metrics.sharpe_se(0.5, 1, 252) == math.inf


@pytest.mark.parametrize(
    ("sharpe", "n", "ppy"),
    [(1.5, 600, 252), (0.0, 250, 252), (1.0, 200, 1)],  # the last: s = 1 per period
)
def test_o5_sharpe_se_matches_monte_carlo(sharpe, n, ppy):
    """The spread of Sharpe estimates over many i.i.d. normal return series with a known
    Sharpe is sharpe_se within 10 % (Sharpe as in performance: mean/std(ddof=1)·sqrt(ppy))."""
    rng = np.random.default_rng(7)
    reps, sigma = 20000, 0.01
    mu = sharpe / math.sqrt(ppy) * sigma
    r = rng.normal(mu, sigma, size=(reps, n))
    est = r.mean(1) / r.std(1, ddof=1) * math.sqrt(ppy)
    np.testing.assert_allclose(est.mean(), sharpe, atol=0.05 * max(1.0, sharpe))
    one = metrics.performance(r[0], ppy)["sharpe"]
    np.testing.assert_allclose(one, est[0], rtol=1e-9)  # the estimator is performance's
    assert est.std() == pytest.approx(metrics.sharpe_se(sharpe, n, ppy), rel=0.1)
