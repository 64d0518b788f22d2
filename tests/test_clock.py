"""E2 bar clock (issue 28): bars per year inferred from timestamps, the mixed-frequency check,
and every annualised number of an hourly market on its own clock."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from jaxdqn import config
from jaxdqn.evaluation import baselines
from jaxdqn.market import clock, market
from jaxdqn.market.data import DataError
from jaxdqn.program.report import run_statistics

WEEKS = 365.2425 / 7


def _hourly_fx(start="2017-01-02", weeks=52) -> pd.DatetimeIndex:
    """24 bars a day, Monday to Friday: 120 bars a week, 120 × 52.18 = 6,261 a year."""
    hours = pd.date_range(start, periods=weeks * 7 * 24, freq="h")
    return hours[hours.day_of_week < 5]


def _equity_5min(start="2019-01-02", days=260) -> pd.DatetimeIndex:
    """78 five-minute bars a session (09:30 .. 15:55), weekdays."""
    out = []
    for day in pd.bdate_range(start, periods=days):
        out.append(pd.date_range(day + pd.Timedelta("9h30min"), periods=78, freq="5min"))
    return out[0].append(out[1:])


def test_e2_clock_daily_business_days_is_exactly_252_and_a_7_day_market_365():
    b = clock.infer(pd.bdate_range("2001-01-01", periods=600))
    assert b == (252.0, True, b.rule) and "daily" in b.rule
    # holidays (4.8 bars a week, as the S&P) are still trading days
    days = pd.bdate_range("2001-01-01", periods=600)
    assert clock.infer(days.delete(np.arange(0, 600, 25))).bars_per_year == 252.0
    assert clock.infer(pd.date_range("2020-01-01", periods=400, freq="D")).bars_per_year == 365.0
    # a 6-day week: neither convention, the observed count
    six = pd.date_range("2020-01-01", periods=700, freq="D")
    six = six[six.day_of_week != 6]
    assert clock.infer(six).bars_per_year == pytest.approx(6 * WEEKS, rel=0.01)


@pytest.mark.parametrize(
    ("freq", "expected"), [("W-FRI", 52.0), ("MS", 12.0), ("QS", 4.0), ("YS", 1.0)]
)
def test_e2_clock_coarse_bars(freq, expected):
    assert clock.infer(pd.date_range("1990-01-01", periods=40, freq=freq)).bars_per_year == expected


@pytest.mark.parametrize(
    ("dates", "true"),
    [(_hourly_fx(), 24 * 5 * WEEKS), (_equity_5min(), 78 * 5 * WEEKS)],
    ids=["hourly_fx", "equity_5min"],
)
def test_e2_clock_intraday_is_bars_per_session_times_sessions_within_2_percent(dates, true):
    b = clock.infer(dates)
    assert b.inferred and "intraday" in b.rule
    assert abs(b.bars_per_year / true - 1) < 0.02, (b.bars_per_year, true)


def test_e2_clock_refuses_what_it_cannot_tell_and_a_set_number_is_used_as_is():
    with pytest.raises(clock.ClockError, match="spans"):
        clock.infer(pd.date_range("2020-01-01", periods=200, freq="h"))  # 8 days
    with pytest.raises(clock.ClockError, match="fit no known clock"):
        clock.infer(pd.date_range("2020-01-01", periods=60, freq="14D"))
    b = clock.resolve(8760, pd.bdate_range("2001-01-01", periods=600))
    assert b == (8760.0, False, b.rule) and "set" in b.rule


def test_e2_mixed_frequency_files_name_the_row_where_the_spacing_changes():
    days = pd.bdate_range("2020-01-01", periods=100)
    hours = pd.date_range(days[-1] + pd.Timedelta("1D"), periods=100, freq="h")
    assert clock.check_spacing(days) is None
    row, why = clock.check_spacing(days.append(hours))
    assert row == 101 and "1 d" in why and "1 h" in why  # the second hourly bar
    fx = _hourly_fx(weeks=8)
    assert clock.check_spacing(fx) is None  # weekends are not a change
    assert clock.check_spacing(_equity_5min(days=30)) is None  # nights neither
    daily_after = fx.append(pd.bdate_range(fx[-1] + pd.Timedelta("3D"), periods=20))
    row, why = clock.check_spacing(daily_after)
    assert row == len(fx) and "one a day" in why
    five = _equity_5min(days=20)
    hourly_after = five.append(
        pd.date_range(five[-1].normalize() + pd.Timedelta("1D 9h30min"), periods=7, freq="h")
    )
    row, _ = clock.check_spacing(hourly_after)
    assert row == len(five) + 1
    # weekly rows in a daily file
    weekly = pd.date_range(days[-1] + pd.Timedelta("7D"), periods=10, freq="7D")
    row, _ = clock.check_spacing(days.append(weekly))
    assert row == len(days)


def _hourly_csv(tmp_path, bars: pd.DatetimeIndex, seed=0, drift=2e-5, vol=1e-3):
    rng = np.random.default_rng(seed)
    r = drift + vol * rng.standard_normal(len(bars))
    close = 1.1 * np.exp(np.cumsum(r))
    open_ = np.concatenate([[1.1], close[:-1]]) * np.exp(1e-4 * rng.standard_normal(len(bars)))
    wick = np.abs(vol * rng.standard_normal((2, len(bars))))
    frame = pd.DataFrame(
        {
            "date": bars.strftime("%Y-%m-%d %H:%M:%S"),
            "open": open_,
            "high": np.maximum(open_, close) * (1 + wick[0]),
            "low": np.minimum(open_, close) * (1 - wick[1]),
            "close": close,
            "volume": rng.lognormal(10, 0.5, len(bars)),
        }
    )
    path = tmp_path / "eurusd_h1.csv"
    frame.to_csv(path, index=False)
    return path


def _independent(r: np.ndarray, ppy: float) -> dict[str, float]:
    """The annualised metrics of simple returns ``r`` at ``ppy`` bars a year, by hand."""
    wealth = np.cumprod(1 + r)
    peak = np.maximum.accumulate(np.concatenate([[1.0], wealth]))[1:]
    mdd = float(np.min((wealth - peak) / peak))
    cagr = wealth[-1] ** (ppy / len(r)) - 1
    down = math.sqrt(np.mean(np.minimum(r, 0) ** 2))
    return {
        "sharpe": r.mean() / r.std(ddof=1) * math.sqrt(ppy),
        "annual_volatility": r.std(ddof=1) * math.sqrt(ppy),
        "annual_return": cagr,
        "sortino": r.mean() * ppy / (down * math.sqrt(ppy)),
        "calmar": cagr / abs(mdd),
    }


@pytest.mark.parametrize("setting", ["auto", "set"])
def test_e2_hourly_market_annualises_every_number_on_its_own_clock(tmp_path, setting):
    bars = _hourly_fx(weeks=60)
    true = 24 * 5 * WEEKS
    path = _hourly_csv(tmp_path, bars)
    overrides = [
        "data.source=csv",
        f"data.path={path}",
        "data.split=fraction",
        "data.train_frac=0.6",
        "data.val_frac=0.2",
        "env.impact_eta=0",
    ]
    if setting == "set":
        overrides.append(f"data.bars_per_year={true!r}")
    cfg = config.load(None, overrides)
    p = market.prepare(cfg)
    ppy = p.bars_per_year
    if setting == "set":
        assert ppy == true and not p.bar_clock.inferred
    else:
        assert p.bar_clock.inferred and abs(ppy / true - 1) < 0.02, ppy
    logs = {}
    table = baselines.run_baselines(cfg, p, logs=logs)
    for name in ("buy_and_hold", "momentum", "vol_target"):
        log = logs[(name, "test")]
        ref = _independent(log["return"].to_numpy(np.float64), ppy)
        for k, v in ref.items():
            assert table.loc[name, ("test", k)] == pytest.approx(v, rel=1e-9, abs=1e-12), (name, k)
        turnover = np.mean(np.abs(log["traded"].to_numpy(np.float64)))
        assert table.loc[name, ("test", "annual_turnover")] == pytest.approx(turnover * ppy, 1e-9)
    # 252 would have understated buy-and-hold's volatility by sqrt(6261 / 252) ≈ 5×
    bh = table.loc["buy_and_hold", ("test", "annual_volatility")]
    at_252 = logs[("buy_and_hold", "test")]["return"].std(ddof=1) * math.sqrt(252)
    assert bh / at_252 == pytest.approx(math.sqrt(ppy / 252), rel=1e-9)
    # the statistics (bootstrap intervals, DSR) annualise on the same clock: at ppy and at 252
    # the same draws give Sharpes in the ratio sqrt(ppy / 252); the PSRs do not depend on it
    seed_logs = [logs[("momentum", "test")]]
    trials = (np.array([0.5, 1.0, 1.5]), "three trials")
    at = {
        b: run_statistics.split_statistics(
            cfg, seed_logs, logs, "test", trials, bars_per_year=b, reps=50
        )
        for b in (ppy, 252.0)
    }
    one, base = at[ppy]["seeds"][0], at[252.0]["seeds"][0]
    for k in ("sharpe", "sharpe_low", "sharpe_high"):
        if one[k] is not None:
            assert one[k] / base[k] == pytest.approx(math.sqrt(ppy / 252), rel=1e-9), k
    assert one["psr_zero"] == pytest.approx(base["psr_zero"], rel=1e-12)
    assert one["sharpe"] == pytest.approx(table.loc["momentum", ("test", "sharpe")], rel=1e-9)
    # the vol-targeted long sizes on the same clock: its realised volatility is near its target
    vt = table.loc["vol_target", ("test", "annual_volatility")]
    assert 0.5 * cfg.baselines.vol_target < vt < 1.5 * cfg.baselines.vol_target


def test_e2_a_mixed_frequency_file_is_one_data_error(tmp_path):
    days = pd.bdate_range("2015-01-01", periods=400)
    hours = pd.date_range(days[-1] + pd.Timedelta("1D"), periods=300, freq="h")
    path = _hourly_csv(tmp_path, days.append(hours))
    cfg = config.load(None, ["data.source=csv", f"data.path={path}", "data.split=fraction"])
    with pytest.raises(DataError) as info:
        market.prepare(cfg)
    msg = str(info.value)
    assert "\n" not in msg and "row 401" in msg and "one frequency" in msg, msg
