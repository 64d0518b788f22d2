"""One learner update (L1–L8, M13, M14): sample → targets → losses → optax → priorities →
target network → training statistics.

:func:`make_learner` closes over the config sections it needs and returns
``update(state) -> (state, metrics)``, a pure function the iteration scans ``U`` times.
Shapes: ``B`` batch, 4 branches, 3 actions, ``N`` atoms.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import optax

from jaxdqn.agent import losses, targets
from jaxdqn.agent.dynamics import BatchObservation, Dynamics
from jaxdqn.agent.losses import Loss, LossInputs, LossParts
from jaxdqn.agent.replay import Replay
from jaxdqn.agent.state import TrainState
from jaxdqn.agent.targets import Target
from jaxdqn.branches import NUM_ACTIONS, NUM_BRANCHES
from jaxdqn.config import KernelsConfig, LossConfig, ReplayConfig
from jaxdqn.model.network import Model
from jaxdqn.shards import ONE_DEVICE, Shards

__all__ = [
    "Batch",
    "Learner",
    "beta_schedule",
    "make_learner",
    "rank_normalised",
    "step_metrics",
    "target_outputs",
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


def target_outputs(
    model: Model,
    target_params: chex.ArrayTree,
    batch: Batch,
    v_min: chex.Array,
    delta_z: chex.Array,
    *,
    two_passes: bool,
    fused: bool,
) -> tuple[chex.Array, chex.Array, chex.Array]:
    """The target network's ``(probs, E[Q])`` at s′ (``[B, 4, 3, N]``, ``[B, 4, 3]``) and its
    E[Q] at s (``[B, 4, 3]``) when the loss needs it (``two_passes``; zeros otherwise).
    ``fused``: one pass over [s′; s]: the network is row-wise (no batch statistics before M8),
    so each half equals its own pass."""
    b = batch.obs.shape[0]
    if two_passes and fused:
        both = model.apply(
            target_params, jnp.concatenate([batch.next_obs, batch.obs]), v_min, delta_z
        )
        return both.probs[:b], both.q_mean[:b], both.q_mean[b:]
    next_out = model.apply(target_params, batch.next_obs, v_min, delta_z)
    if two_passes:
        q_target_s = model.apply(target_params, batch.obs, v_min, delta_z).q_mean
    else:
        q_target_s = jnp.zeros((b, NUM_BRANCHES, NUM_ACTIONS), jnp.float32)
    return next_out.probs, next_out.q_mean, q_target_s


def update_target(
    params: chex.ArrayTree,
    target_params: chex.ArrayTree,
    updates: chex.Array,
    *,
    hard: bool,
    period: int,
    polyak_tau: float,
) -> chex.ArrayTree:
    """L2's target network after update number ``updates``: the online parameters copied every
    ``period`` updates (``hard``), else Polyak averaging θ⁻ ← τ θ + (1 − τ) θ⁻."""
    if hard:
        return optax.periodic_update(params, target_params, updates, period)
    return optax.incremental_update(params, target_params, polyak_tau)


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


@dataclasses.dataclass(frozen=True)
class Learner:
    """``update(state) -> (state, metrics)`` (from :func:`make_learner`) = ``sample(state,
    key) -> Batch`` then ``step(state, batch, key) -> (state, metrics)``; both are exposed for
    tests (e.g. one given batch on one device vs split over several) and benchmarks."""

    update: Callable[[TrainState], tuple[TrainState, dict[str, chex.Array]]]
    sample: Callable[[TrainState, chex.PRNGKey], Batch]
    step: Callable[[TrainState, Batch, chex.PRNGKey], tuple[TrainState, dict[str, chex.Array]]]


def make_learner(
    loss_cfg: LossConfig,
    replay_cfg: ReplayConfig,
    kernels_cfg: KernelsConfig,
    *,
    model: Model,
    loss: Loss,
    replay: Replay,
    optimizer: optax.GradientTransformation,
    dynamics: Dynamics,
    tau_floor: float = 1e-6,
    fused: bool = False,
    shards: Shards = ONE_DEVICE,
) -> Learner:
    """Factory of the learner update for the given config sections and agent pieces
    (``tau_floor``: L2's temperature floor in Q units; ``fused``: one target-network pass over
    [s'; s] where the loss needs both, ``kernels.fused`` resolved; ``shards``: the devices one
    agent's batch is split over, ``replay_cfg.batch_size`` being this device's rows)."""
    batch_size, prioritised = replay_cfg.batch_size, replay_cfg.prioritised
    beta0, anneal = replay_cfg.priority_beta0, replay_cfg.beta_anneal_updates
    rank_rewards = loss_cfg.rank_rewards
    entropy_base = loss_cfg.entropy_base
    hard_target, period, polyak_tau = (
        loss_cfg.target_update == "hard",
        loss_cfg.target_period,
        loss_cfg.polyak_tau,
    )
    projection = kernels_cfg.projection
    sampled_target = loss_cfg.sampled_target

    def sample(state: TrainState, key: chex.PRNGKey) -> Batch:
        """L8 prioritised sample of this device's ``B/D`` rows (raw n-step rewards)."""
        beta = beta_schedule(state.updates, beta0, anneal)
        items, indices, weights = replay.sample(state.replay, key, batch_size, beta, shards)
        if not prioritised:
            weights = jnp.ones_like(weights)
        return Batch(
            obs=items.obs,
            actions=items.action,
            reward=items.reward,
            discount=items.discount,
            next_obs=items.next_obs,
            weights=weights,
            indices=indices,
        )

    def step(
        state: TrainState, batch: Batch, k_target: chex.PRNGKey
    ) -> tuple[TrainState, dict[str, chex.Array]]:
        """Everything after the sample: L5 → targets → losses → optax → priorities → target
        network → statistics. With the batch split over devices (``shards``) the gradients
        and every batch statistic are global, so each device applies the same update."""
        dyn = state.dynamics
        v_min, delta_z = dynamics.grid(dyn)
        if rank_rewards:
            batch = rank_normalised(batch, dyn.reward_std_ema, shards)
        next_probs, next_q, q_target_s = target_outputs(
            model,
            state.target_params,
            batch,
            v_min,
            delta_z,
            two_passes=loss.needs_target_q_s,
            fused=fused,
        )
        target = targets.target_distribution(
            k_target,
            next_probs,
            next_q,
            batch.reward,
            batch.discount,
            v_min,
            delta_z,
            backend=projection,
            tau_floor=tau_floor,
            sampled=sampled_target,
            shards=shards,
        )
        entropy_coef = losses.entropy_coefficient(jnp.float32(entropy_base), dyn.utilisation_ema)

        inputs = LossInputs(
            obs=batch.obs,
            actions=batch.actions,
            weights=batch.weights,
            target=target,
            q_target_s=q_target_s,
            v_min=v_min,
            delta_z=delta_z,
            entropy_coef=entropy_coef,
            liquid_mod=dyn.liquid.mod,
            xlstm_state=dyn.xlstm,
            last_stats=dyn.last_stats,
        )
        grads, parts = jax.grad(loss.loss, has_aux=True)(state.params, inputs)
        # Every loss term is a mean over this device's (equally many) rows: the mean of the
        # devices' gradients is the global batch's gradient.
        grads = shards.mean(grads)
        upd, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, upd)
        updates = state.updates + 1

        # L8: new priorities from the per-sample loss.
        replay_state = replay.set_priorities(state.replay, batch.indices, parts.per_sample)

        target_params = update_target(
            params,
            state.target_params,
            updates,
            hard=hard_target,
            period=period,
            polyak_tau=polyak_tau,
        )

        # L7, M13, M14 and the EMAs from what this batch showed.
        # (global rows: every device observes the same batch and keeps the same statistics)
        utilisation = shards.mean(parts.utilisation)
        dyn, dyn_metrics = dynamics.observe_batch(
            dyn,
            BatchObservation(
                q_mean=shards.gather(parts.q_mean),
                td=shards.gather(target.td),
                reward=shards.gather(batch.reward),
                utilisation=utilisation,
                xlstm=parts.xlstm_state,
                context=parts.context,
            ),
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
            parts, batch, target, grads, utilisation, entropy_coef, dyn_metrics, shards
        )
        return new_state, metrics

    def update(state: TrainState) -> tuple[TrainState, dict[str, chex.Array]]:
        key, k_sample, k_target = jax.random.split(state.key, 3)
        batch = sample(state, shards.fold(k_sample))
        return step(state.replace(key=key), batch, k_target)

    return Learner(update=update, sample=sample, step=step)
