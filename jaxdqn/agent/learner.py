"""One learner update (L1–L8, M13, M14): sample → targets → losses → optax → priorities →
target network → support → dynamics.

``update(setup, state, market_unused) -> (state, metrics)`` is pure; the iteration scans it.
Shapes: ``B`` batch, 4 branches, 3 actions, ``N`` atoms.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import optax

from jaxdqn.agent import losses, optim, targets
from jaxdqn.agent.liquid import LiquidInputs
from jaxdqn.agent.state import Setup, TrainState
from jaxdqn.agent.support import support_grid, update_support
from jaxdqn.model.xlstm import batch_statistics


class Batch(NamedTuple):
    obs: chex.Array  # [B, D]
    actions: chex.Array  # int32 [B, 4]
    reward: chex.Array  # [B] n-step return (rank-normalised when L5 is on)
    discount: chex.Array  # [B] γⁿ or 0
    next_obs: chex.Array  # [B, D]
    weights: chex.Array  # [B] importance weights
    indices: chex.Array  # int32 [B]


def beta_schedule(setup: Setup, updates: chex.Array) -> chex.Array:
    """L8: IS exponent annealed linearly from β₀ to 1 over ``beta_anneal_updates``."""
    lc = setup.cfg.learner
    frac = jnp.minimum(updates.astype(jnp.float32) / lc.beta_anneal_updates, 1.0)
    return lc.priority_beta0 + (1.0 - lc.priority_beta0) * frac


def sample_batch(setup: Setup, state: TrainState, key: chex.PRNGKey) -> Batch:
    """L8 prioritised sample (+ L5 rank normalisation of its rewards)."""
    lc = setup.cfg.learner
    items, indices, weights = setup.replay.sample(
        state.replay, key, lc.batch_size, beta_schedule(setup, state.updates)
    )
    reward = items.reward
    if lc.rank_rewards:
        reward = targets.rank_normalise(reward, state.dynamics.reward_std_ema)
    if not lc.prioritised:
        weights = jnp.ones_like(weights)
    return Batch(
        obs=items.obs,
        actions=items.action["a"],
        reward=reward,
        discount=items.discount,
        next_obs=items.next_obs,
        weights=weights,
        indices=indices,
    )


class LossParts(NamedTuple):
    total: chex.Array
    c51: chex.Array
    spread: chex.Array
    entropy: chex.Array
    denoise: chex.Array
    coord: chex.Array
    select: chex.Array
    xlstm: chex.Array
    per_sample: chex.Array  # [B] (no gradient) → priorities, selectivity labels
    q_mean: chex.Array  # [B, 4, 3]
    utilisation: chex.Array
    mean_entropy: chex.Array
    xlstm_state: Any
    context: chex.Array


def loss_fn(
    params: Any,
    setup: Setup,
    state: TrainState,
    batch: Batch,
    target: targets.Target,
    q_target_s: chex.Array,
    v_min: chex.Array,
    delta_z: chex.Array,
    entropy_coef: chex.Array,
) -> tuple[chex.Array, LossParts]:
    """Total loss = L1 + L3 + L4 + L6; each auxiliary module sees stop-gradient inputs, so
    the groups' gradients do not mix (one optax update serves all of them)."""
    lc, mc = setup.cfg.learner, setup.cfg.model
    model = setup.model
    n = mc.num_atoms
    b = batch.obs.shape[0]
    out = model.apply(params, batch.obs, v_min, delta_z)

    # L1: IS-weighted C51 cross-entropy of the taken actions, summed over branches.
    ce = jax.vmap(losses.c51_cross_entropy)(out.logits, batch.actions, target.probs)  # [B, 4]
    per_sample = ce.sum(axis=-1)
    c51 = jnp.mean(batch.weights * per_sample)

    # L3: spread surrogate, scale Δz/B × branch weight × liquid_mod.
    z = v_min + delta_z * jnp.arange(n, dtype=jnp.float32)
    spread = jnp.zeros((), jnp.float32)
    if lc.spread:
        branch_scale = (
            jnp.asarray(lc.spread_branch_scale, jnp.float32)
            * jax.lax.stop_gradient(state.dynamics.liquid.mod)
            * delta_z
            / b
        )
        spread = jnp.sum(
            jax.vmap(losses.spread_surrogate, in_axes=(0, 0, None, None))(
                out.logits, batch.actions, z, branch_scale
            )
        )

    # L4: entropy bonus with the utilisation ramp.
    mean_entropy = jnp.mean(losses.entropy(out.logits))
    ent = -entropy_coef * mean_entropy if lc.entropy else jnp.zeros((), jnp.float32)

    # L6: auxiliary training on stop-gradient inputs.
    zero = jnp.zeros((), jnp.float32)
    denoise = coord = select = xl = zero
    xlstm_state = state.dynamics.xlstm
    context = xlstm_state.context
    per_sample_sg = jax.lax.stop_gradient(per_sample)
    q_sg = jax.lax.stop_gradient(out.q_mean)
    if lc.aux_training:
        coordinated = model.coordinate(params, q_sg)
        q_coord = coordinated.q + coordinated.mean  # back on the network's scale
        if mc.denoiser:
            denoise = jnp.mean(jnp.square(q_coord - q_target_s))
        if mc.q_attention or mc.graph:
            taken = jnp.take_along_axis(q_coord, batch.actions[..., None], axis=2)[..., 0]
            coord = jnp.mean(losses.huber(taken - target.td))
        if mc.selectivity:
            label = losses.selectivity_target(per_sample_sg)
            select = jnp.mean(losses.binary_cross_entropy(out.selectivity, label))
        if mc.xlstm:
            # M13 predicts this batch's mean Q from the previous batch's statistics.
            xl, (xlstm_state, context) = model.xlstm.prediction_loss(
                params["xlstm"], state.dynamics.xlstm, state.dynamics.last_stats, q_sg.mean()
            )
    total = c51 + spread + ent + denoise + coord + select + xl
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
        utilisation=losses.atom_utilisation(jax.lax.stop_gradient(out.probs)),
        mean_entropy=jax.lax.stop_gradient(mean_entropy),
        xlstm_state=xlstm_state,
        context=context,
    )
    return total, parts


