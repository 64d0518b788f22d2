"""The train state and the static setup of one run.

:class:`TrainState` holds *everything* that changes during training, on device, as one pytree:
online and target parameters, optimiser state, replay, the n-step carry, the vectorised
environments and their observations, the adaptive support (L7), the training-dynamics state
(EMAs, M13 xLSTM, M14 liquid), host-set scalars (float32 arrays, so changing them never
recompiles), the PRNG key and counters. It is vmappable over a leading seed axis:
``jax.vmap(init_train_state, in_axes=(None, None, 0))(setup, market, keys)``.

:class:`Setup` is static: the config and the factories of pure functions built from it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import chex
import jax
import jax.numpy as jnp
import optax
from flax import struct

from jaxdqn.agent import nstep, optim, replay
from jaxdqn.agent.liquid import Liquid, LiquidState, make_liquid
from jaxdqn.agent.support import SupportState, init_support
from jaxdqn.config import Config
from jaxdqn.market import env as env_lib
from jaxdqn.model import network
from jaxdqn.model.xlstm import XLSTMState

NUM_BRANCHES = 4


@dataclasses.dataclass(frozen=True)
class Setup:
    """Static pieces of a run (hashable by identity; closed over by the jitted iteration).

    Attributes:
      cfg: the resolved config.
      env_params: static environment parameters.
      lo, hi: the train split's decision bar range for the acting environments.
      model: network factory (:func:`jaxdqn.model.network.make_model`).
      liquid: M14 functions.
      optimizer: the O1 optax transformation.
      replay: prioritised replay functions (L8).
      nstep: n-step accumulator (L1 n-step returns).
      obs_dim: observation width.
    """

    cfg: Config
    env_params: env_lib.EnvParams
    lo: int
    hi: int
    model: network.Model
    liquid: Liquid
    optimizer: optax.GradientTransformation
    replay: replay.Replay
    nstep: nstep.NStepAccumulator
    obs_dim: int


def make_setup(cfg: Config, env_params: env_lib.EnvParams, num_features: int, lo: int, hi: int):
    """Build the static :class:`Setup` for ``cfg`` on a market with ``num_features`` features."""
    lc = cfg.learner
    obs_dim = env_lib.obs_dim(env_params, num_features)
    model = network.make_model(cfg.model, obs_dim)
    item = nstep.Transition(
        obs=jax.ShapeDtypeStruct((obs_dim,), jnp.float32),
        # The selectivity (M12) at o_t rides with the action through the n-step carry, so the
        # insertion priority of each transition uses the prediction made for its own o_t.
        action={
            "a": jax.ShapeDtypeStruct((NUM_BRANCHES,), jnp.int32),
            "sel": jax.ShapeDtypeStruct((), jnp.float32),
        },
        reward=jax.ShapeDtypeStruct((), jnp.float32),
        discount=jax.ShapeDtypeStruct((), jnp.float32),
        next_obs=jax.ShapeDtypeStruct((obs_dim,), jnp.float32),
    )
    buffer = replay.make_prioritised_replay(
        lc.replay_capacity, item, alpha=lc.priority_alpha if lc.prioritised else 0.0
    )
    optimizer = optim.make_optimizer(
        network.param_labels,
        lr=lc.lr,
        clip_norm=lc.clip_norm,
        aux_lr=lc.aux_lr,
        xlstm_lr=lc.xlstm_lr,
    )
    return Setup(
        cfg=cfg,
        env_params=env_params,
        lo=int(lo),
        hi=int(hi),
        model=model,
        liquid=make_liquid(cfg.model),
        optimizer=optimizer,
        replay=buffer,
        nstep=nstep.make_nstep_accumulator(lc.n_step, lc.gamma),
        obs_dim=obs_dim,
    )


@struct.dataclass
class Dynamics:
    """Training-dynamics statistics, all on device (float32 unless noted).

    Attributes:
      reward_std_ema: EMA of the std of acting rewards (L5 scale; 0 until observed).
      utilisation_ema: EMA of the atom utilisation (L4 ramp), starts at 1.
      q_mean, q_gap, q_std: ``[4]`` per-branch EMAs of the batch Q statistics.
      last_stats: ``[4, 3]`` the previous batch's (mean Q, Q-gap, Q-std) per branch, the
        xLSTM's input (M13 predicts the next batch's mean Q from it).
      xlstm: M13 recurrent state.
      liquid: M14 state; ``liquid.mod`` multiplies the spread term (L3).
      eval_q_std_ema: host-set after each validation walk (M14 amplifier target).
      iqn_readiness: host-set A2 blend weight.
    """

    reward_std_ema: chex.Array
    utilisation_ema: chex.Array
    q_mean: chex.Array
    q_gap: chex.Array
    q_std: chex.Array
    last_stats: chex.Array
    xlstm: XLSTMState
    liquid: LiquidState
    eval_q_std_ema: chex.Array
    iqn_readiness: chex.Array


@struct.dataclass
class TrainState:
    """Everything that changes during training (one seed; vmap adds a leading axis)."""

    params: Any
    target_params: Any
    opt_state: Any
    replay: replay.ReplayState
    nstep: nstep.NStepState
    env: env_lib.EnvState  # leaves [E, ...]
    obs: chex.Array  # [E, obs_dim]
    support: SupportState
    dynamics: Dynamics
    key: chex.PRNGKey
    iteration: chex.Array  # int32, iterations run
    updates: chex.Array  # int32, learner updates applied


def init_train_state(setup: Setup, market: env_lib.MarketData, key: chex.PRNGKey) -> TrainState:
    """A fresh train state; every random choice is split from ``key`` (never re-created)."""
    cfg = setup.cfg
    lc = cfg.learner
    k_params, k_env, k_run = jax.random.split(key, 3)
    params = setup.model.init(k_params)
    env_keys = jax.random.split(k_env, lc.num_envs)
    reset = jax.vmap(env_lib.reset, in_axes=(None, None, None, None, 0))
    env_state, obs = reset(setup.env_params, market, setup.lo, setup.hi, env_keys)
    actions = {
        "a": jnp.zeros((lc.num_envs, NUM_BRANCHES), jnp.int32),
        "sel": jnp.zeros((lc.num_envs,), jnp.float32),
    }
    f32 = lambda v: jnp.asarray(v, jnp.float32)
    z4 = jnp.zeros((NUM_BRANCHES,), jnp.float32)
    dynamics = Dynamics(
        reward_std_ema=f32(0.0),
        utilisation_ema=f32(1.0),
        q_mean=z4,
        q_gap=z4,
        q_std=z4,
        last_stats=jnp.zeros((NUM_BRANCHES, 3), jnp.float32),
        xlstm=setup.model.xlstm.init_state(),
        liquid=setup.liquid.init_state(),
        eval_q_std_ema=f32(0.0),
        iqn_readiness=f32(lc.iqn_readiness),
    )
    state = TrainState(
        params=params,
        target_params=jax.tree.map(jnp.copy, params),
        opt_state=setup.optimizer.init(params),
        replay=setup.replay.init(),
        nstep=setup.nstep.init(obs, actions),
        env=env_state,
        obs=obs,
        support=init_support(0.0, lc.support_half_width),
        dynamics=dynamics,
        key=k_run,
        iteration=jnp.zeros((), jnp.int32),
        updates=jnp.zeros((), jnp.int32),
    )
    # Distinct buffers for every leaf: the iteration donates the state, and a buffer shared by
    # two leaves (e.g. one learning-rate array injected into two Adam states) cannot be donated
    # twice.
    return jax.tree.map(lambda x: jnp.array(x, copy=True), state)


def set_host_scalars(state: TrainState, **values: float) -> TrainState:
    """Write host-set scalars (``iqn_readiness``, ``eval_q_std_ema``) as float32 arrays of the
    existing shape, so the jitted iteration sees the same avals and never recompiles."""
    dyn = state.dynamics
    updates = {}
    for name, v in values.items():
        old = getattr(dyn, name)
        updates[name] = jnp.broadcast_to(jnp.asarray(v, jnp.float32), old.shape)
    return state.replace(dynamics=dyn.replace(**updates))


def set_learning_rate(state: TrainState, lr: float) -> TrainState:
    """O2: write the main learning rate into the optimiser state (float32; no recompile)."""
    return state.replace(opt_state=optim.set_learning_rate(state.opt_state, lr))


def make_init(setup: Setup, *, num_seeds: int | None = None):
    """``jit(init_train_state)`` for ``setup``: ``(market, key) -> TrainState``; with
    ``num_seeds`` it takes ``keys [S, 2]`` and returns states with a leading seed axis."""
    fn = lambda market, key: init_train_state(setup, market, key)
    if num_seeds is not None:
        fn = jax.vmap(fn, in_axes=(None, 0))
    return jax.jit(fn)
