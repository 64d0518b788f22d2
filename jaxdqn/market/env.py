"""E1: the vectorised market environment, in pure JAX.

One environment trades one instrument on bars of any clock. The agent decides **after bar t
closes** and its order executes **only within bar t+1**, so it never trades at a price it has seen.

Account. The account is ``cash + shares`` in units of the initial capital (equity starts at
1.0; ``env.capital`` converts to currency for the impact model). Equity at close t is
``E_t = cash + shares · close[t]``. An action asks for a target position *fraction*
``f = clip(dir · level[mag] · scale · max_leverage, −L, L)``; it is converted to a share count
at the last price the agent saw, ``target_shares = f · E_t / close[t]``, and the order trades
``Δ = target_shares − shares``. So a constant target fraction rebalances every bar (as a
fraction-of-equity policy must), and a target equal to the holding (``|Δ| · close[t] ≤ 1e-5 ·
E_t``, a dead band that absorbs float32 rounding) sends no order: filled = expired = 0.

Orders (``u`` is the urgency: 0 low, 1 mid, 2 high; ``σ̂_t`` the causal volatility estimate):

- market: fills at ``open[t+1]`` (u=2), the typical price ``(H+L+C)/3`` of bar t+1 (u=1, a
  TWAP proxy) or ``close[t+1]`` (u=0, market-on-close). Cost rate on the traded notional:
  half-spread + commission + impact, impact = ``η · σ̂_t · sqrt(N / (participation · ADV_t))``
  with ``N = |Δ| · price · capital`` the traded notional in currency (0 when ``η = 0``).
- limit, priced at decision time with depth ``k_u = limit_offsets[u]``:
  buy ``P = close[t] · (1 − k_u σ̂_t)``: fills at ``open[t+1]`` if ``open[t+1] ≤ P`` (gap
  through, price improvement), else at ``P`` if ``low[t+1] < P · (1 − b)`` (the bar traded
  through the price by ``b = env.limit_through_bps · 1e-4``: the order's place in the queue
  is unknown, so touching ``P`` — or going a hair beyond it — is not filling), else expires
  and the position is unchanged. Sell ``P = close[t] · (1 + k_u σ̂_t)``, mirrored: at
  ``open[t+1]`` if ``open[t+1] ≥ P``, else at ``P`` if ``high[t+1] > P · (1 + b)``.
  Cost: commission only.
- limit-then-market: the limit above; if it does not fill, a market order at ``close[t+1]``
  paying half-spread + commission + impact.

Then everything is marked at ``close[t+1]``:
``PnL = shares_t · (close[t+1] − close[t]) + Δ_exec · (close[t+1] − price) − cost``,
``E_{t+1} = E_t + PnL`` (carried incrementally for float32 precision; ``cash + shares ·
close[t+1]`` equals it up to rounding) and ``reward = log(E_{t+1} / E_t) = log1p(PnL / E_t)``.
Ruin (``E_{t+1} ≤ 0``) ends the episode with the finite reward ``log(1e-6)``.

Fill flags (seen in the next observation): ``filled`` = 1 when shares changed hands,
``expired`` = 1 when a limit leg expired unfilled. A plain limit that expires gives (0, 1);
a limit-then-market whose limit expired and fell back to the close gives (1, 1).

Shapes: every function here acts on **one** environment (scalars, ``action`` int32 ``[4]``,
``obs`` float32 ``[window · F + 3]``); batch with ``jax.vmap`` with the market and the static
``EnvParams`` unbatched, e.g.
``jax.vmap(partial(step_autoreset, params), in_axes=(None, 0, 0, 0))(market, s, a, scale)``.
The market is a pytree argument (never a baked constant), so one compiled step serves any
split and any data of the same shape.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxdqn.config import EnvConfig
from jaxdqn.market.market_data import MarketData, draw_episode_range, make_market

__all__ = [
    "EnvParams",
    "EnvState",
    "MarketData",
    "Order",
    "executed_action",
    "make_market",
    "obs_dim",
    "observe",
    "order_of",
    "reset",
    "reset_at",
    "step",
    "step_autoreset",
    "target_position",
]

# |Δ| · close[t] at or below this fraction of equity is "already at target": no order.
REBALANCE_TOL = 1e-5
# Ruin floor for the reward: log(RUIN_FLOOR) ≈ −13.8 instead of log(≤ 0).
RUIN_FLOOR = 1e-6
# Number of position/fill entries appended to the feature window in the observation.
NUM_STATE_ENTRIES = 3


@dataclasses.dataclass(frozen=True)
class EnvParams:
    """Static (hashable) environment parameters; costs and ``limit_through`` (the trade-through
    margin ``b`` of a limit fill) are fractions, not bps.

    Pass it as a static argument or close over it; it is never traced.
    """

    window: int = 8
    episode_length: int = 256
    max_leverage: float = 1.0
    magnitude_levels: tuple[float, float, float] = (0.25, 0.5, 1.0)
    half_spread: float = 1e-4
    commission: float = 1e-4
    limit_offsets: tuple[float, float, float] = (1.0, 0.5, 0.0)
    impact_eta: float = 0.0
    participation: float = 0.1
    capital: float = 1.0e6
    limit_through: float = 5e-4
    hold_orders: bool = False  # close-only bars: orders held at market, now (executed_action)

    @classmethod
    def from_config(cls, env_cfg: EnvConfig, window: int, hold_orders: bool = False) -> EnvParams:
        """From ``cfg.env``, the window ``cfg.features.window`` and (close-only) hold_orders."""
        return cls(
            hold_orders=bool(hold_orders),
            window=int(window),
            episode_length=int(env_cfg.episode_length),
            max_leverage=float(env_cfg.max_leverage),
            magnitude_levels=tuple(float(v) for v in env_cfg.magnitude_levels),
            half_spread=float(env_cfg.half_spread_bps) * 1e-4,
            commission=float(env_cfg.commission_bps) * 1e-4,
            limit_offsets=tuple(float(v) for v in env_cfg.limit_offsets),
            impact_eta=float(env_cfg.impact_eta),
            participation=float(env_cfg.participation),
            capital=float(env_cfg.capital),
            limit_through=float(env_cfg.limit_through_bps) * 1e-4,
        )


@struct.dataclass
class EnvState:
    """State of one environment; the agent is about to decide after bar ``t`` closed.

    Attributes:
      t: int32 current bar.
      lo, hi: int32 half-open bar range of the split; a step needs ``t + 1 < hi``.
      step: int32 bars already played in this episode.
      cash, shares: float32 account (units of initial capital; shares of the instrument).
      equity: float32 ``E_t`` marked at ``close[t]``.
      last_filled, last_expired: float32 {0, 1} flags of the last order.
      key: PRNG key used only for auto-reset start draws.
      episode_return: float32 running sum of rewards (log return) of this episode.
    """

    t: jax.Array
    lo: jax.Array
    hi: jax.Array
    step: jax.Array
    cash: jax.Array
    shares: jax.Array
    equity: jax.Array
    last_filled: jax.Array
    last_expired: jax.Array
    key: jax.Array
    episode_return: jax.Array


# ---------------------------------------------------------------------------------------------
# Observation, reset
# ---------------------------------------------------------------------------------------------


def obs_dim(params: EnvParams, num_features: int) -> int:
    """Length of the observation: ``window · num_features + 3``."""
    return params.window * num_features + NUM_STATE_ENTRIES


def observe(params: EnvParams, market: MarketData, state: EnvState) -> jax.Array:
    """Observation at bar ``t``: float32 ``[window · F + 3]``.

    ``concat(features[t − W + 1 .. t].ravel(), [position fraction, last_filled, last_expired])``
    with position fraction ``shares · close[t] / E_t``.

    The window is one contiguous block of the row-major feature matrix, so it is gathered as
    ``features.ravel()[(t − W + 1) · F + j]`` and the three state entries are selected in by
    column, one elementwise pass with no concatenate. On an H200 at 131,072 envs this form
    took 34 µs per step against 72 µs for ``dynamic_slice`` + ``concatenate`` (which XLA
    emits as a slower concatenate kernel); bench/RESULTS.md has the numbers.
    """
    num_features = market.features.shape[1]
    width = params.window * num_features
    col = jnp.arange(width + NUM_STATE_ENTRIES, dtype=jnp.int32)
    flat = market.features.reshape(-1)
    # the clip only matters for the three state columns past the end of the last window
    idx = jnp.clip((state.t - (params.window - 1)) * num_features + col, 0, flat.shape[0] - 1)
    position = _position_fraction(state.shares, market.close[state.t], state.equity)
    extra = jnp.where(
        col == width, position, jnp.where(col == width + 1, state.last_filled, state.last_expired)
    )
    return jnp.where(col < width, flat[idx], extra.astype(flat.dtype))


def _position_fraction(shares: jax.Array, price: jax.Array, equity: jax.Array) -> jax.Array:
    safe = jnp.where(equity > 0, equity, 1.0)
    return jnp.where(equity > 0, shares * price / safe, 0.0)


def _initial_state(t0, lo, hi, key) -> EnvState:
    zero = jnp.zeros((), jnp.float32)
    return EnvState(
        t=jnp.asarray(t0, jnp.int32),
        lo=jnp.asarray(lo, jnp.int32),
        hi=jnp.asarray(hi, jnp.int32),
        step=jnp.zeros((), jnp.int32),
        cash=jnp.ones((), jnp.float32),
        shares=zero,
        equity=jnp.ones((), jnp.float32),
        last_filled=zero,
        last_expired=zero,
        key=key,
        episode_return=zero,
    )


def _draw_start(params: EnvParams, key: jax.Array, lo, hi) -> jax.Array:
    """Uniform start in ``[max(lo, W − 1), hi − 1 − H]``, or ``max(lo, W − 1)`` if shorter.

    One 32-bit draw reduced modulo the number of starts (bias below ``span / 2^32``, i.e.
    < 1e-5 for any daily series): half the PRNG work of ``jax.random.randint``, which matters
    because under ``vmap`` every environment draws on every auto-reset step.
    """
    first = jnp.maximum(jnp.asarray(lo, jnp.int32), params.window - 1)
    last = jnp.maximum(jnp.asarray(hi, jnp.int32) - 1 - params.episode_length, first)
    span = (last - first + 1).astype(jnp.uint32)
    return first + (jax.random.bits(key, (), jnp.uint32) % span).astype(jnp.int32)


def _episode_start(params: EnvParams, market: MarketData, key: jax.Array, lo, hi):
    """``(t0, lo, hi)`` of a new episode: a start in ``[lo, hi)`` or, on a panel market, in
    the range of an instrument drawn with a split of ``key`` (one instrument: the same draws
    as ever)."""
    if market.episode_ranges is not None:
        key, pick = jax.random.split(key)
        lo, hi = draw_episode_range(market, pick)
    return _draw_start(params, key, lo, hi), lo, hi


def reset(
    params: EnvParams, market: MarketData, lo, hi, key: jax.Array
) -> tuple[EnvState, jax.Array]:
    """Start an episode at a random bar of the split ``[lo, hi)`` (on a panel market: of the
    range of an instrument drawn first, :func:`~jaxdqn.market.market_data.draw_episode_range`;
    ``lo, hi`` are then not used).

    The start is uniform in ``[max(lo, window − 1), hi − 1 − H]`` (``H = episode_length``) so
    that the whole episode, including bar ``t + 1`` of its last step, stays inside the split;
    a split shorter than that starts at ``max(lo, window − 1)`` and ends at the split end.
    ``key`` is split: one half draws the start, the other becomes ``state.key``.

    Returns:
      ``(state, obs)`` with a flat account (cash 1, shares 0, equity 1).
    """
    key, sub = jax.random.split(key)
    state = _initial_state(*_episode_start(params, market, sub, lo, hi), key)
    return state, observe(params, market, state)


def reset_at(
    params: EnvParams, market: MarketData, t0, lo, hi, key: jax.Array
) -> tuple[EnvState, jax.Array]:
    """Start an episode deterministically at bar ``max(t0, window − 1)`` (e.g. ``t0 = lo``).

    Raising ``t0`` to ``window − 1`` keeps the first observation's window inside the data
    (a shorter window would be clamped onto later, unseen bars).
    """
    t0 = jnp.maximum(jnp.asarray(t0, jnp.int32), params.window - 1)
    state = _initial_state(t0, lo, hi, key)
    return state, observe(params, market, state)


# ---------------------------------------------------------------------------------------------
# Step
# ---------------------------------------------------------------------------------------------


def _pick3(i: jax.Array, values: tuple[Any, Any, Any]) -> jax.Array:
    """``values[i]`` for i in {0, 1, 2} as selects (cheaper than a gather on accelerators)."""
    return jnp.where(i == 0, values[0], jnp.where(i == 1, values[1], values[2]))


def target_position(params: EnvParams, action: jax.Array, scale: jax.Array) -> jax.Array:
    """``clip((action[0] − 1) · level[action[1]] · scale · L, −L, L)``, float32 scalar."""
    lev = params.max_leverage
    direction = (action[0] - 1).astype(jnp.float32)
    level = _pick3(action[1], tuple(jnp.float32(v) for v in params.magnitude_levels))
    return jnp.clip(direction * level * scale * lev, -lev, lev).astype(jnp.float32)


HELD_ORDER, HELD_URGENCY = 0, 2  # close-only bars: market, high urgency (next open = last close)


def executed_action(params: EnvParams, action: jax.Array) -> jax.Array:
    """The executed action: ``action`` (int32 ``[..., 4]``), with ``params.hold_orders`` its order
    and urgency held at market, high urgency (bars from closes alone have no intrabar range to
    simulate a limit or typical-price fill against honestly)."""
    if not params.hold_orders:
        return action
    held = jnp.asarray([HELD_ORDER, HELD_URGENCY], dtype=action.dtype)
    return action.at[..., 2:].set(jnp.broadcast_to(held, (*action.shape[:-1], 2)))


class Order(NamedTuple):
    """The order a decision after bar ``t`` sends for bar t+1 (float32 / bool scalars).

    Attributes:
      target: the target position fraction (:func:`target_position`).
      delta: the shares to trade, ``target · E_t / close[t] − shares``.
      wants: whether an order is sent at all (alive and beyond the rebalance dead band).
      buy: whether it buys (``delta > 0``).
      limit: the limit price ``close[t] · (1 ∓ k_u σ̂_t)`` of a limit leg (buy: minus).
    """

    target: jax.Array
    delta: jax.Array
    wants: jax.Array
    buy: jax.Array
    limit: jax.Array


def order_of(
    params: EnvParams, market: MarketData, state: EnvState, action: jax.Array, scale: jax.Array
) -> Order:
    """The :class:`Order` of the executed ``action`` (int32 ``[4]``) at ``scale`` after bar
    ``state.t`` closed: what :func:`step` executes in bar t+1, computed from bars ≤ t only (so
    ``python -m jaxdqn.predict`` can state it before bar t+1 exists)."""
    t = state.t
    c0, sig = market.close[t], market.sigma[t]
    e0 = state.equity
    e0s = jnp.where(e0 > 0, e0, 1.0)
    target = target_position(params, action, jnp.asarray(scale, jnp.float32))
    delta = target * e0s / c0 - state.shares
    wants = (e0 > 0) & (jnp.abs(delta) * c0 > REBALANCE_TOL * e0s)
    buy = delta > 0
    depth = _pick3(action[3], tuple(jnp.float32(v) for v in params.limit_offsets)) * sig
    limit = c0 * jnp.where(buy, 1.0 - depth, 1.0 + depth)
    return Order(target, delta, wants, buy, limit)


def _transition(
    params: EnvParams, market: MarketData, state: EnvState, action: jax.Array, scale: jax.Array
) -> tuple[EnvState, jax.Array, jax.Array, dict[str, jax.Array]]:
    """Execute the order within bar t+1 and mark at close[t+1] (no observation, no reset)."""
    chex.assert_shape(action, (4,))
    chex.assert_rank(scale, 0)
    action = executed_action(params, action.astype(jnp.int32))
    order, urgency = action[2], action[3]
    t = state.t
    n = t + 1
    c0, sig, adv = market.close[t], market.sigma[t], market.adv[t]
    o1, h1, l1, c1 = market.open[n], market.high[n], market.low[n], market.close[n]

    e0 = state.equity
    alive = e0 > 0
    e0s = jnp.where(alive, e0, 1.0)
    ask = order_of(params, market, state, action, scale)
    target, delta, wants, buy, limit_px = ask.target, ask.delta, ask.wants, ask.buy, ask.limit

    market_px = _pick3(urgency, (c1, (h1 + l1 + c1) * (1.0 / 3.0), o1))
    gap = jnp.where(buy, o1 <= limit_px, o1 >= limit_px)
    through = jnp.where(
        buy,
        l1 < limit_px * (1.0 - params.limit_through),
        h1 > limit_px * (1.0 + params.limit_through),
    )
    limit_fill = gap | through

    is_market = order == 0
    via_market = is_market | ((order == 2) & ~limit_fill)
    price = jnp.where(is_market, market_px, jnp.where(limit_fill, jnp.where(gap, o1, limit_px), c1))
    filled = wants & (via_market | limit_fill)
    expired = wants & ~is_market & ~limit_fill

    executed = jnp.where(filled, delta, 0.0)
    notional = jnp.abs(executed) * price
    rate = params.half_spread + params.commission
    if params.impact_eta > 0:
        currency = notional * params.capital
        impact = params.impact_eta * sig * jnp.sqrt(currency / (params.participation * adv))
        rate = rate + impact
    rate = jnp.where(via_market, rate, params.commission)
    cost = notional * rate

    pnl = state.shares * (c1 - c0) + executed * (c1 - price) - cost
    pnl = jnp.where(alive, pnl, 0.0)
    e1 = e0 + pnl
    ratio = pnl / e0s
    floored = ratio <= RUIN_FLOOR - 1.0
    reward = jnp.where(floored, np.log(RUIN_FLOOR), jnp.log1p(jnp.where(floored, 0.0, ratio)))
    ruined = alive & (e1 <= 0)

    step_count = state.step + 1
    done = ~alive | ruined | (step_count >= params.episode_length) | (n + 1 >= state.hi)
    episode_return = state.episode_return + reward
    shares = state.shares + executed
    nxt = state.replace(
        t=n,
        step=step_count,
        cash=state.cash - executed * price - cost,
        shares=shares,
        equity=e1,
        last_filled=filled.astype(jnp.float32),
        last_expired=expired.astype(jnp.float32),
        episode_return=episode_return,
    )
    info = {
        "target_position": target,
        "position": _position_fraction(shares, c1, e1),
        "filled": nxt.last_filled,
        "expired": nxt.last_expired,
        "fill_price": jnp.where(filled, price, 0.0),
        "traded": notional / e0s,
        "cost": cost / e0s,
        "equity": e1,
        "episode_return": jnp.where(done, episode_return, 0.0),
    }
    return nxt, reward, done, info


def step(
    params: EnvParams, market: MarketData, state: EnvState, action: jax.Array, scale: jax.Array
) -> tuple[EnvState, jax.Array, jax.Array, jax.Array, dict[str, jax.Array]]:
    """One decision: trade within bar t+1, mark at close[t+1], observe bar t+1.

    Args:
      params: static parameters.
      market: the bars (unbatched under vmap).
      state: the environment after bar ``t`` closed (needs ``t + 1 < hi``).
      action: int32 ``[4]`` = (direction, magnitude, order, urgency), each in {0, 1, 2}.
      scale: float32 scalar position scale (A3; 1.0 when not sizing).

    Returns:
      ``(state', obs', reward, done, info)``: reward ``log(E_{t+1}/E_t)`` float32; done bool
      (H bars played, split end reached, or ruin); ``info`` a dict of float32 scalars
      (target_position, position, filled, expired, fill_price (0 if nothing filled), traded
      and cost as fractions of ``E_t``, equity ``E_{t+1}``, episode_return (nonzero only when
      done)). ``step`` never resets; an already ruined state steps as a no-op with reward 0.
    """
    nxt, reward, done, info = _transition(params, market, state, action, scale)
    return nxt, observe(params, market, nxt), reward, done, info


def step_autoreset(
    params: EnvParams, market: MarketData, state: EnvState, action: jax.Array, scale: jax.Array
) -> tuple[EnvState, jax.Array, jax.Array, jax.Array, dict[str, jax.Array]]:
    """:func:`step`, but a finished episode restarts at a fresh random bar of its split (on a
    panel market: of a freshly drawn instrument's train range, so an episode never crosses from
    one instrument into another).

    ``reward``, ``done`` and ``info`` describe the transition just made; the returned state and
    observation are the new episode's first when ``done``. The start is drawn with a split of
    ``state.key`` (the other half becomes the new ``state.key``), so the key advances once per
    reset. The observation is gathered once, for whichever state survives the select.
    """
    nxt, reward, done, info = _transition(params, market, state, action, scale)
    key, sub = jax.random.split(state.key)
    fresh = _initial_state(*_episode_start(params, market, sub, state.lo, state.hi), key)
    nxt = jax.tree_util.tree_map(lambda a, b: jnp.where(done, a, b), fresh, nxt)
    return nxt, observe(params, market, nxt), reward, done, info
