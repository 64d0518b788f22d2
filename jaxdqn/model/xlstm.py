"""M13: an mLSTM-style recurrent context over per-branch statistics of the current batch.

One step per learner update. Input ``x ∈ R^12`` = for each of the 4 branches (mean Q, Q-gap,
Q-std) of the batch (:func:`batch_statistics`). The cell follows the stabilised mLSTM of
Beck et al. (2024), "xLSTM: Extended Long Short-Term Memory", with a matrix memory
``C ∈ R^{d×d}``, a normaliser ``n ∈ R^d`` and a log-scale stabiliser ``m``:

    s        = symlog(x) = sign(x) · log(1 + |x|)          (gates, query, key: O(1) inputs)
    q = W_q s + b_q,   k = (W_k s + b_k)/√d,   v = W_v x + b_v      (value sees raw x)
    ĩ = w_i·s + b_i,   f̃ = w_f·s + b_f,   o = sigmoid(W_o s + b_o)
    m_t = max(log σ(f̃) + m_{t−1}, ĩ)
    i' = exp(ĩ − m_t),   f' = exp(log σ(f̃) + m_{t−1} − m_t)
    C_t = f' C_{t−1} + i' v kᵀ,   n_t = f' n_{t−1} + i' k
    h_t = o ⊙ (C_t q) / max(|n_tᵀ q|, exp(−m_t), 1e-6)

The context vector is ``h_t`` (length ``d = xlstm_hidden``). ``context[0]`` is trained (L6, by
the learner) to predict the batch mean Q; because the value path sees the raw statistics, the
context can carry the Q scale while the gates see a compressed version and stay well-conditioned.
The forget-gate bias starts at 3 (σ(3) ≈ 0.95, a memory of ~20 updates).

State and parameters are explicit; ``step`` is pure and keeps everything on device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import struct
from jax import Array

from jaxdqn.branches import NUM_BRANCHES
from jaxdqn.config import ModelConfig

__all__ = [
    "NUM_INPUTS",
    "XLSTM",
    "MLSTMCell",
    "XLSTMState",
    "batch_statistics",
    "make_xlstm",
]

NUM_INPUTS = NUM_BRANCHES * 3  # per branch: mean Q, Q-gap, Q-std


@struct.dataclass
class XLSTMState:
    """mLSTM memory: ``c [d, d]``, ``n [d]``, ``m []`` (log stabiliser), last ``context [d]``."""

    c: Array
    n: Array
    m: Array
    context: Array


def batch_statistics(q: Array) -> Array:
    """Per-branch statistics of a batch of expected values, the xLSTM's input.

    Args:
      q: ``[B, 4, 3]`` E[Q] per sample, branch and action.
    Returns:
      ``[4, 3]``: per branch (mean over batch and actions of q,
      mean over the batch of max_a q − min_a q, std over batch and actions of q).
    """
    chex.assert_rank(q, 3)
    mean = jnp.mean(q, axis=(0, 2))
    gap = jnp.mean(jnp.max(q, axis=2) - jnp.min(q, axis=2), axis=0)
    std = jnp.std(q, axis=(0, 2))
    return jnp.stack([mean, gap, std], axis=-1)


def _symlog(x: Array) -> Array:
    return jnp.sign(x) * jnp.log1p(jnp.abs(x))


class MLSTMCell(nn.Module):
    """One stabilised mLSTM step (see the module docstring): ``(state, x [12]) -> state``."""

    hidden: int

    @nn.compact
    def __call__(self, state: XLSTMState, x: Array) -> XLSTMState:
        d = self.hidden
        s = _symlog(x)
        q = nn.Dense(d, name="query")(s)
        k = nn.Dense(d, name="key")(s) / jnp.sqrt(float(d))
        v = nn.Dense(d, name="value")(x)
        i_pre = nn.Dense(1, name="input_gate")(s)[0]
        f_pre = nn.Dense(1, bias_init=nn.initializers.constant(3.0), name="forget_gate")(s)[0]
        o = jax.nn.sigmoid(nn.Dense(d, name="output_gate")(s))

        log_f = jax.nn.log_sigmoid(f_pre)
        m = jnp.maximum(log_f + state.m, i_pre)
        i_gate = jnp.exp(i_pre - m)
        f_gate = jnp.exp(log_f + state.m - m)
        c = f_gate * state.c + i_gate * jnp.outer(v, k)
        n = f_gate * state.n + i_gate * k
        denom = jnp.maximum(jnp.maximum(jnp.abs(n @ q), jnp.exp(-m)), 1e-6)
        h = o * (c @ q) / denom
        return XLSTMState(c=c, n=n, m=m, context=h)


@dataclasses.dataclass(frozen=True)
class XLSTM:
    """Pure functions of M13 (from :func:`make_xlstm`).

    - ``init(key) -> params`` (``{}`` when M13 is off)
    - ``init_state() -> XLSTMState`` (zeros)
    - ``step(params, state, stats [4, 3] or [12]) -> (state, context [d])``; when M13 is off
      the state is returned unchanged and the context is zeros.
    - ``prediction_loss(params, state, stats, target) -> (loss, (state, context))``:
      ``(context[0] − target)²`` after one step; the carried memory is a constant
      (``stop_gradient``), so the gradient runs through this step only (output gate, retrieval
      and the current write). For ``jax.value_and_grad(..., has_aux=True)``.
    """

    hidden: int
    enabled: bool
    init: Callable[[Array], dict[str, Any]]
    init_state: Callable[[], XLSTMState]
    step: Callable[[dict[str, Any], XLSTMState, Array], tuple[XLSTMState, Array]]
    prediction_loss: Callable[
        [dict[str, Any], XLSTMState, Array, Array], tuple[Array, tuple[XLSTMState, Array]]
    ]


def make_xlstm(cfg: ModelConfig) -> XLSTM:
    """Factory of the M13 pure functions for ``cfg`` (``cfg.xlstm`` switches it)."""
    d = cfg.xlstm_hidden
    cell = MLSTMCell(hidden=d)

    def init_state() -> XLSTMState:
        return XLSTMState(
            c=jnp.zeros((d, d), jnp.float32),
            n=jnp.zeros((d,), jnp.float32),
            m=jnp.zeros((), jnp.float32),
            context=jnp.zeros((d,), jnp.float32),
        )

    def init(key: Array) -> dict[str, Any]:
        if not cfg.xlstm:
            return {}
        variables = cell.init(key, init_state(), jnp.zeros((NUM_INPUTS,), jnp.float32))
        return dict(variables["params"])

    def step(params: dict[str, Any], state: XLSTMState, stats: Array) -> tuple[XLSTMState, Array]:
        x = jnp.reshape(stats, (NUM_INPUTS,))
        if not cfg.xlstm:
            return state, jnp.zeros_like(state.context)
        new = cell.apply({"params": params}, state, x)
        return new, new.context

    def prediction_loss(
        params: dict[str, Any], state: XLSTMState, stats: Array, target: Array
    ) -> tuple[Array, tuple[XLSTMState, Array]]:
        new_state, context = step(params, jax.lax.stop_gradient(state), stats)
        return jnp.square(context[0] - target), (new_state, context)

    return XLSTM(
        hidden=d,
        enabled=cfg.xlstm,
        init=init,
        init_state=init_state,
        step=step,
        prediction_loss=prediction_loss,
    )
