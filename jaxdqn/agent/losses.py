"""Learner losses: C51 cross-entropy (L1), spread surrogate (L3), entropy ramp (L4) and the
auxiliary losses (L6), and :func:`make_loss`, their composition for one batch.

Per-example functions in the rlax style; the composed loss batches them with ``jax.vmap``.
Shapes: ``B`` batch, 4 branches, 3 actions, ``N`` atoms.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp

from jaxdqn.agent.targets import Target, per_group
from jaxdqn.config import LossConfig, ModelConfig
from jaxdqn.model.network import Model
from jaxdqn.model.xlstm import XLSTMState
from jaxdqn.shards import ONE_DEVICE, Shards
from pallas_kernels.c51_loss import c51_loss_head, padded_width


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
    taken = pick(log_p, actions, axis=1)  # [4, N]
    return -jnp.sum(jax.lax.stop_gradient(target_probs) * taken, axis=-1)


def pick(x: chex.Array, index: chex.Array, axis: int) -> chex.Array:
    """``x`` at ``index`` along ``axis`` (``index`` has ``x``'s shape without that axis and
    any trailing axes), by a one-hot select: the value is exactly ``take_along_axis``'s, and
    its gradient is a select too (one writer per element), where ``take_along_axis``'s is a
    scatter-add whose order a GPU does not fix (``train.deterministic``)."""
    choices = jnp.arange(x.shape[axis], dtype=index.dtype)
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    hot = index.reshape(*index.shape[:axis], 1, *index.shape[axis:])
    hot = hot.reshape(*hot.shape, *([1] * (x.ndim - hot.ndim))) == choices.reshape(shape)
    return jnp.sum(jnp.where(hot, x, 0.0), axis=axis)


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


def spread_gate(q: chex.Array, max_gap) -> chex.Array:
    """L3's bound: per branch clip(1 − gap / max_gap, 0, 1) with gap = max_a Q − min_a Q of one
    transition's ``q`` ``[4, 3]`` (no gradient). The push fades linearly as a branch's actions
    separate and is exactly 0 once their gap reaches ``max_gap``: L3 keeps action values from
    collapsing together, it never creates a spread of its own beyond that."""
    gap = jax.lax.stop_gradient(q.max(axis=-1) - q.min(axis=-1))
    return jnp.clip(1.0 - gap / max_gap, 0.0, 1.0)


def spread_surrogate(
    logits: chex.Array,
    actions: chex.Array,
    branch_scale: chex.Array,
    gate: chex.Array,
) -> chex.Array:
    """L3 surrogate whose gradient is the (bounded) spread term, for one transition.

    On the standardised support ẑ_i = −1 + 2i/(N − 1) (the atoms' positions relative to the
    support's centre, in half-widths),

        S = −Σ_b s_b g_b Σ_a c_{b,a} · E_{p_{b,a}}[ẑ]   (c, s, g under stop-gradient), so

        ∂S/∂logit_{b,a,i} = −s_b · g_b · c_{b,a} · p_{b,a,i} · (ẑ_i − E_{p_{b,a}}[ẑ]).

    Minimising S pushes the taken action's distribution toward higher atoms (c=+1), the adjacent
    challenger up at half strength (c=+½), the others down (c=−1): a pressure orthogonal to the
    Bellman error that keeps actions differentiated when the cross-entropy gradient vanishes.

    Bounded (L3, docs/DESIGN.md): on ẑ the gradient does not grow with Δz (the seed's
    Δz-scaled form grew as Δz² and, with M14's amplifier, ran away to a Q-gap of 18.9 on a
    20-wide support), and the gate g_b (:func:`spread_gate`) switches it off once the branch's
    Q-gap reaches ``loss.spread_max_gap`` reward units.

    Args:
      logits: ``[4, 3, N]`` per-action (dueling-combined) logits of M6.
      actions: int ``[4]`` taken actions.
      branch_scale: ``[4]`` s_b = spread_weight × branch weight × liquid_mod (M14) / B.
      gate: ``[4]`` g_b in [0, 1].
    Returns:
      scalar surrogate.
    """
    n = logits.shape[-1]
    z_hat = jnp.linspace(-1.0, 1.0, n, dtype=logits.dtype)
    p = jax.nn.softmax(logits, axis=-1)
    q = jnp.sum(p * z_hat, axis=-1)  # [4, 3]
    coef = spread_coefficients(actions, q) * (branch_scale * gate)[:, None]
    return -jnp.sum(jax.lax.stop_gradient(coef) * q)


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


def selectivity_target(per_sample_loss: chex.Array, shards: Shards = ONE_DEVICE) -> chex.Array:
    """L6 selectivity label: clip(loss_i / mean loss, 0, 1) ``[B]`` (no gradient; the mean over
    the global batch when it is split over devices)."""
    m = jnp.maximum(shards.mean(jnp.mean(per_sample_loss)), 1e-12)
    return jax.lax.stop_gradient(jnp.clip(per_sample_loss / m, 0.0, 1.0))


# ---------------------------------------------------------------------------------------------
# The composed loss of one batch
# ---------------------------------------------------------------------------------------------


class LossParts(NamedTuple):
    """The terms of the total loss and what the rest of the update needs from the forward pass
    (everything but ``total`` without gradient)."""

    total: chex.Array
    c51: chex.Array
    spread: chex.Array
    entropy: chex.Array
    denoise: chex.Array
    coord: chex.Array
    select: chex.Array
    xlstm: chex.Array
    per_sample: chex.Array  # [B] → priorities, selectivity labels
    q_mean: chex.Array  # [B, 4, 3]
    utilisation: chex.Array
    mean_entropy: chex.Array
    xlstm_state: XLSTMState
    context: chex.Array


class LossInputs(NamedTuple):
    """What one evaluation of the loss reads besides the parameters: the learner's batch, its
    targets and the dynamics' current values."""

    obs: chex.Array  # [B, D]
    actions: chex.Array  # int32 [B, 4] taken actions
    weights: chex.Array  # [B] L8 importance weights
    target: Target  # L1/L2: target distributions [B, 4, N] and TD targets [B, 4]
    q_target_s: chex.Array  # [B, 4, 3] target network's E[Q] at s (zeros when not needed)
    v_min: chex.Array  # L7 support's lower end
    delta_z: chex.Array  # L7 atom spacing
    entropy_coef: chex.Array  # L4 coefficient
    liquid_mod: chex.Array  # [4] M14's modulation of the L3 term
    xlstm_state: XLSTMState  # M13 cell state
    last_stats: chex.Array  # [4, 3] the previous batch's per-branch statistics (M13 input)


class LossCoefficients(NamedTuple):
    """The weights of the total loss, ``total = Σ_k coef_k · term_k`` (Python floats or float32
    arrays; nothing in them changes a shape, so a population may carry its own).

    Attributes:
      c51: L1's weight.
      spread: ``[4]`` L3's per-branch weights s_b = ``spread_weight × spread_branch_scale_b``
        (applied inside the term, per branch, with M14's modulation and 1/B).
      entropy: L4's weight (on −entropy_coef · mean entropy; the ramped coefficient is an input).
      denoise, coord, select, xlstm: the L6 terms' weights (M9, M10/M11, M12, M13).
    """

    c51: Any = 1.0
    spread: Any = (1.0, 1.0, 1.0, 1.0)
    entropy: Any = 1.0
    denoise: Any = 1.0
    coord: Any = 1.0
    select: Any = 1.0
    xlstm: Any = 1.0


class LossTerms(NamedTuple):
    """Which terms the loss computes (static: a term switched off is not traced)."""

    spread: bool  # L3
    entropy: bool  # L4
    aux: bool  # L6, each with its model component:
    denoiser: bool  # M9
    coordination: bool  # M10/M11
    selectivity: bool  # M12
    xlstm: bool  # M13


@dataclasses.dataclass(frozen=True)
class Loss:
    """``loss(params, inputs: LossInputs, coefficients: LossCoefficients) -> (total,
    LossParts)`` (:func:`batch_loss` bound by :func:`make_loss`), for ``jax.grad(...,
    has_aux=True)``; ``coefficients`` the config's weights; ``needs_target_q_s`` tells the
    learner whether to compute the target network's Q at s (the denoiser's regression target)."""

    loss: Callable[[Any, LossInputs, LossCoefficients], tuple[chex.Array, LossParts]]
    coefficients: LossCoefficients
    needs_target_q_s: bool


def make_loss_coefficients(cfg: LossConfig) -> LossCoefficients:
    """The config's weights: L3's per branch, every other term 1."""
    return LossCoefficients(spread=tuple(w * cfg.spread_weight for w in cfg.spread_branch_scale))


def spread_term(
    out: Any, actions: chex.Array, weights: Any, liquid_mod: chex.Array, max_gap: Any
) -> chex.Array:
    """L3 over the batch: Σ_i of :func:`spread_surrogate` with per-branch scale ``weights`` ×
    liquid_mod (M14, no gradient) / B and the gate of each sample's Q-gap at ``max_gap``."""
    b = actions.shape[0]
    branch_scale = jnp.asarray(weights, jnp.float32) * jax.lax.stop_gradient(liquid_mod) / b
    gate = jax.vmap(spread_gate, in_axes=(0, None))(out.q_mean, max_gap)
    surrogate = jax.vmap(spread_surrogate, in_axes=(0, 0, None, 0))
    return jnp.sum(surrogate(out.logits, actions, branch_scale, gate))


def auxiliary_terms(
    params: Any,
    inputs: LossInputs,
    out: Any,
    per_sample: chex.Array,
    *,
    model: Model,
    terms: LossTerms,
    shards: Shards,
) -> tuple[tuple[chex.Array, ...], XLSTMState, chex.Array]:
    """L6: ``(denoise, coord, select, xlstm)`` (0 when off), M13's new state and context.
    ``per_sample`` and ``out.q_mean`` arrive without gradient."""
    zero = jnp.zeros((), jnp.float32)
    denoise = coord = select = xl = zero
    new_xlstm, context = inputs.xlstm_state, inputs.xlstm_state.context
    if not terms.aux:
        return (denoise, coord, select, xl), new_xlstm, context
    coordinated = model.coordinate(params, out.q_mean)
    q_coord = coordinated.q + coordinated.mean  # back on the network's scale
    if terms.denoiser:
        denoise = jnp.mean(jnp.square(q_coord - inputs.q_target_s))
    if terms.coordination:
        coord = jnp.mean(huber(pick(q_coord, inputs.actions, axis=2) - inputs.target.td))
    if terms.selectivity:
        label = selectivity_target(per_sample, shards)
        select = jnp.mean(binary_cross_entropy(out.selectivity, label))
    if terms.xlstm:
        q_batch = shards.mean(out.q_mean.mean())
        xl, (new_xlstm, context) = model.xlstm.prediction_loss(
            params["xlstm"], inputs.xlstm_state, inputs.last_stats, q_batch
        )
    return (denoise, coord, select, xl), new_xlstm, context


DUELING_HEADS = ("dueling", "dueling_interpret", "dueling_padded", "dueling_padded_interpret")
"""The settings whose kernels read the heads' outputs before M6 (:attr:`NetworkOutput.heads`)."""
LOSS_HEADS = ("reference", "pallas", "interpret", *DUELING_HEADS)
"""The resolved ``kernels.loss_head`` settings."""


def raw_head_width(backend: str, num_atoms: int) -> int:
    """The width W of each of the heads' ``[v | A_0 | …]`` a model made for ``backend``
    (``kernels.loss_head`` resolved) returns: 0 (no heads) for the reference and the logits
    kernels, N for ``dueling``, N rounded up to a power of two ≥ 16 for ``dueling_padded``."""
    if backend not in DUELING_HEADS:
        return 0
    return padded_width(num_atoms) if "padded" in backend else num_atoms


def loss_head(out: Any, inputs: LossInputs, backend: str) -> tuple[Any, ...]:
    """What the loss reads from the online distributions: L1's per-branch cross-entropies
    ``[B, 4]``, the entropies ``[B, 4, 3]`` (L4; differentiable), the network's output ``out``
    with its E[Q] ``[B, 4, 3]`` (``q_mean``) and the atom utilisation (scalar; both read
    without gradient).

    ``backend`` (``kernels.loss_head`` resolved, one of :data:`LOSS_HEADS`): ``reference``
    computes them as they always were — :func:`c51_cross_entropy`, :func:`entropy`, the model's
    M7 E[Q] and :func:`atom_utilisation` of its softmax, each a pass of its own over the
    ``[B, 4, 3, N]`` logits; ``pallas`` | ``interpret`` by the two Triton kernels of
    :mod:`pallas_kernels.c51_loss` (compiled | interpreted), which read the logits once forward
    and once backward, the utilisation then ``mean(exp H) / N`` of their entropies;
    ``dueling`` | ``dueling_interpret``: those kernels reading the heads' ``[v | A_0 | A_1 |
    A_2]`` (``out.heads``, a model made with ``raw_heads``) and doing M6's combination
    themselves, so the combination's passes forward and backward go too (where the model gives
    no heads, as the logits kernels); ``dueling_padded`` | ``dueling_padded_interpret``: the
    same on heads each padded to 64 columns (:func:`raw_head_width`: whole, aligned rows for
    the kernels' loads and stores; the heads' product that much wider). The same math, equal
    to float rounding (the reference's utilisation clips p at 1e-12)."""
    if backend not in LOSS_HEADS:
        raise ValueError(f"kernels.loss_head: {backend!r} is not one of {LOSS_HEADS}")
    if backend == "reference":
        ce = jax.vmap(c51_cross_entropy)(out.logits, inputs.actions, inputs.target.probs)
        utilisation = atom_utilisation(jax.lax.stop_gradient(out.probs))
        return ce, entropy(out.logits), out, utilisation
    b, branches, actions, n = out.logits.shape
    dueling = backend in DUELING_HEADS and out.heads is not None
    x = out.heads if dueling else out.logits
    ce, h, q = c51_loss_head(
        x.reshape(b * branches, x.shape[2], x.shape[3]),
        inputs.actions.reshape(-1),
        inputs.target.probs.reshape(b * branches, n),
        per_group(inputs.v_min, b, branches),
        per_group(inputs.delta_z, b, branches),
        dueling=dueling,
        backend="interpret" if backend.endswith("interpret") else "pallas",
    )
    utilisation = jnp.mean(jnp.exp(jax.lax.stop_gradient(h))) / n
    shape = (b, branches, actions)
    # the kernel's E[Q] replaces the model's M7 pass: XLA drops that pass
    return (
        ce.reshape(b, branches),
        h.reshape(shape),
        out._replace(q_mean=q.reshape(shape)),
        utilisation,
    )


def batch_loss(
    params: Any,
    inputs: LossInputs,
    coefficients: LossCoefficients,
    *,
    model: Model,
    terms: LossTerms,
    max_gap: Any,
    shards: Shards = ONE_DEVICE,
    head: str = "reference",
) -> tuple[chex.Array, LossParts]:
    """The total loss of one batch and its parts (the math: :func:`make_loss`)."""
    k = coefficients
    out = model.apply(params, inputs.obs, inputs.v_min, inputs.delta_z)
    ce, row_entropy, out, utilisation = loss_head(out, inputs, head)
    per_sample = ce.sum(axis=-1)
    c51 = jnp.mean(inputs.weights * per_sample)
    spread = jnp.zeros((), jnp.float32)
    if terms.spread:
        spread = spread_term(out, inputs.actions, k.spread, inputs.liquid_mod, max_gap)
    mean_entropy = jnp.mean(row_entropy)
    ent = -inputs.entropy_coef * mean_entropy if terms.entropy else jnp.zeros((), jnp.float32)
    per_sample_sg = jax.lax.stop_gradient(per_sample)
    q_sg = jax.lax.stop_gradient(out.q_mean)
    aux, new_xlstm, context = auxiliary_terms(
        params,
        inputs,
        out._replace(q_mean=q_sg),
        per_sample_sg,
        model=model,
        terms=terms,
        shards=shards,
    )
    denoise, coord, select, xl = aux
    total = (
        k.c51 * c51
        + spread
        + k.entropy * ent
        + k.denoise * denoise
        + k.coord * coord
        + k.select * select
        + k.xlstm * xl
    )
    parts = LossParts(
        total=total,
        c51=c51,
        spread=spread,
        entropy=ent,
        denoise=denoise,
        coord=coord,
        select=select,
        xlstm=xl,
        per_sample=per_sample_sg,
        q_mean=q_sg,
        utilisation=utilisation,
        mean_entropy=jax.lax.stop_gradient(mean_entropy),
        xlstm_state=new_xlstm,
        context=context,
    )
    return total, parts


def make_loss(
    cfg: LossConfig,
    model_cfg: ModelConfig,
    model: Model,
    *,
    max_gap: float = float("inf"),
    shards: Shards = ONE_DEVICE,
    head: str = "reference",
) -> Loss:
    """Total loss = L1 + L3 + L4 + L6 for ``cfg`` and the model's component switches
    (:func:`batch_loss` bound; ``max_gap``: L3's bound in Q units, ``loss.spread_max_gap`` ×
    the reward unit, resolved once by :func:`jaxdqn.agent.resolve.resolve`; ``head``: how L1,
    L4's entropies and the online E[Q] are computed, :func:`loss_head`).

    The coordinator (M8–M11) and the xLSTM (M13) see stop-gradient copies of the online E[Q],
    so their terms (L6) do not reach the trunk or the branches; the selectivity head (M12)
    reads the trunk output itself, so its BCE trains the trunk too. One optax update serves
    every parameter group:

    - L1: IS-weighted C51 cross-entropy of the taken actions, summed over branches;
    - L3: bounded spread surrogate, per-branch scale ``spread_weight`` ×
      ``spread_branch_scale`` × liquid_mod (M14) / B, gated off at a Q-gap of ``max_gap``;
    - L4: −entropy_coef × mean entropy of the online distributions;
    - L6: denoiser MSE against the target network's Q at s, Huber of the coordinated Q of the
      taken actions against the scalar TD target (M9/M10), selectivity BCE (M12), and the
      xLSTM's prediction of this batch's mean Q from the previous batch's statistics (M13).

    With the batch split over devices (``shards``) every term is a per-device mean over equally
    many rows, so the mean over devices of its gradient is the global batch's gradient; the
    batch-level quantities inside (M8's mean, the selectivity label's mean loss, M13's mean Q)
    are global.
    """
    coordination = model_cfg.q_attention or model_cfg.graph
    terms = LossTerms(
        cfg.spread,
        cfg.entropy,
        cfg.aux_training,
        model_cfg.denoiser,
        coordination,
        model_cfg.selectivity,
        model_cfg.xlstm,
    )
    loss = functools.partial(
        batch_loss, model=model, terms=terms, max_gap=max_gap, shards=shards, head=head
    )
    return Loss(
        loss=loss,
        coefficients=make_loss_coefficients(cfg),
        needs_target_q_s=terms.aux and terms.denoiser,
    )
