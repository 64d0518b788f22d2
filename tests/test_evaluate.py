"""E3 evaluator: the per-bar log, its bookkeeping on hand-built bars, determinism, metrics; the
cost stress (jaxdqn.evaluation.cost_stress)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

from jaxdqn import config
from jaxdqn.evaluation import cost_stress, metrics
from jaxdqn.evaluation import walk as evaluate
from jaxdqn.market import env
from jaxdqn.market import market as market_setup


@functools.cache
def _sp500() -> market_setup.Prepared:
    return market_setup.prepare(config.Config())


def _constant(direction: int, magnitude: int = 2, order: int = 0, urgency: int = 2):
    action = jnp.array([direction, magnitude, order, urgency], jnp.int32)
    return lambda obs, t, key: (action, jnp.float32(1.0))


def _random(obs, t, key):
    return jax.random.randint(key, (4,), 0, 3, dtype=jnp.int32), jnp.float32(1.0)


def _hand_market() -> env.MarketData:
    # Three bars. Bar 1 opens at 101 and closes at 110; bar 2 opens at 108 and closes at 99.
    f = lambda *v: jnp.array(v, jnp.float32)
    return env.MarketData(
        open=f(100, 101, 108),
        high=f(100, 111, 109),
        low=f(100, 100, 98),
        close=f(100, 110, 99),
        volume=f(1, 1, 1),
        sigma=f(0, 0, 0),
        adv=f(1, 1, 1),
        features=jnp.zeros((3, 1), jnp.float32),
        oracle=f(0, 0, 0),
    )


def test_e3_walk_hand_built_bars_long_at_next_open():
    params = env.EnvParams(window=1, half_spread=1e-4, commission=1e-4)
    res = evaluate.walk(
        _hand_market(), params, 0, 3, _constant(2), jax.random.PRNGKey(0), periods_per_year=2
    )
    log = res.log
    assert list(log["t"]) == [0, 1]
    assert list(log["date"]) == [1, 2]  # no dates: the bar index t+1 where the return lands
    # t=0: target 1 of equity 1 at close 100 -> buy 0.01 shares at open[1] = 101, paying
    # (1 + 1) bps on 1.01 notional; marked at close[1] = 110.
    cost0 = 1.01 * 2e-4
    e1 = 1.0 + 0.01 * (110 - 101) - cost0
    # t=1: rebalance to 1.0 of e1 at close 110 -> sell (0.01 - e1/110) shares at open[2] = 108.
    sell = 0.01 - e1 / 110
    cost1 = sell * 108 * 2e-4
    e2 = e1 + 0.01 * (99 - 110) - sell * (99 - 108) - cost1
    np.testing.assert_allclose(log["equity"], [e1, e2], rtol=1e-5)
    np.testing.assert_allclose(log["return"], [e1 - 1, e2 / e1 - 1], rtol=1e-4)
    np.testing.assert_allclose(log["price"], [101, 108], rtol=1e-6)
    np.testing.assert_allclose(log["traded"], [1.01, sell * 108 / e1], rtol=1e-4)
    np.testing.assert_allclose(log["cost"], [cost0, cost1 / e1], rtol=1e-4)
    np.testing.assert_allclose(log["position"], [0.01 * 110 / e1, e1 / 110 * 99 / e2], rtol=1e-5)
    assert list(log["filled"]) == [True, True]
    assert list(log["direction"]) == [2, 2] and list(log["urgency"]) == [2, 2]
    np.testing.assert_allclose(log["target_position"], [1.0, 1.0])
    assert res.metrics["annual_return"] == pytest.approx(e2 - 1, rel=1e-4)  # 2 bars = 1 year


def test_e3_walk_log_columns_dates_and_flat_bookkeeping():
    p = _sp500()
    lo, hi = p.bar_range("val")
    res = evaluate.walk(
        p.market, p.env_params, lo, hi, _constant(1), jax.random.PRNGKey(0), p.dates
    )
    log = res.log
    assert tuple(log.columns) == evaluate.LOG_COLUMNS
    assert len(log) == hi - 1 - lo
    np.testing.assert_array_equal(log["t"], np.arange(lo, hi - 1))
    # the date of each row is the bar where the order executes and the return is realised
    assert (pd.DatetimeIndex(log["date"]) == p.dates[lo + 1 : hi]).all()
    assert log["date"].iloc[0] > pd.Timestamp("2012-12-31")
    assert log["date"].iloc[-1] == pd.Timestamp("2015-12-31")
    assert not log["filled"].any() and log["price"].isna().all()
    assert (log["equity"] == 1.0).all() and (log["return"] == 0.0).all()
    assert res.metrics["turnover"] == 0.0 and res.metrics["exposure"] == 0.0


def test_e3_walk_is_deterministic_in_its_key():
    p = _sp500()
    lo, hi = p.bar_range("test")
    a = evaluate.walk(p.market, p.env_params, lo, hi, _random, jax.random.PRNGKey(3), p.dates)
    b = evaluate.walk(p.market, p.env_params, lo, hi, _random, jax.random.PRNGKey(3), p.dates)
    c = evaluate.walk(p.market, p.env_params, lo, hi, _random, jax.random.PRNGKey(4), p.dates)
    pd.testing.assert_frame_equal(a.log, b.log)
    assert a.metrics == b.metrics
    assert not (a.log["direction"].to_numpy() == c.log["direction"].to_numpy()).all()


def test_e3_walk_metrics_are_performance_of_the_log():
    p = _sp500()
    lo, hi = p.bar_range("test")
    res = evaluate.walk(
        p.market,
        p.env_params,
        lo,
        hi,
        _random,
        jax.random.PRNGKey(1),
        p.dates,
        periods_per_year=252,
    )
    log = res.log
    expected = metrics.performance(
        log["return"].to_numpy(), 252, positions=log["position"], traded=log["traded"]
    )
    assert res.metrics == expected
    # simple returns compound to the equity path (equity starts at 1)
    np.testing.assert_allclose(np.cumprod(1 + log["return"]), log["equity"], rtol=1e-4)
    # the fill price is NaN exactly when nothing filled
    assert (log["price"].isna() == ~log["filled"]).all()


def test_e3_walk_policy_params_are_traced_arguments():
    p = _sp500()
    lo, hi = p.bar_range("val")

    def follow(direction, obs, t, key):
        return jnp.stack([direction[t], 2, 0, 2]).astype(jnp.int32), jnp.float32(1.0)

    longs = jnp.full((p.market.num_bars,), 2, jnp.int32)
    with_params = evaluate.walk(
        p.market, p.env_params, lo, hi, follow, jax.random.PRNGKey(0), policy_params=longs
    )
    closure = evaluate.walk(p.market, p.env_params, lo, hi, _constant(2), jax.random.PRNGKey(0))
    pd.testing.assert_frame_equal(with_params.log, closure.log)
    shorts = evaluate.walk(
        p.market, p.env_params, lo, hi, follow, jax.random.PRNGKey(0), policy_params=longs * 0
    )
    assert (shorts.log["target_position"] == -1.0).all()


def test_e3_walk_rejects_a_range_without_decisions():
    p = _sp500()
    with pytest.raises(ValueError, match="no decision bar"):
        evaluate.walk(p.market, p.env_params, 100, 101, _constant(1), jax.random.PRNGKey(0))


def test_e3_prepare_bar_ranges_start_after_the_warmup():
    p = _sp500()
    assert p.splits.train[0] == 0
    assert (
        p.bar_range("train")[0] == p.first_decision == p.features.warmup + p.env_params.window - 1
    )
    assert p.bar_range("val") == p.splits.val
    assert p.dates[p.splits.val[0]] == pd.Timestamp("2013-01-02")
    with pytest.raises(ValueError, match="unknown split"):
        p.bar_range("holdout")


def test_e3_cost_stress_walks_every_multiple_in_one_program():
    p = _sp500()
    lo, hi = p.bar_range("test")
    key = jax.random.PRNGKey(2)
    stressed = cost_stress.stress_walk(p.market, p.env_params, lo, hi, _random, key, p.dates)
    assert len(stressed) == len(cost_stress.COST_MULTIPLES) == 4
    # 1× is the plain walk and 0× the walk with every cost set to zero, bar for bar
    plain = evaluate.walk(p.market, p.env_params, lo, hi, _random, key, p.dates)
    pd.testing.assert_frame_equal(stressed[1].log, plain.log)
    assert stressed[1].metrics == plain.metrics
    free = evaluate.walk(
        p.market, cost_stress.scale_costs(p.env_params, 0.0), lo, hi, _random, key, p.dates
    )
    pd.testing.assert_frame_equal(stressed[0].log, free.log)
    assert (stressed[0].log["cost"] == 0.0).all() and (stressed[1].log["cost"] > 0).any()
    # the same actions at every multiple; the random policy trades every bar, so each step up in
    # costs lowers the return and the Sharpe
    for res in stressed:
        np.testing.assert_array_equal(res.log["direction"], plain.log["direction"])
    sharpe = [r.metrics["sharpe"] for r in stressed]
    ret = [r.metrics["annual_return"] for r in stressed]
    assert sharpe == sorted(sharpe, reverse=True) and len(set(sharpe)) == 4
    assert ret == sorted(ret, reverse=True)
    # the cost paid scales with the multiple (the traded notional barely moves)
    paid = np.array([r.log["cost"].sum() for r in stressed])
    np.testing.assert_allclose(paid[2:] / paid[1], [2.0, 3.0], rtol=0.02)


def test_e3_cost_stress_scales_every_cost_and_walks_impact_statically():
    params = env.EnvParams(half_spread=2e-4, commission=1e-4, impact_eta=0.1, limit_through=5e-4)
    twice = cost_stress.scale_costs(params, 2.0)
    assert (twice.half_spread, twice.commission, twice.impact_eta) == pytest.approx(
        (4e-4, 2e-4, 0.2)
    )
    assert twice.limit_through == params.limit_through and twice.window == params.window
    assert cost_stress.cost_bps(twice) == pytest.approx(
        {"half_spread_bps": 4.0, "commission_bps": 2.0, "impact_eta": 0.2}
    )
    with pytest.raises(ValueError, match="cost multiple"):
        cost_stress.scale_costs(params, -1.0)
    # with impact on, each multiple is walked with its own static parameters
    p = _sp500()
    lo, hi = p.bar_range("val")
    base = env.EnvParams(**{**p.env_params.__dict__, "impact_eta": 0.5})
    key = jax.random.PRNGKey(0)
    got = cost_stress.stress_walk(p.market, base, lo, hi, _constant(2), key, p.dates, (0.0, 2.0))
    hand = env.EnvParams(
        **{
            **base.__dict__,
            "half_spread": 2 * base.half_spread,
            "commission": 2 * base.commission,
            "impact_eta": 1.0,
        }
    )
    want = evaluate.walk(p.market, hand, lo, hi, _constant(2), key, p.dates)
    pd.testing.assert_frame_equal(got[1].log, want.log)
    assert (got[0].log["cost"] == 0.0).all() and got[1].log["cost"].iloc[0] > 0


def test_e1_close_only_bars_hold_orders_at_market_now_in_the_fills_and_the_log():
    """With ``hold_orders`` a limit order at low urgency is executed (and logged) as a market
    order at high urgency: the same walk as asking for that; without it they differ."""
    market = _hand_market()
    held = env.EnvParams(window=1, half_spread=1e-4, commission=1e-4, hold_orders=True)
    free = env.EnvParams(window=1, half_spread=1e-4, commission=1e-4)
    key = jax.random.PRNGKey(0)
    walk = lambda params, policy: evaluate.walk(market, params, 0, 3, policy, key).log
    limit, now = _constant(2, order=1, urgency=0), _constant(2, order=0, urgency=2)
    asked = walk(held, limit)
    assert list(asked["order"]) == [0, 0] and list(asked["urgency"]) == [2, 2]
    assert list(asked["direction"]) == [2, 2] and list(asked["magnitude"]) == [2, 2]
    pd.testing.assert_frame_equal(asked, walk(held, now))
    pd.testing.assert_frame_equal(walk(free, now), walk(held, now))
    assert list(walk(free, limit)["order"]) == [1, 1]
    chosen = jnp.array([[0, 1, 2, 1], [2, 0, 1, 0]], jnp.int32)
    np.testing.assert_array_equal(env.executed_action(held, chosen), [[0, 1, 0, 2], [2, 0, 0, 2]])
    assert env.executed_action(free, chosen) is chosen
