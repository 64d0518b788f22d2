"""n-step transitions from vectorised rollouts (L8), bootstrapping with γⁿ.

For a step sequence ``(o_t, a_t, r_t, d_t)`` of one environment, where ``d_t = 1`` means the
episode ended with the transition out of ``o_t`` (so ``o_{t+1}`` belongs to the next episode
after an auto-reset), the n-step transition starting at ``t`` is

    n'_t   = min(n, 1 + steps from t to the first episode end at or after t)
    R_t    = Σ_{k < n'_t} γ^k r_{t+k}
    γ_t    = γ^n if no episode ends within r_t … r_{t+n-1}, else 0
    o'_t   = o_{t + n'_t}

so the learner's target is ``R_t + γ_t · Z(o'_t)``: the bootstrap discount is γⁿ (not γ), and a
window that reaches an episode end stops there and does not bootstrap. ``o'_t`` with ``γ_t = 0``
is only a placeholder (the reset observation after an auto-reset).

:func:`nstep_targets` is the pure math over one window; :func:`make_nstep_accumulator` turns
successive ``K``-step rollouts of ``E`` environments into exactly ``K · E`` transitions each by
carrying the last ``n - 1`` steps of the previous rollout, so no transition is lost at rollout
boundaries. Transitions are delayed by ``n - 1`` steps; the ones that would start before the
first step ever seen are flagged invalid (pass the flag to ``Replay.add(..., valid=...)``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
from flax import struct

__all__ = [
    "NStepAccumulator",
    "NStepState",
    "Transition",
    "init",
    "make_nstep_accumulator",
    "nstep_targets",
    "update",
]

PyTree = Any


def nstep_targets(
    rewards: jax.Array, dones: jax.Array, gamma: Any, n: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """n-step returns, bootstrap discounts and bootstrap offsets over a window.

    Args:
      rewards: float ``[L, E]`` rewards ``r_0 … r_{L-1}`` (time-major).
      dones: bool or {0, 1} ``[L, E]``; ``dones[t]`` ends the episode after ``r_t``.
      gamma: discount γ (Python float or float32 scalar array).
      n: steps per transition (static, ``1 <= n <= L``).

    Returns:
      returns: float32 ``[K, E]`` ``R_t`` for ``t = 0 … K-1``, ``K = L - n + 1``.
      discounts: float32 ``[K, E]`` ``γ^n`` or 0 (episode end inside the window).
      offsets: int32 ``[K, E]`` ``n'_t`` in ``1 … n``: the bootstrap observation is
        ``o_{t + n'_t}``.
    """
    chex.assert_rank([rewards, dones], 2)
    chex.assert_equal_shape([rewards, dones])
    length = rewards.shape[0]
    if not 1 <= n <= length:
        raise ValueError(f"n-step: need 1 <= n <= window length, got n={n}, length={length}")
    num = length - n + 1
    gamma = jnp.asarray(gamma, jnp.float32)
    rewards = rewards.astype(jnp.float32)
    ended = dones.astype(jnp.float32)
    alive = jnp.ones(rewards.shape[1:], jnp.float32)[None].repeat(num, axis=0)  # [K, E]
    returns = jnp.zeros_like(alive)
    offsets = jnp.zeros(alive.shape, jnp.int32)
    for k in range(n):
        # alive = 1 while no episode has ended in r_t … r_{t+k-1}: r_{t+k} still counts.
        returns = returns + alive * gamma**k * rewards[k : k + num]
        offsets = offsets + alive.astype(jnp.int32)
        alive = alive * (1.0 - ended[k : k + num])
    discounts = alive * gamma**n
    return returns, discounts, offsets


class Transition(NamedTuple):
    """n-step transitions, every leaf ``[K, E, ...]``.

    Attributes:
      obs: observation ``o_t`` (pytree).
      action: action ``a_t`` (pytree).
      reward: float32 n-step return ``R_t``.
      discount: float32 bootstrap discount ``γ^n`` or 0.
      next_obs: bootstrap observation ``o_{t+n'}`` (pytree).
      selectivity: float32 value carried unchanged with ``o_t``: the M12 selectivity
        prediction made at ``o_t``, which scales the transition's insertion priority (L8);
        ones when the caller passes none.
    """

    obs: PyTree
    action: PyTree
    reward: jax.Array
    discount: jax.Array
    next_obs: PyTree
    selectivity: jax.Array


@struct.dataclass
class NStepState:
    """The last ``n - 1`` steps of the previous rollouts (leaves ``[n-1, E, ...]``).

    Attributes:
      obs, action: pytrees of the carried steps.
      reward, selectivity: float32 ``[n-1, E]``.
      done: bool ``[n-1, E]``.
      valid: bool ``[n-1]`` whether each carried step was ever filled by a rollout.
    """

    obs: PyTree
    action: PyTree
    reward: jax.Array
    selectivity: jax.Array
    done: jax.Array
    valid: jax.Array


@dataclasses.dataclass(frozen=True)
class NStepAccumulator:
    """Pure functions turning ``K``-step rollouts into n-step transitions.

    Attributes:
      n: steps per transition.
      gamma: discount γ.
      init: ``(obs, action) -> NStepState`` from one example step of every environment (leaves
        ``[E, ...]``; values are ignored, only shapes and dtypes are used).
      update: ``(state, obs, action, reward, done, final_obs, selectivity=None) -> (state,
        Transition, valid)`` with ``obs, action`` leaves ``[K, E, ...]``, ``reward, done`` (and
        ``selectivity``, default ones) ``[K, E]``, and
        ``final_obs`` leaves ``[E, ...]`` the observation after the last step. Returns ``K``
        transitions per environment (leaves ``[K, E, ...]``) and ``valid`` bool ``[K, E]``
        (False only for the ``n - 1`` starts before the first step ever seen).
    """

    n: int
    gamma: float
    init: Callable[[PyTree, PyTree], NStepState]
    update: Callable[..., tuple[NStepState, Transition, jax.Array]]


def init(obs: PyTree, action: PyTree, *, n: int) -> NStepState:
    """An empty carry of ``n - 1`` steps, shaped from one example step of every environment
    (leaves ``[E, ...]``; only shapes and dtypes are used)."""
    tail = n - 1
    zeros = lambda x: jnp.zeros((tail, *jnp.shape(x)), jnp.asarray(x).dtype)
    num_envs = jax.tree.leaves(obs)[0].shape[0]
    return NStepState(
        obs=jax.tree.map(zeros, obs),
        action=jax.tree.map(zeros, action),
        reward=jnp.zeros((tail, num_envs), jnp.float32),
        selectivity=jnp.zeros((tail, num_envs), jnp.float32),
        done=jnp.zeros((tail, num_envs), bool),
        valid=jnp.zeros((tail,), bool),
    )


def update(
    state: NStepState,
    obs: PyTree,
    action: PyTree,
    reward: jax.Array,
    done: jax.Array,
    final_obs: PyTree,
    selectivity: jax.Array | None = None,
    *,
    n: int,
    gamma: Any,
) -> tuple[NStepState, Transition, jax.Array]:
    """``K`` rollout steps (leaves ``[K, E, ...]``) → ``K`` n-step transitions per environment
    and their ``valid`` flags ``[K, E]``, and the carry of the last ``n - 1`` steps
    (:class:`NStepAccumulator`'s ``update``)."""
    steps = reward.shape[0]
    if selectivity is None:
        selectivity = jnp.ones_like(reward, jnp.float32)
    cat = lambda a, b: jnp.concatenate([a, b.astype(a.dtype)], axis=0)
    seq_obs = jax.tree.map(cat, state.obs, obs)  # [L, E, ...], L = K + n - 1
    seq_action = jax.tree.map(cat, state.action, action)
    seq_reward = cat(state.reward, reward)
    seq_selectivity = cat(state.selectivity, selectivity)
    seq_done = cat(state.done, done)
    seq_valid = jnp.concatenate([state.valid, jnp.ones((steps,), bool)])
    returns, discounts, offsets = nstep_targets(seq_reward, seq_done, gamma, n)
    # o_{t + n'} from the L + 1 observations (the rollout's plus the one after it).
    all_obs = jax.tree.map(lambda s, f: cat(s, f[None]), seq_obs, final_obs)
    gather_at = jnp.arange(steps, dtype=jnp.int32)[:, None] + offsets  # [K, E]
    bootstrap = lambda x: jnp.take_along_axis(
        x, gather_at.reshape(gather_at.shape + (1,) * (x.ndim - 2)), axis=0
    )
    transition = Transition(
        obs=jax.tree.map(lambda x: x[:steps], seq_obs),
        action=jax.tree.map(lambda x: x[:steps], seq_action),
        reward=returns,
        discount=discounts,
        next_obs=jax.tree.map(bootstrap, all_obs),
        selectivity=seq_selectivity[:steps],
    )
    valid = jnp.broadcast_to(seq_valid[:steps, None], returns.shape)
    keep = lambda x: x[steps:]
    carry = NStepState(
        obs=jax.tree.map(keep, seq_obs),
        action=jax.tree.map(keep, seq_action),
        reward=keep(seq_reward),
        selectivity=keep(seq_selectivity),
        done=keep(seq_done),
        valid=keep(seq_valid),
    )
    return carry, transition, valid


def make_nstep_accumulator(n: int, gamma: float) -> NStepAccumulator:
    """Check ``n`` and bind ``n``-step returns with discount ``gamma`` to :func:`init` and
    :func:`update`."""
    if n < 1:
        raise ValueError(f"n-step: n must be >= 1, got {n}")
    return NStepAccumulator(
        n=n,
        gamma=gamma,
        init=functools.partial(init, n=n),
        update=functools.partial(update, n=n, gamma=gamma),
    )
