"""E1: the market environment. Hand-built bars, hand-computed prices, costs and rewards."""

from __future__ import annotations

import dataclasses
import functools
import math
from functools import partial
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

from jaxdqn.config import Config, ConfigError, EnvConfig
from jaxdqn.market import env as E

HS, COMM = 5e-4, 2e-4  # half-spread and commission used by the hand-built tests
SIGMA = 0.0625  # exact in binary: limit prices below are exact float32 numbers
# Trade-through margin b of limit fills: 2^-10 (9.77 bps), so P·(1 − b) and P·(1 − b/2) of the
# hand-built limit prices are exact float32 numbers too.
LT = 2.0**-10
T_DEC = 5  # decision bar of the hand-built tests; close[T_DEC] = 100
LONG, SHORT, FLAT = 2, 0, 1
MARKET, LIMIT, LTM = 0, 1, 2
LOW, MID, HIGH = 0, 1, 2

PARAMS = E.EnvParams(
    window=3,
    episode_length=100,
    max_leverage=1.0,
    magnitude_levels=(0.25, 0.5, 1.0),
    half_spread=HS,
    commission=COMM,
    limit_offsets=(1.0, 0.5, 0.0),
    limit_through=LT,
)


def market_from(o, h, low, c, *, sigma=SIGMA, adv=1e8, features=None, oracle=None) -> E.MarketData:
    t = len(c)
    f32 = lambda x: jnp.asarray(np.broadcast_to(np.asarray(x, np.float64), (t,)), jnp.float32)
    if features is None:
        # features[t, f] = 10 t + f: any window is recognisable by eye.
        features = 10.0 * np.arange(t)[:, None] + np.arange(2)[None, :]
    return E.MarketData(
        open=f32(o),
        high=f32(h),
        low=f32(low),
        close=f32(c),
        volume=f32(np.full(t, 1e6)),
        sigma=f32(sigma),
        adv=f32(adv),
        features=jnp.asarray(features, jnp.float32),
        oracle=f32(np.zeros(t) if oracle is None else oracle),
    )


def hand_market(open1, high1, low1, close1, num_bars=12, **kw) -> E.MarketData:
    """Flat bars at 100 except bar T_DEC + 1, the execution bar, given by hand."""
    o = np.full(num_bars, 100.0)
    h = np.full(num_bars, 101.0)
    low = np.full(num_bars, 99.0)
    c = np.full(num_bars, 100.0)
    n = T_DEC + 1
    o[n], h[n], low[n], c[n] = open1, high1, low1, close1
    return market_from(o, h, low, c, **kw)


def state_with(shares=0.0, params=PARAMS, market=None, t=T_DEC, lo=0, hi=12) -> E.EnvState:
    """A state at bar t (close[t] = 100 in the hand markets) holding ``shares``, equity 1."""
    state, _ = E.reset_at(params, market, t, lo, hi, jax.random.PRNGKey(0))
    close = float(market.close[t])
    return state.replace(
        shares=jnp.float32(shares), cash=jnp.float32(1.0 - shares * close), equity=jnp.float32(1.0)
    )


def act(direction, magnitude=2, order=MARKET, urgency=HIGH) -> jax.Array:
    return jnp.array([direction, magnitude, order, urgency], jnp.int32)


@functools.cache
def _jitted(fn, params):
    return jax.jit(partial(fn, params))


def do_step(market, state, action, scale=1.0, params=PARAMS, fn=E.step):
    return _jitted(fn, params)(market, state, action, jnp.float32(scale))


