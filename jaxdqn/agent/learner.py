"""One learner update (L1–L8, M13, M14): sample → targets → losses → optax → priorities →
target network → training statistics.

:func:`make_learner` closes over the config sections it needs and returns
``update(state) -> (state, metrics)``, a pure function the iteration scans ``U`` times.
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
import optax

from jaxdqn.agent import dynamics as dynamics_lib
from jaxdqn.agent import losses, targets
from jaxdqn.agent import replay as replay_lib
from jaxdqn.agent.dynamics import BatchObservation, Dynamics, Rates
from jaxdqn.agent.losses import Loss, LossCoefficients, LossInputs, LossParts
from jaxdqn.agent.population import MemberValues
from jaxdqn.agent.replay import Replay
from jaxdqn.agent.state import TrainState
from jaxdqn.agent.targets import Target
from jaxdqn.branches import NUM_ACTIONS, NUM_BRANCHES
from jaxdqn.config import LossConfig, ReplayConfig
from jaxdqn.model.network import Model
from jaxdqn.shards import ONE_DEVICE, Shards

__all__ = [
    "Batch",
    "Learner",
    "LearnerHypers",
    "LearnerSpec",
    "Pieces",
    "Prepared",
    "beta_schedule",
    "learn",
    "loss_inputs",
    "make_learner",
    "member_hypers",
    "observation",
    "prepare",
    "rank_normalised",
    "sample",
    "step",
    "step_metrics",
    "target_network",
    "update",
    "update_target",
]


class Batch(NamedTuple):
    """The learner's sample: replay items with their importance weights and slots."""

    obs: chex.Array  # [B, D]
    actions: chex.Array  # int32 [B, 4]
    reward: chex.Array  # [B] n-step return (raw; ``step`` rank-normalises it when L5 is on)
    discount: chex.Array  # [B] γⁿ or 0
    next_obs: chex.Array  # [B, D]
    weights: chex.Array  # [B] importance weights
    indices: chex.Array  # int32 [B]


def beta_schedule(updates: chex.Array, beta0: float, anneal_updates: int) -> chex.Array:
    """L8: IS exponent annealed linearly from β₀ to 1 over ``anneal_updates`` updates."""
    frac = jnp.minimum(updates.astype(jnp.float32) / anneal_updates, 1.0)
    return beta0 + (1.0 - beta0) * frac


def rank_normalised(batch: Batch, reward_std: chex.Array, shards: Shards) -> Batch:
    """L5: ``batch`` with its n-step rewards replaced by their ranks over the global batch,
    scaled to the reward-std EMA (:func:`jaxdqn.agent.targets.rank_normalise`)."""
    ranked = targets.rank_normalise(shards.gather(batch.reward), reward_std)
    return batch._replace(reward=shards.rows(ranked, batch.obs.shape[0]))


def target_network(
    model: Model,
    target_params: chex.ArrayTree,
    batch: Batch,
    v_min: chex.Array,
    delta_z: chex.Array,
    *,
    two_passes: bool,
    fused: bool,
) -> tuple[Any, chex.Array]:
    """The target network's output at s′ (a :class:`~jaxdqn.model.network.NetworkOutput` of
    ``B`` rows) and its E[Q] at s (``[B, 4, 3]``) when the loss needs it (``two_passes``; zeros
    otherwise). ``fused``: one pass over [s′; s]: the network is row-wise (no batch statistics
    before M8), so each half equals its own pass."""
    b = batch.obs.shape[0]
    if two_passes and fused:
        both = model.apply(
            target_params, jnp.concatenate([batch.next_obs, batch.obs]), v_min, delta_z
        )
        return jax.tree.map(lambda x: x[:b], both), both.q_mean[b:]
    next_out = model.apply(target_params, batch.next_obs, v_min, delta_z)
    if two_passes:
        q_target_s = model.apply(target_params, batch.obs, v_min, delta_z).q_mean
    else:
        q_target_s = jnp.zeros((b, NUM_BRANCHES, NUM_ACTIONS), jnp.float32)
    return next_out, q_target_s


def update_target(
    params: chex.ArrayTree,
    target_params: chex.ArrayTree,
    updates: chex.Array,
    *,
    hard: bool,
    period: int,
    polyak_rate: Any,
) -> chex.ArrayTree:
    """L2's target network after update number ``updates``: the online parameters copied every
    ``period`` updates (``hard``), else Polyak averaging θ⁻ ← ρ θ + (1 − ρ) θ⁻ at rate
    ``polyak_rate`` ρ (``loss.polyak_tau``)."""
    if hard:
        return optax.periodic_update(params, target_params, updates, period)
    return optax.incremental_update(params, target_params, polyak_rate)