def update(setup: Setup, state: TrainState) -> tuple[TrainState, dict[str, chex.Array]]:
    """One learner update; returns the new state and scalar metrics (device arrays)."""
    cfg = setup.cfg
    lc, mc = cfg.learner, cfg.model
    model = setup.model
    dyn = state.dynamics
    key, k_sample, k_target = jax.random.split(state.key, 3)
    v_min, delta_z = support_grid(state.support, mc.num_atoms)

    batch = sample_batch(setup, state, k_sample)
    next_out = model.apply(state.target_params, batch.next_obs, v_min, delta_z)
    target = targets.target_distribution(
        k_target,
        next_out.probs,
        next_out.q_mean,
        batch.reward,
        batch.discount,
        v_min,
        delta_z,
        backend=lc.projection_backend,
    )
    if lc.aux_training and mc.denoiser:
        q_target_s = model.apply(state.target_params, batch.obs, v_min, delta_z).q_mean
    else:
        q_target_s = jnp.zeros((batch.obs.shape[0], 4, 3), jnp.float32)
    entropy_coef = losses.entropy_coefficient(jnp.float32(lc.entropy_base), dyn.utilisation_ema)

    grads, parts = jax.grad(loss_fn, has_aux=True)(
        state.params, setup, state, batch, target, q_target_s, v_min, delta_z, entropy_coef
    )
    upd, opt_state = setup.optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, upd)
    updates = state.updates + 1

    # L8: new priorities from the per-sample loss.
    replay_state = setup.replay.set_priorities(state.replay, batch.indices, parts.per_sample)

    # L2: target network, hard copy every C updates or Polyak.
    if lc.target_update == "hard":
        copy = updates % lc.target_period == 0
        target_params = jax.tree.map(
            lambda o, t: jnp.where(copy, o, t), params, state.target_params
        )
    else:
        target_params = optax.incremental_update(params, state.target_params, lc.polyak_tau)

    # L7, M13, M14 and the EMAs from this batch's statistics.
    stats = batch_statistics(parts.q_mean)  # [4, 3]: mean Q, Q-gap, Q-std per branch
    support = state.support
    if lc.adaptive_support:
        support = update_support(
            support,
            parts.q_mean.mean(),
            stats[:, 1].mean(),
            parts.q_mean.std(),
            base_alpha=lc.support_alpha,
            max_alpha=lc.support_max_alpha,
        )
    a = lc.stats_alpha
    ema = lambda old, new: old + a * (new - old)
    liquid_state, liquid_mod = setup.liquid.step(
        dyn.liquid,
        LiquidInputs(
            q_gap=stats[:, 1],
            eval_q_std_ema=dyn.eval_q_std_ema,
            context_norm=jnp.linalg.norm(parts.context),
        ),
    )
    dynamics = dyn.replace(
        utilisation_ema=ema(dyn.utilisation_ema, parts.utilisation),
        q_mean=ema(dyn.q_mean, stats[:, 0]),
        q_gap=ema(dyn.q_gap, stats[:, 1]),
        q_std=ema(dyn.q_std, stats[:, 2]),
        last_stats=stats,
        xlstm=parts.xlstm_state,
        liquid=liquid_state,
    )
    new_state = state.replace(
        params=params,
        target_params=target_params,
        opt_state=opt_state,
        replay=replay_state,
        support=support,
        dynamics=dynamics,
        key=key,
        updates=updates,
    )
    metrics = {
        "loss": parts.total,
        "loss_c51": parts.c51,
        "loss_spread": parts.spread,
        "loss_entropy": parts.entropy,
        "loss_denoise": parts.denoise,
        "loss_coord": parts.coord,
        "loss_select": parts.select,
        "loss_xlstm": parts.xlstm,
        "grad_norm": optax.tree.norm(grads),
        "q_mean": stats[:, 0],
        "q_gap": stats[:, 1],
        "q_std": stats[:, 2],
        "atom_utilisation": parts.utilisation,
        "entropy": parts.mean_entropy,
        "entropy_coef": entropy_coef,
        "support_centre": support.centre,
        "support_half_width": support.half_width,
        "liquid_mod": liquid_mod,
        "liquid_tau": liquid_state.tau,
        "liquid_rk4": liquid_state.used_rk4.astype(jnp.float32),
        "priority_mean": parts.per_sample.mean(),
        "priority_max": parts.per_sample.max(),
        "is_weight_mean": batch.weights.mean(),
        "learning_rate": optim.get_learning_rate(opt_state),
        "td_target_mean": target.td.mean(),
    }
    return new_state, metrics
