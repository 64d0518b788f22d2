"""M8–M11: coordination of the 12 branch Q-values (4 branches × 3 actions) before acting.

A separate flax module with its own parameters (the ``aux`` group of the model's parameter tree),
applied to the expected values ``q [B, 4, 3]`` that the network produces. In order:

- **M8 centering** (two-phase): ``μ = mean over batch, branches and actions of q`` (reduce),
  then ``q − μ`` (subtract). Softmax-based action selection within a branch is invariant to a
  common shift, so centering changes no action probabilities by itself; it keeps the
  coordination layers below working on values near zero whatever the drift of the Q scale.
- **M9 Q-attention**: ``x = vec(q) ∈ R^12``; per head h (``d = max(1, 12 // heads)``)
  ``q_h = W_q^h x``, ``k_h = W_k^h x``, ``v_h = W_v^h x``,
  ``g_h = sigmoid(q_h · k_h / √d)``, ``out = W_o concat_h(g_h · v_h)``, ``x ← x + out``.
  With one "token" softmax attention would be trivially 1, so this is a learned per-head gate.
  ``W_o`` and its bias start at zero: identity at initialisation.
- **M10 graph messages** on the directed edges dir→mag, dir→ord, mag→urg, ord→urg only, one
  synchronous round: ``q_d ← q_d + Σ_{s→d} sigmoid(w_g^{sd} · [q_s, q_d] + b_g^{sd}) ·
  (W_m^{sd} q_s + b_m^{sd})`` with ``W_m, b_m`` zero-initialised (identity at initialisation).
  Direction receives no edge, so it never depends on the other branches here.
- **M11 denoiser**: ``K`` residual steps ``x ← x + W_2 silu(W_1 x + b_1) + b_2`` over the 12
  values, each step with its own weights; ``W_2, b_2`` zero-initialised (identity at init).

Every step has a switch in :class:`~jaxdqn.config.ModelConfig`; with all off, ``coordinate`` is
the identity and the parameter tree is empty.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import Array

from jaxdqn.branches import NUM_ACTIONS, NUM_BRANCHES, NUM_Q
from jaxdqn.config import ModelConfig
from jaxdqn.model.dense import Dense
from jaxdqn.shards import ONE_DEVICE, Shards

__all__ = [
    "EDGES",
    "Coordinated",
    "Coordination",
    "Coordinator",
    "Denoiser",
    "GraphMessages",
    "QAttention",
    "center",
    "make_coordination",
]

#: Directed edges (source branch, destination branch): dir→mag, dir→ord, mag→urg, ord→urg.
EDGES: tuple[tuple[int, int], ...] = ((0, 1), (0, 2), (1, 3), (2, 3))
_EDGE_NAMES = ("dir_to_mag", "dir_to_ord", "mag_to_urg", "ord_to_urg")

_zeros = nn.initializers.zeros


class Coordinated(NamedTuple):
    """Output of the coordination steps.

    ``q`` is in the centred frame; ``q + mean`` is back on the network's scale (e.g. for a loss
    against an un-centred TD target). ``mean`` is 0 when M8 is off.
    """

    q: Array  # [B, 4, 3]
    mean: Array  # [] the global mean removed by M8


def center(q: Array, shards: Shards = ONE_DEVICE) -> tuple[Array, Array]:
    """M8: ``(q − μ, μ)`` with ``μ`` the mean over every axis (batch and the 12 values); with
    the batch split over devices, over the global batch (equal rows per device)."""
    mean = shards.mean(jnp.mean(q))
    return q - mean, mean


class QAttention(nn.Module):
    """M9: 2-head (configurable) sigmoid-gated Q-attention with a zero-initialised residual."""

    heads: int = 2

    @nn.compact
    def __call__(self, q: Array) -> Array:
        """``q [B, 4, 3] -> [B, 4, 3]``."""
        b = q.shape[0]
        x = q.reshape(b, NUM_Q)
        d = max(1, NUM_Q // self.heads)
        qh = Dense(self.heads * d, name="query")(x).reshape(b, self.heads, d)
        kh = Dense(self.heads * d, name="key")(x).reshape(b, self.heads, d)
        vh = Dense(self.heads * d, name="value")(x).reshape(b, self.heads, d)
        gate = jax.nn.sigmoid(jnp.sum(qh * kh, axis=-1) / jnp.sqrt(float(d)))  # [B, heads]
        mixed = (gate[..., None] * vh).reshape(b, self.heads * d)
        out = Dense(NUM_Q, kernel_init=_zeros, bias_init=_zeros, name="out")(mixed)
        return (x + out).reshape(q.shape)


class GraphMessages(nn.Module):
    """M10: gated messages along :data:`EDGES`, one synchronous round, zero-initialised."""

    @nn.compact
    def __call__(self, q: Array) -> Array:
        """``q [B, 4, 3] -> [B, 4, 3]``; branch 0 (direction) is returned unchanged."""
        incoming = [jnp.zeros_like(q[:, 0]) for _ in range(NUM_BRANCHES)]
        for (src, dst), name in zip(EDGES, _EDGE_NAMES, strict=True):
            q_s, q_d = q[:, src], q[:, dst]
            gate = jax.nn.sigmoid(
                Dense(1, name=f"{name}_gate")(jnp.concatenate([q_s, q_d], axis=-1))
            )
            message = Dense(
                NUM_ACTIONS, kernel_init=_zeros, bias_init=_zeros, name=f"{name}_message"
            )(q_s)
            incoming[dst] = incoming[dst] + gate * message
        return q + jnp.stack(incoming, axis=1)


class Denoiser(nn.Module):
    """M11: ``steps`` residual FC → SiLU → FC steps over the 12 values, last layer zero-init."""

    steps: int = 2
    hidden: int = 32

    @nn.compact
    def __call__(self, q: Array) -> Array:
        """``q [B, 4, 3] -> [B, 4, 3]``."""
        x = q.reshape(q.shape[0], NUM_Q)
        for k in range(self.steps):
            h = nn.silu(Dense(self.hidden, name=f"step{k}_fc1")(x))
            x = x + Dense(NUM_Q, kernel_init=_zeros, bias_init=_zeros, name=f"step{k}_fc2")(h)
        return x.reshape(q.shape)


class Coordination(nn.Module):
    """M8 → M9 → M10 → M11, each behind its switch. Parameters: attention, graph, denoiser."""

    cfg: ModelConfig
    shards: Shards = ONE_DEVICE

    @nn.compact
    def __call__(self, q: Array) -> Coordinated:
        c = self.cfg
        if c.q_centering:
            x, mean = center(q, self.shards)
        else:
            x, mean = q, jnp.zeros((), q.dtype)
        if c.q_attention:
            x = QAttention(heads=c.attention_heads, name="attention")(x)
        if c.graph:
            x = GraphMessages(name="graph")(x)
        if c.denoiser:
            x = Denoiser(steps=c.denoise_steps, hidden=c.denoise_hidden, name="denoiser")(x)
        return Coordinated(q=x, mean=mean)


@dataclasses.dataclass(frozen=True)
class Coordinator:
    """Pure functions of the coordination module (from :func:`make_coordination`).

    ``init(key) -> params`` (a dict with keys among ``attention, graph, denoiser``) and
    ``apply(params, q [B, 4, 3]) -> Coordinated``.
    """

    init: Callable[[Array], dict[str, Any]]
    apply: Callable[[dict[str, Any], Array], Coordinated]


def make_coordination(cfg: ModelConfig, shards: Shards = ONE_DEVICE) -> Coordinator:
    """Factory of the M8–M11 pure functions for ``cfg`` (``shards``: the batch's devices)."""
    module = Coordination(cfg, shards)

    def init(key: Array) -> dict[str, Any]:
        # (the same parameters on any devices: initialised outside the devices' program)
        variables = Coordination(cfg).init(
            key, jnp.zeros((1, NUM_BRANCHES, NUM_ACTIONS), jnp.float32)
        )
        return dict(variables.get("params", {}))

    def apply(params: dict[str, Any], q: Array) -> Coordinated:
        chex.assert_rank(q, 3)
        chex.assert_axis_dimension(q, 1, NUM_BRANCHES)
        chex.assert_axis_dimension(q, 2, NUM_ACTIONS)
        return module.apply({"params": params}, q)

    return Coordinator(init=init, apply=apply)