def step_metrics(
    parts: LossParts,
    batch: Batch,
    target: Target,
    grads: chex.ArrayTree,
    utilisation: chex.Array,
    entropy_coef: chex.Array,
    dyn_metrics: dict[str, chex.Array],
    shards: Shards,
) -> dict[str, chex.Array]:
    """One update's metrics: the loss parts and batch means over the global batch, the global
    gradient's norm, the dynamics' statistics and the largest priority."""
    means = {
        "loss": parts.total,
        "loss_c51": parts.c51,
        "loss_spread": parts.spread,
        "loss_entropy": parts.entropy,
        "loss_denoise": parts.denoise,
        "loss_coord": parts.coord,
        "loss_select": parts.select,
        "loss_xlstm": parts.xlstm,
        "entropy": parts.mean_entropy,
        "priority_mean": parts.per_sample.mean(),
        "is_weight_mean": batch.weights.mean(),
        "td_target_mean": target.td.mean(),
    }
    return {
        **shards.mean(means),
        "grad_norm": optax.tree.norm(grads),
        **dyn_metrics,
        "atom_utilisation": utilisation,
        "entropy_coef": entropy_coef,
        "priority_max": shards.max(parts.per_sample.max()),
        "end_atom_mass": target.end_mass,
    }


class LearnerSpec(NamedTuple):
    """What the update's program is made of (static: a change recompiles)."""

    batch_size: int  # this device's rows B/D
    # L8 IS weights (off: all 1; :func:`jaxdqn.agent.resolve.replay_weighting`)
    importance_weights: bool
    rank_rewards: bool  # L5
    hard_target: bool  # L2: periodic copy (else Polyak)
    target_period: int  # updates between hard copies
    sampled_target: bool  # L2 a′ sampled (else argmax)
    projection: Any  # P1 backend (:class:`jaxdqn.agent.resolve.Projection`)
    target_head: str  # kernels.target_head resolved: reference, or the kernel's backend
    fused: bool  # one target-network pass over [s′; s]
    shards: Shards  # the devices one agent's batch is split over


class LearnerHypers(NamedTuple):
    """The update's numbers that change no shape: arguments of :func:`step`, never closure
    constants (Python floats, or float32 arrays when they change at run time)."""

    beta0: Any  # L8 IS exponent at update 0
    beta_anneal_updates: Any  # updates over which β reaches 1
    polyak_rate: Any  # L2 Polyak rate (``loss.polyak_tau``)
    temperature_floor: Any  # L2 Boltzmann temperature floor in Q units
    entropy_base: Any  # L4 base coefficient
    loss: LossCoefficients  # the total loss's weights
    rates: Rates  # what the dynamics adapt with: L7's γⁿ and rates, the statistics' EMA rate
    replay_alpha: Any  # L8 priority exponent α of the new priorities


class Pieces(NamedTuple):
    """The agent's functions one update composes."""

    model: Model
    loss: Loss
    replay: Replay
    optimizer: optax.GradientTransformation
    dynamics: Dynamics


def sample(
    state: TrainState,
    key: chex.PRNGKey,
    *,
    pieces: Pieces,
    spec: LearnerSpec,
    hypers: LearnerHypers,
) -> Batch:
    """L8 prioritised sample of this device's ``B/D`` rows (raw n-step rewards)."""
    beta = beta_schedule(state.updates, hypers.beta0, hypers.beta_anneal_updates)
    drawn = pieces.replay.sample(state.replay, key, spec.batch_size, beta, spec.shards)
    items, weights = drawn.items, drawn.is_weights
    if not spec.importance_weights:
        weights = jnp.ones_like(weights)
    return Batch(
        obs=items.obs,
        actions=items.action,
        reward=items.reward,
        discount=items.discount,
        next_obs=items.next_obs,
        weights=weights,
        indices=drawn.indices,
    )


class Prepared(NamedTuple):
    """What one update learns from, computed before its gradient: the batch as learned from
    (L5's ranks applied) and its learning target on the support it was projected onto."""

    batch: Batch
    target: Target  # L2 + P1: target distributions and TD targets
    q_target_s: chex.Array  # [B, 4, 3] target network's E[Q] at s (zeros when not needed)
    v_min: chex.Array  # L7 support the target lives on
    delta_z: chex.Array


