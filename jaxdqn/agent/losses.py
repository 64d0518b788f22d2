"""Learner losses: C51 cross-entropy (L1), spread surrogate (L3), entropy ramp (L4) and the
auxiliary losses (L6).

Per-example functions in the rlax style; the learner batches them with ``jax.vmap``.
Shapes: 4 branches, 3 actions, ``N`` atoms.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def c51_cross_entropy(
    logits: chex.Array, actions: chex.Array, target_probs: chex.Array
) -> chex.Array:
    """L1 for one transition: Σ_branches −Σ_i m_i log p_i(s, a_branch).

    Args:
      logits: ``[4, 3, N]`` online logits at s.
      actions: int ``[4]`` taken actions.
      target_probs: ``[4, N]`` projected targets (no gradient).
    Returns:
      ``[4]`` per-branch cross-entropies.
    """
    chex.assert_rank([logits, actions, target_probs], [3, 1, 2])
    log_p = jax.nn.log_softmax(logits, axis=-1)
    taken = jnp.take_along_axis(log_p, actions[:, None, None], axis=1)[:, 0]  # [4, N]
    return -jnp.sum(jax.lax.stop_gradient(target_probs) * taken, axis=-1)


def challenger(actions: chex.Array, q: chex.Array) -> chex.Array:
    """The adjacent action that challenges the taken one: the higher-valued index neighbour.

    Args:
      actions: int ``[4]``; q: ``[4, 3]``.
    Returns:
      int32 ``[4]``: 1 for a=0, 1 for a=2, and argmax(q[0], q[2]) for a=1.
    """
    middle_pick = jnp.where(q[:, 2] > q[:, 0], 2, 0)
    return jnp.where(actions == 1, middle_pick, 1).astype(jnp.int32)


def spread_coefficients(actions: chex.Array, q: chex.Array) -> chex.Array:
    """L3 coefficients ``[4, 3]``: +1 taken, +0.5 challenger, −1 the rest."""
    a = jax.nn.one_hot(actions, 3)
    c = jax.nn.one_hot(challenger(actions, q), 3)
    return a + 0.5 * c - (1.0 - a - c)


def spread_surrogate(
    logits: chex.Array,
    actions: chex.Array,
    z: chex.Array,
    branch_scale: chex.Array,
) -> chex.Array:
    """L3 surrogate whose gradient is the spread term, for one transition.

    S = −Σ_b s_b Σ_a c_{b,a} · E_{p_{b,a}}[z]  with c and s under stop-gradient, so that

        ∂S/∂logit_{b,a,i} = −s_b · c_{b,a} · p_{b,a,i} · (z_i − E[Q_{b,a}]).

    Minimising S pushes the taken action's distribution toward higher atoms (c=+1), the
    adjacent challenger up at half strength (c=+½), the others down (c=−1): a pressure
    orthogonal to the Bellman error that keeps actions differentiated when the cross-entropy
    gradient vanishes. The logits are the per-action (dueling-combined) logits of M6.

    Args:
      logits: ``[4, 3, N]``.
      actions: int ``[4]`` taken actions.
      z: ``[N]`` support.
      branch_scale: ``[4]`` per-branch scale: Δz/B × branch weight × liquid_mod (M14).
    Returns:
      scalar surrogate.
    """
    p = jax.nn.softmax(logits, axis=-1)
    q = jnp.sum(p * z, axis=-1)  # [4, 3]
    coef = jax.lax.stop_gradient(spread_coefficients(actions, q) * branch_scale[:, None])
    return -jnp.sum(coef * q)


def entropy(logits: chex.Array) -> chex.Array:
    """Shannon entropy over the last (atom) axis."""
    log_p = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.sum(jnp.exp(log_p) * log_p, axis=-1)


def atom_utilisation(probs: chex.Array) -> chex.Array:
    """Fraction of atoms in use: exp(entropy) / N (perplexity over N), averaged.

    1 for a uniform distribution, 1/N for a point mass. Its EMA drives the L4 ramp.
    """
    p = jnp.clip(probs, 1e-12, 1.0)
    h = -jnp.sum(p * jnp.log(p), axis=-1)
    return jnp.mean(jnp.exp(h)) / probs.shape[-1]


def entropy_coefficient(base: chex.Array, utilisation_ema: chex.Array) -> chex.Array:
    """L4 ramp: base · (1 + clip((0.5 − u)/0.5, 0, 1)).

    No extra bonus while at least half the atoms are in use; +1× base when none are.
    """
    extra = jnp.clip((0.5 - utilisation_ema) / 0.5, 0.0, 1.0)
    return base * (1.0 + extra)


def huber(x: chex.Array, delta: float = 1.0) -> chex.Array:
    """Elementwise Huber loss."""
    ax = jnp.abs(x)
    return jnp.where(ax <= delta, 0.5 * x**2, delta * (ax - 0.5 * delta))


def binary_cross_entropy(p: chex.Array, target: chex.Array, eps: float = 1e-6) -> chex.Array:
    """Elementwise BCE of probability ``p`` against a soft target in [0, 1]."""
    p = jnp.clip(p, eps, 1.0 - eps)
    return -(target * jnp.log(p) + (1.0 - target) * jnp.log1p(-p))


def selectivity_target(per_sample_loss: chex.Array) -> chex.Array:
    """L6 selectivity label: clip(loss_i / mean loss, 0, 1) ``[B]`` (no gradient)."""
    m = jnp.maximum(jnp.mean(per_sample_loss), 1e-12)
    return jax.lax.stop_gradient(jnp.clip(per_sample_loss / m, 0.0, 1.0))