def check_trade(out, *, shares0, delta, price, rate, close1, filled, expired, equity0=1.0):
    """Compare a step's outcome with the hand computation in float64."""
    state, obs, reward, _done, info = out
    executed = delta if filled else 0.0
    cost = abs(executed) * price * rate
    pnl = shares0 * (close1 - 100.0) + executed * (close1 - price) - cost
    e1 = equity0 + pnl
    np.testing.assert_allclose(float(state.shares), shares0 + executed, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(float(info["cost"]), cost / equity0, rtol=1e-5, atol=1e-10)
    np.testing.assert_allclose(float(state.equity), e1, rtol=1e-6)
    np.testing.assert_allclose(float(reward), math.log(e1 / equity0), atol=2e-7)
    np.testing.assert_allclose(
        float(state.cash), 1.0 - shares0 * 100.0 - executed * price - cost, atol=1e-6
    )
    np.testing.assert_allclose(
        float(info["fill_price"]), price if filled else 0.0, rtol=1e-6, atol=1e-9
    )
    np.testing.assert_allclose(float(info["traded"]), abs(executed) * price, rtol=1e-6, atol=1e-9)
    assert float(info["filled"]) == float(filled)
    assert float(info["expired"]) == float(expired)
    # the next observation carries the position fraction and the fill flags
    np.testing.assert_allclose(
        np.asarray(obs[-3:]),
        [(shares0 + executed) * close1 / e1, float(filled), float(expired)],
        rtol=1e-5,
        atol=1e-7,
    )


# ---------------------------------------------------------------------------------------------
# Market orders
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("direction", [LONG, SHORT])
@pytest.mark.parametrize(
    "urgency, price", [(HIGH, 101.0), (MID, (104.0 + 99.0 + 102.0) / 3.0), (LOW, 102.0)]
)
def test_e1_market_order_price_by_urgency_pays_spread_and_commission(direction, urgency, price):
    market = hand_market(101.0, 104.0, 99.0, 102.0)
    out = do_step(market, state_with(market=market), act(direction, urgency=urgency))
    delta = 0.01 if direction == LONG else -0.01  # 1.0 · equity 1 / close[t] 100
    check_trade(
        out,
        shares0=0.0,
        delta=delta,
        price=price,
        rate=HS + COMM,
        close1=102.0,
        filled=True,
        expired=False,
    )
    assert float(out[4]["target_position"]) == (1.0 if direction == LONG else -1.0)


# ---------------------------------------------------------------------------------------------
# Limit orders
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("open1", [96.0, 96.875])
def test_e1_limit_buy_gap_through_fills_at_the_open(open1):
    # mid urgency: P = 100 · (1 − 0.5 · 0.0625) = 96.875; open ≤ P fills at the open
    market = hand_market(open1, 99.0, 95.0, 98.0)
    out = do_step(market, state_with(market=market), act(LONG, order=LIMIT, urgency=MID))
    check_trade(
        out,
        shares0=0.0,
        delta=0.01,
        price=open1,
        rate=COMM,
        close1=98.0,
        filled=True,
        expired=False,
    )


@pytest.mark.parametrize("urgency, limit", [(LOW, 93.75), (MID, 96.875), (HIGH, 100.0)])
def test_e1_limit_buy_low_equal_to_price_does_not_fill(urgency, limit):
    market = hand_market(101.0, 102.0, limit, 99.0)
    out = do_step(market, state_with(market=market), act(LONG, order=LIMIT, urgency=urgency))
    check_trade(
        out, shares0=0.0, delta=0.01, price=0.0, rate=0.0, close1=99.0, filled=False, expired=True
    )


@pytest.mark.parametrize("urgency, limit", [(LOW, 93.75), (MID, 96.875), (HIGH, 100.0)])
def test_e1_limit_buy_low_below_price_fills_at_the_limit(urgency, limit):
    # 0.25 below P is more than b · P below it: traded through, fills at P
    assert limit - 0.25 < limit * (1 - LT)
    market = hand_market(101.0, 102.0, limit - 0.25, 99.0)
    out = do_step(market, state_with(market=market), act(LONG, order=LIMIT, urgency=urgency))
    check_trade(
        out,
        shares0=0.0,
        delta=0.01,
        price=limit,
        rate=COMM,
        close1=99.0,
        filled=True,
        expired=False,
    )


@pytest.mark.parametrize("urgency, limit", [(LOW, 93.75), (MID, 96.875), (HIGH, 100.0)])
@pytest.mark.parametrize(
    "low_over_p, filled",
    [
        (1.0 - LT / 2, False),  # through by half the margin: touched, not filled
        (1.0 - LT, False),  # exactly the margin: the rule is strict
        (1.0 - 2 * LT, True),  # through by twice the margin: fills at P
    ],
)
def test_e1_limit_fills_only_when_traded_through_by_limit_through_bps(
    urgency, limit, low_over_p, filled
):
    low1 = limit * low_over_p
    assert float(np.float32(low1)) == low1  # the boundary is exact in float32
    market = hand_market(101.0, 102.0, low1, 99.0)
    out = do_step(market, state_with(market=market), act(LONG, order=LIMIT, urgency=urgency))
    check_trade(
        out,
        shares0=0.0,
        delta=0.01,
        price=limit if filled else 0.0,
        rate=COMM,
        close1=99.0,
        filled=filled,
        expired=not filled,
    )
    # sells mirror it on the high (P = 100·(1 + k σ)); the gap-through rule needs no margin
    sell_limit = 200.0 - limit
    market = hand_market(99.0, sell_limit * (2.0 - low_over_p), 98.0, 101.0)
    out = do_step(market, state_with(market=market), act(SHORT, order=LIMIT, urgency=urgency))
    assert float(out[4]["filled"]) == float(filled)
    if filled:
        np.testing.assert_allclose(float(out[4]["fill_price"]), sell_limit, rtol=1e-6)


@pytest.mark.parametrize("through", [0.0, 5e-4, 0.01])
def test_e1_limit_gap_through_at_the_open_needs_no_margin(through):
    # open exactly at P: E1's gap-through rule fills at the open whatever the trade-through
    # margin (the low, equal to P here, would not fill)
    params = dataclasses.replace(PARAMS, limit_through=through)
    market = hand_market(96.875, 99.0, 96.875, 98.0)
    out = do_step(
        market, state_with(market=market), act(LONG, order=LIMIT, urgency=MID), params=params
    )
    check_trade(
        out,
        shares0=0.0,
        delta=0.01,
        price=96.875,
        rate=COMM,
        close1=98.0,
        filled=True,
        expired=False,
    )


def test_e1_unfilled_limit_leaves_the_position_and_sets_expired():
    # holding 0.5 long; a limit to go 1.0 long is not reached: still 0.5 long, marked at 99
    market = hand_market(100.5, 101.0, 96.875, 99.0)
    state = state_with(shares=0.005, market=market)
    out = do_step(market, state, act(LONG, order=LIMIT, urgency=MID))
    check_trade(
        out,
        shares0=0.005,
        delta=0.005,
        price=0.0,
        rate=0.0,
        close1=99.0,
        filled=False,
        expired=True,
    )
    np.testing.assert_allclose(float(out[2]), math.log(1.0 - 0.005), atol=2e-7)


@pytest.mark.parametrize(
    "bar, price, filled",
    [
        ((104.0, 105.0, 102.0, 103.0), 104.0, True),  # open ≥ P: gap through, fills at the open
        ((100.0, 103.125, 99.0, 101.0), 0.0, False),  # high == P: strict, no fill
        ((100.0, 103.2, 99.0, 101.0), 0.0, False),  # above P by < b·P: not traded through
        ((100.0, 103.5, 99.0, 101.0), 103.125, True),  # high > P: fills at P
    ],
)
def test_e1_sell_limit_mirrors_buy_on_the_high(bar, price, filled):
    # sell P = 100 · (1 + 0.5 · 0.0625) = 103.125
    market = hand_market(*bar)
    out = do_step(market, state_with(market=market), act(SHORT, order=LIMIT, urgency=MID))
    check_trade(
        out,
        shares0=0.0,
        delta=-0.01,
        price=price,
        rate=COMM,
        close1=bar[3],
        filled=filled,
        expired=not filled,
    )


def test_e1_short_side_mirrors_long_on_reflected_bars():
    # reflect every price around 100 (p -> 200 - p; high <-> low): a short limit on the
    # reflected bars earns what the long limit earns on the originals, before costs
    long_mkt = hand_market(101.0, 102.0, 96.5, 99.0)
    short_mkt = hand_market(99.0, 103.5, 98.0, 101.0)
    p = PARAMS.__class__(**{**PARAMS.__dict__, "commission": 0.0})
    lo = do_step(
        long_mkt, state_with(market=long_mkt), act(LONG, order=LIMIT, urgency=MID), params=p
    )
    sh = do_step(
        short_mkt, state_with(market=short_mkt), act(SHORT, order=LIMIT, urgency=MID), params=p
    )
    assert float(lo[4]["filled"]) == float(sh[4]["filled"]) == 1.0
    np.testing.assert_allclose(float(lo[4]["fill_price"]), 200.0 - float(sh[4]["fill_price"]))
    np.testing.assert_allclose(float(lo[2]), float(sh[2]), rtol=1e-5)
    np.testing.assert_allclose(float(lo[0].shares), -float(sh[0].shares))


# ---------------------------------------------------------------------------------------------
# Limit-then-market, impact
# ---------------------------------------------------------------------------------------------


def test_e1_limit_then_market_falls_back_to_the_close_with_market_costs():
    market = hand_market(100.5, 101.0, 96.875, 99.0)  # the mid limit at 96.875 is not reached
    out = do_step(market, state_with(market=market), act(LONG, order=LTM, urgency=MID))
    check_trade(
        out,
        shares0=0.0,
        delta=0.01,
        price=99.0,
        rate=HS + COMM,
        close1=99.0,
        filled=True,
        expired=True,
    )


def test_e1_limit_then_market_with_limit_filled_pays_commission_only():
    market = hand_market(100.5, 101.0, 96.5, 99.0)
    out = do_step(market, state_with(market=market), act(LONG, order=LTM, urgency=MID))
    check_trade(
        out,
        shares0=0.0,
        delta=0.01,
        price=96.875,
        rate=COMM,
        close1=99.0,
        filled=True,
        expired=False,
    )


def test_e1_square_root_impact_matches_hand_computation():
    eta, part, capital = 0.5, 0.1, 1.0e6
    params = PARAMS.__class__(
        **{**PARAMS.__dict__, "impact_eta": eta, "participation": part, "capital": capital}
    )
    adv = np.full(12, 5e9)
    adv[T_DEC] = 2e7  # ADV known at decision time is the one used (not bar t+1's)
    market = hand_market(101.0, 104.0, 96.5, 102.0, adv=adv)
    # market buy at the open: notional 0.01 · 101 = 1.01 of equity = 1.01e6 in currency
    impact = eta * SIGMA * math.sqrt(1.01e6 / (part * 2e7))
    out = do_step(market, state_with(market=market), act(LONG), params=params)
    check_trade(
        out,
        shares0=0.0,
        delta=0.01,
        price=101.0,
        rate=HS + COMM + impact,
        close1=102.0,
        filled=True,
        expired=False,
    )
    # a filled limit pays commission only, no impact
    out = do_step(
        market, state_with(market=market), act(LONG, order=LIMIT, urgency=MID), params=params
    )
    check_trade(
        out,
        shares0=0.0,
        delta=0.01,
        price=96.875,
        rate=COMM,
        close1=102.0,
        filled=True,
        expired=False,
    )
    # a limit-then-market fallback pays impact on the close notional
    market = hand_market(101.0, 104.0, 99.0, 102.0, adv=adv)
    impact = eta * SIGMA * math.sqrt(1.02e6 / (part * 2e7))
    out = do_step(
        market, state_with(market=market), act(LONG, order=LTM, urgency=MID), params=params
    )
    check_trade(
        out,
        shares0=0.0,
        delta=0.01,
        price=102.0,
        rate=HS + COMM + impact,
        close1=102.0,
        filled=True,
        expired=True,
    )


# ---------------------------------------------------------------------------------------------
# Targets, no-trade, ruin
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "direction, magnitude, scale, lev, expected",
    [
        (LONG, 0, 1.0, 1.0, 0.25),
        (LONG, 1, 1.0, 2.0, 1.0),
        (SHORT, 2, 0.5, 2.0, -1.0),
        (FLAT, 2, 1.0, 3.0, 0.0),
        (LONG, 2, 3.0, 2.0, 2.0),  # clipped at max leverage
        (SHORT, 1, 9.0, 1.5, -1.5),
    ],
)
def test_e1_target_position_formula(direction, magnitude, scale, lev, expected):
    params = PARAMS.__class__(**{**PARAMS.__dict__, "max_leverage": lev})
    got = E.target_position(params, act(direction, magnitude), jnp.float32(scale))
    np.testing.assert_allclose(float(got), expected, rtol=1e-6)
    # and the order size follows it: shares = target · equity / close[t]
    market = hand_market(100.0, 101.0, 99.0, 100.0)
    out = do_step(
        market, state_with(market=market), act(direction, magnitude), scale, params=params
    )
    np.testing.assert_allclose(float(out[0].shares), expected / 100.0, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("order", [MARKET, LIMIT, LTM])
def test_e1_target_equal_to_holding_sends_no_order(order):
    market = hand_market(100.5, 101.0, 90.0, 99.0)
    for shares, direction, magnitude in ((0.0, FLAT, 2), (0.005, LONG, 1), (-0.0025, SHORT, 0)):
        state = state_with(shares=shares, market=market)
        out = do_step(market, state, act(direction, magnitude, order))
        check_trade(
            out,
            shares0=shares,
            delta=0.0,
            price=0.0,
            rate=0.0,
            close1=99.0,
            filled=False,
            expired=False,
        )


def test_e1_ruin_ends_the_episode_with_a_finite_reward():
    params = PARAMS.__class__(**{**PARAMS.__dict__, "max_leverage": 10.0})
    market = hand_market(100.0, 100.0, 85.0, 85.0)  # 10x long at the open, a 15% fall by the close
    state, obs, reward, done, info = do_step(
        market, state_with(market=market), act(LONG, urgency=HIGH), params=params
    )
    assert bool(done)
    assert float(state.equity) < 0
    np.testing.assert_allclose(float(reward), math.log(E.RUIN_FLOOR), rtol=1e-4)
    assert np.isfinite(np.asarray(obs)).all()
    assert float(info["episode_return"]) == pytest.approx(float(reward))
    # stepping a ruined account (without reset) is a finite no-op that stays done
    s2, obs2, r2, d2, _ = do_step(market, state, act(LONG), params=params)
    assert bool(d2) and float(r2) == 0.0 and float(s2.shares) == float(state.shares)
    assert np.isfinite(np.asarray(obs2)).all()
    # with auto-reset the next state is a fresh flat account
    s3, *_ = do_step(
        market,
        state_with(market=market),
        act(LONG, urgency=HIGH),
        params=params,
        fn=E.step_autoreset,
    )
    assert float(s3.equity) == 1.0 and float(s3.shares) == 0.0 and int(s3.step) == 0


# ---------------------------------------------------------------------------------------------
# Reward, observation, look-ahead: random markets against a plain-Python reference
# ---------------------------------------------------------------------------------------------


def random_market(num_bars=64, seed=0, num_features=3) -> E.MarketData:
    rng = np.random.default_rng(seed)
    c = 100.0 * np.exp(np.cumsum(rng.normal(0.0, 0.02, num_bars)))
    o = c * np.exp(rng.normal(0.0, 0.01, num_bars))
    h = np.maximum(o, c) * np.exp(np.abs(rng.normal(0.0, 0.01, num_bars)))
    low = np.minimum(o, c) * np.exp(-np.abs(rng.normal(0.0, 0.01, num_bars)))
    return market_from(
        o,
        h,
        low,
        c,
        sigma=rng.uniform(0.005, 0.03, num_bars),
        adv=rng.uniform(1e7, 1e8, num_bars),
        features=rng.normal(size=(num_bars, num_features)),
    )


def reference_step(p: E.EnvParams, m: E.MarketData, t, cash, shares, equity, action, scale):
    """E1 (docs/DESIGN.md) written as plainly as possible, in float64 Python."""
    g = lambda a, i: float(np.asarray(a, np.float64)[i])
    c0, sig, adv = g(m.close, t), g(m.sigma, t), g(m.adv, t)
    o1, h1, l1, c1 = g(m.open, t + 1), g(m.high, t + 1), g(m.low, t + 1), g(m.close, t + 1)
    d, mag, order, u = (int(v) for v in action)
    lev = p.max_leverage
    target = min(max((d - 1) * p.magnitude_levels[mag] * scale * lev, -lev), lev)
    delta = target * equity / c0 - shares
    if abs(delta) * c0 <= E.REBALANCE_TOL * equity:
        return dict(
            shares=shares, cash=cash, equity=equity + shares * (c1 - c0), filled=0, expired=0
        )
    buy = delta > 0
    k, b = p.limit_offsets[u], p.limit_through
    limit = c0 * (1 - k * sig) if buy else c0 * (1 + k * sig)
    if buy:
        lim_px = o1 if o1 <= limit else (limit if l1 < limit * (1 - b) else None)
    else:
        lim_px = o1 if o1 >= limit else (limit if h1 > limit * (1 + b) else None)
    market_px = [c1, (h1 + l1 + c1) / 3, o1][u]
    expired = 0
    if order == 0:
        px, via_market = market_px, True
    elif lim_px is not None:
        px, via_market = lim_px, False
    elif order == 2:
        px, via_market, expired = c1, True, 1
    else:
        return dict(
            shares=shares, cash=cash, equity=equity + shares * (c1 - c0), filled=0, expired=1
        )
    notional = abs(delta) * px
    rate = p.commission
    if via_market:
        rate += p.half_spread
        if p.impact_eta > 0:
            rate += p.impact_eta * sig * math.sqrt(notional * p.capital / (p.participation * adv))
    cost = notional * rate
    cash = cash - delta * px - cost
    shares = shares + delta
    return dict(shares=shares, cash=cash, equity=cash + shares * c1, filled=1, expired=expired)


@pytest.mark.parametrize("impact", [0.0, 0.3])
def test_e1_reward_is_log_equity_change_marked_at_next_close(impact):
    params = PARAMS.__class__(
        **{**PARAMS.__dict__, "impact_eta": impact, "max_leverage": 2.0, "episode_length": 1000}
    )
    market = random_market(64, seed=1)
    rng = np.random.default_rng(2)
    state, _ = E.reset_at(params, market, 3, 0, 64, jax.random.PRNGKey(0))
    step = jax.jit(partial(E.step, params))
    cash, shares, equity, total = 1.0, 0.0, 1.0, 0.0
    seen_flags = set()
    for t in range(3, 62):
        action = rng.integers(0, 3, 4)
        scale = float(rng.uniform(0.2, 1.2))
        ref = reference_step(params, market, t, cash, shares, equity, action, scale)
        state, _, reward, done, info = step(market, state, jnp.asarray(action), jnp.float32(scale))
        seen_flags.add((ref["filled"], ref["expired"]))
        np.testing.assert_allclose(float(state.shares), ref["shares"], rtol=1e-4, atol=1e-9)
        np.testing.assert_allclose(float(state.equity), ref["equity"], rtol=1e-5)
        c1 = float(market.close[t + 1])
        # equity is marked at close[t+1]: cash + shares · close[t+1]
        np.testing.assert_allclose(
            float(state.cash + state.shares * market.close[t + 1]), ref["equity"], rtol=1e-5
        )
        np.testing.assert_allclose(float(reward), math.log(ref["equity"] / equity), atol=1e-5)
        np.testing.assert_allclose(
            float(info["position"]), ref["shares"] * c1 / ref["equity"], rtol=1e-4, atol=1e-6
        )
        assert (float(info["filled"]), float(info["expired"])) == (ref["filled"], ref["expired"])
        assert int(state.t) == t + 1 and bool(done) == (t + 2 >= 64)
        total += float(reward)
        cash, shares, equity = ref["cash"], ref["shares"], ref["equity"]
    # rewards add up to the log of the final equity; the running episode return agrees
    np.testing.assert_allclose(total, math.log(equity), atol=1e-4)
    np.testing.assert_allclose(float(state.episode_return), total, atol=1e-4)
    assert {(1, 0), (0, 1), (1, 1)} <= seen_flags  # the walk met every fill outcome


def test_e1_observation_is_the_feature_window_plus_position_and_fill_flags():
    market = hand_market(100.5, 101.0, 96.875, 99.0)
    state, obs = E.reset_at(PARAMS, market, T_DEC, 0, 12, jax.random.PRNGKey(0))
    assert obs.shape == (E.obs_dim(PARAMS, 2),) == (3 * 2 + 3,)
    assert obs.dtype == jnp.float32
    # features[t, f] = 10 t + f for t = 3, 4, 5
    np.testing.assert_array_equal(np.asarray(obs), [30, 31, 40, 41, 50, 51, 0, 0, 0])
    state = state_with(shares=0.005, market=market)
    _, obs, *_ = do_step(market, state, act(LONG, order=LIMIT, urgency=MID))
    pos = 0.005 * 99.0 / (1.0 - 0.005)
    np.testing.assert_allclose(
        np.asarray(obs), [40, 41, 50, 51, 60, 61, pos, 0, 1], rtol=1e-6, atol=1e-7
    )
    # reset_at never lets the window reach before bar 0 (nor clamp onto later bars)
    state, obs = E.reset_at(PARAMS, market, 0, 0, 12, jax.random.PRNGKey(0))
    assert int(state.t) == 2
    np.testing.assert_array_equal(np.asarray(obs[:6]), [0, 1, 10, 11, 20, 21])


def perturbed(market: E.MarketData, rows: slice, seed: int) -> E.MarketData:
    rng = np.random.default_rng(seed)

    def bump(a):
        a = np.asarray(a).copy()
        a[rows] = a[rows] * rng.uniform(0.5, 1.5, a[rows].shape) + rng.normal(size=a[rows].shape)
        return jnp.asarray(a)

    return jax.tree_util.tree_map(bump, market)


@pytest.mark.parametrize(
    "order, urgency", [(MARKET, HIGH), (MARKET, MID), (LIMIT, LOW), (LTM, MID)]
)
def test_e1_no_look_ahead(order, urgency):
    market = random_market(40, seed=3)
    t = 20
    state = state_with(shares=0.004, market=market, t=t, hi=40)
    action = act(LONG, 2, order, urgency)
    base = do_step(market, state, action)
    # anything after bar t+1 is invisible to step t (state, obs, reward, done, info)
    later = do_step(perturbed(market, slice(t + 2, None), 4), state, action)
    chex.assert_trees_all_equal(base, later)
    # bar t+1 is where the order executes and is marked: changing it changes the outcome
    nxt = market.replace(
        open=market.open.at[t + 1].multiply(0.97),
        high=market.high.at[t + 1].multiply(1.05),
        low=market.low.at[t + 1].multiply(0.9),
        close=market.close.at[t + 1].multiply(0.98),
    )
    changed = do_step(nxt, state, action)
    assert float(changed[2]) != float(base[2])
    assert float(changed[0].equity) != float(base[0].equity)


# ---------------------------------------------------------------------------------------------
# Batching, episodes, auto-reset
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_e1_vmap_over_4096_envs_under_jit():
    n = 4096
    params = PARAMS.__class__(**{**PARAMS.__dict__, "episode_length": 8})
    market = random_market(200, seed=5)
    keys = jax.random.split(jax.random.PRNGKey(7), n)
    reset_b = jax.jit(jax.vmap(partial(E.reset, params), in_axes=(None, None, None, 0)))
    step_b = jax.jit(jax.vmap(partial(E.step_autoreset, params), in_axes=(None, 0, 0, 0)))
    states, obs = reset_b(market, 10, 200, keys)
    chex.assert_shape(obs, (n, E.obs_dim(params, 3)))
    akey = jax.random.PRNGKey(8)
    for _ in range(10):
        akey, k1, k2 = jax.random.split(akey, 3)
        actions = jax.random.randint(k1, (n, 4), 0, 3)
        scales = jax.random.uniform(k2, (n,), minval=0.1, maxval=1.0)
        prev = states
        states, obs, rewards, dones, info = step_b(market, states, actions, scales)
        chex.assert_shape([rewards, dones, info["equity"], states.t], (n,))
        chex.assert_tree_all_finite((obs, rewards, info))
    # the batched step equals the unbatched one, env by env
    for i in (0, 17, n - 1):
        one = jax.tree_util.tree_map(lambda x, i=i: x[i], prev)
        s1, o1, r1, d1, _ = do_step(
            market, one, actions[i], float(scales[i]), params=params, fn=E.step_autoreset
        )
        np.testing.assert_array_equal(np.asarray(o1), np.asarray(obs[i]))
        assert float(r1) == float(rewards[i]) and bool(d1) == bool(dones[i])
        chex.assert_trees_all_equal(s1, jax.tree_util.tree_map(lambda x, i=i: x[i], states))


def test_e1_autoreset_after_h_steps_and_at_split_end():
    params = PARAMS.__class__(**{**PARAMS.__dict__, "episode_length": 5})
    market = random_market(40, seed=6)
    step = jax.jit(partial(E.step_autoreset, params))
    state, _ = E.reset_at(params, market, 10, 3, 40, jax.random.PRNGKey(1))
    rewards = []
    for k in range(5):
        state, obs, reward, done, info = step(
            market, state, act(LONG, urgency=LOW), jnp.float32(1.0)
        )
        rewards.append(float(reward))
        assert bool(done) == (k == 4)
    # a fresh episode: flat account at a new start inside [max(lo, W-1), hi - 1 - H]
    assert int(state.step) == 0 and float(state.equity) == 1.0 and float(state.shares) == 0.0
    assert float(state.episode_return) == 0.0
    assert 3 <= int(state.t) <= 40 - 1 - 5
    np.testing.assert_allclose(float(info["episode_return"]), sum(rewards), rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(obs[-3:]), [0, 0, 0])
    # the split end ends an episode before H: from t = hi - 3 two steps reach bar hi - 1
    params = PARAMS.__class__(**{**PARAMS.__dict__, "episode_length": 100})
    state, _ = E.reset_at(params, market, 37, 3, 40, jax.random.PRNGKey(1))
    s1, _, _, d1, _ = E.step(params, market, state, act(LONG), jnp.float32(1.0))
    assert not bool(d1) and int(s1.t) == 38
    s2, _, _, d2, _ = E.step(params, market, s1, act(LONG), jnp.float32(1.0))
    assert bool(d2) and int(s2.t) == 39
    s3, *_ = E.step_autoreset(params, market, s1, act(LONG), jnp.float32(1.0))
    assert int(s3.step) == 0 and 3 <= int(s3.t) < 40


@pytest.mark.slow
def test_e1_starts_stay_inside_the_split_and_depend_on_the_key():
    params = PARAMS.__class__(**{**PARAMS.__dict__, "episode_length": 16})
    market = random_market(300, seed=7)
    lo, hi = 40, 200
    keys = jax.random.split(jax.random.PRNGKey(3), 2048)
    states, _ = jax.vmap(partial(E.reset, params), in_axes=(None, None, None, 0))(
        market, lo, hi, keys
    )
    t = np.asarray(states.t)
    assert t.min() >= lo and t.max() <= hi - 1 - 16
    assert len(np.unique(t)) > 100  # 144 possible starts
    assert t.min() == lo and t.max() == hi - 1 - 16  # both ends are reachable
    a, _ = E.reset(params, market, lo, hi, jax.random.PRNGKey(0))
    b, _ = E.reset(params, market, lo, hi, jax.random.PRNGKey(0))
    assert int(a.t) == int(b.t)  # same key, same start
    # a split shorter than an episode starts at its beginning (or at window - 1)
    short, _ = E.reset(params, market, 50, 60, jax.random.PRNGKey(5))
    assert int(short.t) == 50
    early, _ = E.reset(params, market, 0, 10, jax.random.PRNGKey(5))
    assert int(early.t) == params.window - 1
    # auto-reset draws stay inside [lo, hi) over many episodes; the env key drives them
    step_b = jax.jit(jax.vmap(partial(E.step_autoreset, params), in_axes=(None, 0, 0, 0)))
    n = 256
    states, _ = jax.vmap(partial(E.reset, params), in_axes=(None, None, None, 0))(
        market, lo, hi, keys[:n]
    )
    ones = jnp.ones((n,), jnp.float32)
    actions = jnp.tile(act(LONG, urgency=LOW), (n, 1))
    starts = []
    for _ in range(40):
        states, _, _, dones, _ = step_b(market, states, actions, ones)
        t = np.asarray(states.t)
        assert t.min() >= lo and t.max() <= hi - 1
        starts.append(t[np.asarray(dones)])
    starts = np.concatenate(starts)
    assert len(starts) >= n and len(np.unique(starts)) > 50


# ---------------------------------------------------------------------------------------------
# Construction from bars, config
# ---------------------------------------------------------------------------------------------


class _Features(NamedTuple):  # the fields of jaxdqn.market.features.Features that make_market reads
    values: np.ndarray
    sigma: np.ndarray
    warmup: int


def _bars(volume) -> pd.DataFrame:
    close = np.array([10.0, 11.0, 12.0, 13.0, 14.0, 15.0])
    return pd.DataFrame(
        {"open": close, "high": close + 1, "low": close - 1, "close": close, "volume": volume},
        index=pd.date_range("2020-01-01", periods=6, name="date"),
    )


def test_e1_make_market_from_bars_and_features():
    df = _bars(np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]))
    feats = _Features(
        values=np.arange(12, dtype=np.float32).reshape(6, 2),
        sigma=np.array([np.nan, np.nan, 0.01, 0.02, 0.03, 0.04]),
        warmup=2,
    )
    m = E.make_market(df, feats, EnvConfig(adv_window=3))
    # ADV: trailing mean of close · volume (10, 22, 36, 52, 70, 90) over up to 3 bars
    expected = [10.0, 16.0, 68 / 3, 110 / 3, 158 / 3, 212 / 3]
    np.testing.assert_allclose(np.asarray(m.adv), expected, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(m.sigma), [0, 0, 0.01, 0.02, 0.03, 0.04], rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(m.oracle), np.zeros(6))
    assert all(getattr(m, f).dtype == jnp.float32 for f in ("open", "sigma", "adv", "features"))
    assert m.num_bars == 6 and m.num_features == 2
    df["oracle"] = [1.0, -1.0, 0.0, 1.0, 1.0, -1.0]
    np.testing.assert_array_equal(
        np.asarray(E.make_market(df, feats, EnvConfig()).oracle), df["oracle"]
    )
    with pytest.raises(ValueError, match="one row per bar"):
        E.make_market(df.iloc[:5], feats, EnvConfig())


def test_e1_make_market_rejects_impact_without_volume():
    df = _bars(np.array([1.0, 0.0, 0.0, 0.0, 5.0, 6.0]))
    feats = _Features(np.zeros((6, 2), np.float32), np.full(6, 0.01), 0)
    E.make_market(df, feats, EnvConfig(adv_window=2))  # fine without impact
    with pytest.raises(ConfigError, match=r"env.impact_eta: .* row 2 "):
        E.make_market(df, feats, EnvConfig(adv_window=2, impact_eta=0.1))


def test_e1_params_from_config_converts_bps():
    cfg = Config()
    p = E.EnvParams.from_config(cfg.env, cfg.features.window)
    assert p.window == cfg.features.window and p.episode_length == cfg.env.episode_length
    assert p.half_spread == pytest.approx(cfg.env.half_spread_bps * 1e-4)
    assert p.commission == pytest.approx(cfg.env.commission_bps * 1e-4)
    assert p.limit_offsets == cfg.env.limit_offsets
    assert p.limit_through == pytest.approx(cfg.env.limit_through_bps * 1e-4) == 5e-4
    hash(p)  # static: usable as a jit static argument