def prepare(
    state: TrainState,
    batch: Batch,
    key: chex.PRNGKey,
    *,
    pieces: Pieces,
    spec: LearnerSpec,
    hypers: LearnerHypers,
) -> Prepared:
    """L5 → the target network (:func:`target_network`) → L2 + P1
    (:func:`~jaxdqn.agent.targets.target_distribution`, or with ``kernels.target_head`` one
    kernel, :func:`~jaxdqn.agent.targets.target_from_network`), with ``state``'s target parameters,
    support and reward-std EMA."""
    dyn = state.dynamics
    v_min, delta_z = pieces.dynamics.grid(dyn)
    if spec.rank_rewards:
        batch = rank_normalised(batch, dyn.reward_std_ema, spec.shards)
    next_out, q_target_s = target_network(
        pieces.model,
        state.target_params,
        batch,
        v_min,
        delta_z,
        two_passes=pieces.loss.needs_target_q_s,
        fused=spec.fused,
    )
    common = {
        "temperature_floor": hypers.temperature_floor,
        "sampled": spec.sampled_target,
        "shards": spec.shards,
    }
    if spec.target_head == "reference":
        target = targets.target_distribution(
            key,
            next_out.probs,
            next_out.q_mean,
            batch.reward,
            batch.discount,
            v_min,
            delta_z,
            projection=spec.projection,
            **common,
        )
    else:
        target = targets.target_from_network(
            key, next_out, batch.reward, batch.discount, v_min, delta_z,
            backend=spec.target_head, **common,
        )  # fmt: skip
    return Prepared(batch=batch, target=target, q_target_s=q_target_s, v_min=v_min, delta_z=delta_z)


def loss_inputs(state: TrainState, prepared: Prepared, hypers: LearnerHypers) -> LossInputs:
    """The loss's inputs: ``prepared`` (the batch, its target and the support it lives on)
    and the dynamics' current values in ``state`` (L4's ramped coefficient, M13, M14)."""
    dyn = state.dynamics
    entropy_coef = losses.entropy_coefficient(jnp.float32(hypers.entropy_base), dyn.utilisation_ema)
    batch = prepared.batch
    return LossInputs(
        obs=batch.obs,
        actions=batch.actions,
        weights=batch.weights,
        target=prepared.target,
        q_target_s=prepared.q_target_s,
        v_min=prepared.v_min,
        delta_z=prepared.delta_z,
        entropy_coef=entropy_coef,
        liquid_mod=dyn.liquid.mod,
        xlstm_state=dyn.xlstm,
        last_stats=dyn.last_stats,
    )


def observation(parts: LossParts, batch: Batch, target: Target, shards: Shards) -> BatchObservation:
    """What the dynamics observe of one update: the global batch's rows (every device observes
    the same batch and keeps the same statistics)."""
    return BatchObservation(
        q_mean=shards.gather(parts.q_mean),
        td=shards.gather(target.td),
        reward=shards.gather(batch.reward),
        utilisation=shards.mean(parts.utilisation),
        xlstm=parts.xlstm_state,
        context=parts.context,
    )


def step(
    state: TrainState,
    batch: Batch,
    key: chex.PRNGKey,
    *,
    pieces: Pieces,
    spec: LearnerSpec,
    hypers: LearnerHypers,
) -> tuple[TrainState, dict[str, chex.Array]]:
    """Everything after the sample: targets → loss and gradient → optax → priorities (L8) →
    target network (L2) → statistics (L7, M13, M14). With the batch split over devices the
    gradients and every batch statistic are global, so each device applies the same update."""
    prepared = prepare(state, batch, key, pieces=pieces, spec=spec, hypers=hypers)
    return learn(state, prepared, pieces=pieces, spec=spec, hypers=hypers)


def learn(
    state: TrainState,
    prepared: Prepared,
    *,
    pieces: Pieces,
    spec: LearnerSpec,
    hypers: LearnerHypers,
) -> tuple[TrainState, dict[str, chex.Array]]:
    """:func:`step` from a prepared batch: loss and gradient → optax → priorities (L8) →
    target network (L2) → statistics (L7, M13, M14)."""
    batch, inputs = prepared.batch, loss_inputs(state, prepared, hypers)
    grads, parts = jax.grad(pieces.loss.loss, has_aux=True)(state.params, inputs, hypers.loss)
    # Every loss term is a mean over this device's (equally many) rows: the mean of the
    # devices' gradients is the global batch's gradient.
    grads = spec.shards.mean(grads)
    upd, opt_state = pieces.optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, upd)
    updates = state.updates + 1
    replay_state = replay_lib.set_priorities(
        state.replay,
        batch.indices,
        parts.per_sample,
        alpha=hypers.replay_alpha,
        eps=pieces.replay.eps,
    )
    target_params = update_target(
        params,
        state.target_params,
        updates,
        hard=spec.hard_target,
        period=spec.target_period,
        polyak_rate=hypers.polyak_rate,
    )
    seen = observation(parts, batch, inputs.target, spec.shards)
    dyn, dyn_metrics = dynamics_lib.observe_batch(
        state.dynamics, seen, rates=hypers.rates, liquid=pieces.dynamics.liquid
    )
    new_state = state.replace(
        params=params,
        target_params=target_params,
        opt_state=opt_state,
        replay=replay_state,
        dynamics=dyn,
        updates=updates,
    )
    metrics = step_metrics(
        parts,
        batch,
        inputs.target,
        grads,
        seen.utilisation,
        inputs.entropy_coef,
        dyn_metrics,
        spec.shards,
    )
    return new_state, metrics


def member_hypers(hypers: LearnerHypers, members: MemberValues | None) -> LearnerHypers:
    """``hypers`` with a population member's values (β₀, Polyak rate, L4 base, α, L3's
    weights, and the dynamics' γⁿ, EMA rate and L7 rates); unchanged without a population."""
    if members is None:
        return hypers
    return hypers._replace(
        beta0=members.beta0,
        polyak_rate=members.polyak_rate,
        entropy_base=members.entropy_base,
        replay_alpha=members.alpha,
        loss=hypers.loss._replace(spread=members.spread),
        rates=hypers.rates._replace(
            gamma_n=members.gamma_n,
            ema=members.stats_alpha,
            sigmas=members.support_sigmas,
            base_alpha=members.support_alpha,
            max_alpha=members.support_max_alpha,
        ),
    )


def update(
    state: TrainState, *, pieces: Pieces, spec: LearnerSpec, hypers: LearnerHypers
) -> tuple[TrainState, dict[str, chex.Array]]:
    """One learner update: split the state's key, :func:`sample`, :func:`step` (a population
    member's own values, ``state.members``, replace the bound ones: :func:`member_hypers`)."""
    hypers = member_hypers(hypers, state.members)
    key, k_sample, k_target = jax.random.split(state.key, 3)
    bound = {"pieces": pieces, "spec": spec, "hypers": hypers}
    batch = sample(state, spec.shards.fold(k_sample), **bound)
    return step(state.replace(key=key), batch, k_target, **bound)


@dataclasses.dataclass(frozen=True)
class Learner:
    """``update(state) -> (state, metrics)`` (from :func:`make_learner`) = ``sample(state,
    key) -> Batch`` then ``step`` = :func:`prepare` then ``learn(state, prepared) -> (state,
    metrics)``, exposed for tests and benchmarks; what is bound into them (``pieces``,
    ``spec``, ``hypers``) for :mod:`jaxdqn.agent.pipeline`."""

    update: Callable[[TrainState], tuple[TrainState, dict[str, chex.Array]]]
    sample: Callable[[TrainState, chex.PRNGKey], Batch]
    step: Callable[[TrainState, Batch, chex.PRNGKey], tuple[TrainState, dict[str, chex.Array]]]
    hypers: LearnerHypers
    learn: Callable[[TrainState, Prepared], tuple[TrainState, dict[str, chex.Array]]]
    pieces: Pieces
    spec: LearnerSpec


def make_learner(
    loss_cfg: LossConfig,
    replay_cfg: ReplayConfig,
    *,
    pieces: Pieces,
    resolved: Any,
    shards: Shards = ONE_DEVICE,
) -> Learner:
    """The learner update for the config sections, the agent's ``pieces`` and what
    :func:`jaxdqn.agent.resolve.resolve` decided (``resolved``: the P1 backend, the fused
    target pass, the IS weighting, the temperature floor in Q units); ``shards``: the devices
    one agent's batch is split over, ``replay_cfg.batch_size`` being this device's rows."""
    spec = LearnerSpec(
        batch_size=replay_cfg.batch_size,
        importance_weights=resolved.importance_weights,
        rank_rewards=loss_cfg.rank_rewards,
        hard_target=loss_cfg.target_update == "hard",
        target_period=loss_cfg.target_period,
        sampled_target=loss_cfg.sampled_target,
        projection=resolved.projection,
        target_head=resolved.target_head,
        fused=resolved.fused,
        shards=shards,
    )
    hypers = LearnerHypers(
        beta0=replay_cfg.priority_beta0,
        beta_anneal_updates=replay_cfg.beta_anneal_updates,
        polyak_rate=loss_cfg.polyak_tau,
        temperature_floor=resolved.temperature_floor,
        entropy_base=loss_cfg.entropy_base,
        loss=pieces.loss.coefficients,
        rates=pieces.dynamics.rates,
        replay_alpha=pieces.replay.alpha,
    )
    bound = {"pieces": pieces, "spec": spec, "hypers": hypers}
    return Learner(
        update=functools.partial(update, **bound),
        sample=functools.partial(sample, **bound),
        step=functools.partial(step, **bound),
        hypers=hypers,
        learn=functools.partial(learn, **bound),
        pieces=pieces,
        spec=spec,
    )
