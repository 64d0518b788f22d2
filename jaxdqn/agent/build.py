"""The agent builder: ``build_agent(cfg, market) -> Agent``, the one place the pieces meet.

What each setting means on this machine and market is decided once
(:func:`jaxdqn.agent.resolve.resolve`); each factory then binds its own config section and
those decisions to its module's functions (``make_replay(cfg.replay, ...)``,
``make_loss(cfg.loss, ...)``, ``make_dynamics(cfg.dynamics, ...)``), so the jitted functions
take arrays and states only. :class:`Agent` is static (hashable by identity) and is closed over
by the jitted iteration and initialiser.
"""

from __future__ import annotations

import dataclasses
import functools

import chex
import jax
import jax.numpy as jnp
import optax

from jaxdqn.agent import acting, dynamics, learner, losses, nstep, optim, population, replay
from jaxdqn.agent.resolve import Resolved, resolve
from jaxdqn.agent.state import TrainState
from jaxdqn.branches import NUM_BRANCHES
from jaxdqn.config import Config, ReplayConfig
from jaxdqn.config.members import agent_configs, members, population_grid
from jaxdqn.market import env as env_lib
from jaxdqn.market.market import PanelPrepared, Prepared
from jaxdqn.model import network
from jaxdqn.shards import ONE_DEVICE, Shards

__all__ = [
    "SHARDED_FIELDS",
    "Agent",
    "build_agent",
    "make_agent_dynamics",
    "make_agent_model",
    "make_init",
    "make_population_values",
    "make_replay",
    "with_lr",
    "with_members",
]


@dataclasses.dataclass(frozen=True)
class Agent:
    """Static pieces of one agent, built once per run.

    Attributes:
      model: network functions (:func:`jaxdqn.model.network.make_model`).
      env_params: static environment parameters.
      lo, hi: the train split's decision bar range of the acting environments.
      obs_dim: observation width.
      acting: the acting pipeline (A1–A3) with ``E`` environments and ``K`` steps.
      replay: prioritised replay functions (L8).
      nstep: the n-step accumulator (γⁿ bootstrap).
      optimizer: the O1 optax transformation.
      lr: the main Adam's learning rate a fresh train state starts with (``optim.lr``). The
        compiled init takes it as an argument, not a constant, so runs that differ only in it
        (a sweep's trials over ``optim.lr``) share one compiled init program.
      dynamics: the training-statistics functions (L7, EMAs, M13/M14 state).
      learner: one learner update (L1–L8).
      reward_scale: learning rewards = reward_scale × log equity return
        (:func:`jaxdqn.agent.resolve.reward_units`).
      reward_unit: the Q value of one std of the train split's log return per bar (1 with
        ``reward_scale: auto``); every threshold in reward units is multiplied by it.
      selectivity: whether M12 scales insertion priorities.
      learning_starts: replay size before the first update (over every device's shard).
      updates: ``U`` learner updates per iteration.
      unroll: the learner scan's unroll (``optim.unroll``): updates per loop body.
      pipeline: the pipelined learner (``optim.pipeline``,
        :func:`jaxdqn.agent.pipeline.pipelined_updates`).
      members: a population's ``[P]`` member values (:mod:`jaxdqn.agent.population`; None: an
        ordinary run), written into the fresh train states by :func:`make_init`.
      shards: the devices one agent is split over (``Shards()``: one device). Split over
        ``D`` devices the pieces are those of one device: ``acting.num_envs`` = E/D
        environments, a replay of C/D slots, ``B/D`` rows per update
        (:func:`build_agent`); the batch-global reductions go through ``shards``.
    """

    model: network.Model
    env_params: env_lib.EnvParams
    lo: int
    hi: int
    obs_dim: int
    acting: acting.Acting
    replay: replay.Replay
    nstep: nstep.NStepAccumulator
    optimizer: optax.GradientTransformation
    lr: float
    dynamics: dynamics.Dynamics
    learner: learner.Learner
    reward_scale: float
    reward_unit: float
    selectivity: bool
    learning_starts: int
    updates: int
    unroll: int = 1
    pipeline: bool = False
    shards: Shards = ONE_DEVICE
    members: population.MemberValues | None = None


def make_replay(cfg: ReplayConfig, obs_dim: int, *, alpha: float) -> replay.Replay:
    """L8 replay of n-step transitions with observations of width ``obs_dim`` and priority
    exponent ``alpha`` (:func:`jaxdqn.agent.resolve.replay_weighting`)."""
    item = nstep.Transition(
        obs=jax.ShapeDtypeStruct((obs_dim,), jnp.float32),
        action=jax.ShapeDtypeStruct((NUM_BRANCHES,), jnp.int32),
        reward=jax.ShapeDtypeStruct((), jnp.float32),
        discount=jax.ShapeDtypeStruct((), jnp.float32),
        next_obs=jax.ShapeDtypeStruct((obs_dim,), jnp.float32),
        selectivity=jax.ShapeDtypeStruct((), jnp.float32),
    )
    return replay.make_prioritised_replay(cfg.capacity, item, alpha=alpha)


def build_agent(
    cfg: Config, market: Prepared | PanelPrepared, shards: Shards = ONE_DEVICE
) -> Agent:
    """Every static piece of the agent for ``cfg`` on ``market`` (its train split; over ``D``
    devices one device's pieces), each setting's meaning decided by :func:`.resolve.resolve`."""
    r = resolve(cfg, market, shards)
    cfg, unit = r.cfg, r.reward_unit
    obs_dim = env_lib.obs_dim(market.env_params, market.num_features)
    model = make_agent_model(r, obs_dim, shards)
    oc = cfg.optim
    pieces = learner.Pieces(
        model=model,
        loss=losses.make_loss(
            cfg.loss, cfg.model, model, max_gap=r.spread_max_gap, shards=shards, head=r.loss_head
        ),
        replay=make_replay(cfg.replay, obs_dim, alpha=r.replay_alpha),
        optimizer=optim.make_optimizer(
            network.param_labels,
            lr=oc.lr,
            clip_norm=oc.clip_norm,
            aux_lr=oc.aux_lr,
            xlstm_lr=oc.xlstm_lr,
            flat=oc.flat,
        ),
        dynamics=make_agent_dynamics(r),
    )
    train_range = market.bar_range("train")
    return Agent(
        members=make_population_values(cfg),
        model=model,
        env_params=market.env_params,
        lo=int(train_range[0]),
        hi=int(train_range[1]),
        obs_dim=obs_dim,
        acting=acting.make_acting(cfg.acting, model, eval_policy=cfg.eval.policy, reward_unit=unit),
        replay=pieces.replay,
        nstep=nstep.make_nstep_accumulator(cfg.loss.n_step, cfg.loss.gamma),
        optimizer=pieces.optimizer,
        lr=cfg.optim.lr,
        dynamics=pieces.dynamics,
        learner=learner.make_learner(
            cfg.loss, cfg.replay, pieces=pieces, resolved=r, shards=shards
        ),
        reward_scale=r.reward_scale,
        reward_unit=unit,
        selectivity=cfg.model.selectivity,
        learning_starts=r.learning_starts,
        updates=cfg.optim.updates,
        unroll=cfg.optim.unroll,
        pipeline=cfg.optim.pipeline,
        shards=shards,
    )


def make_agent_model(r: Resolved, obs_dim: int, shards: Shards = ONE_DEVICE) -> network.Model:
    """The model of the resolved config ``r`` for observations of width ``obs_dim``: its
    section and every kernel setting as :func:`.resolve.resolve` decided it."""
    cfg = r.cfg
    return network.make_model(
        cfg.model,
        obs_dim,
        kan_backend=cfg.kernels.kan,
        fused=r.fused,
        heads=r.heads,
        statistics=r.statistics,
        gated=r.gated,
        acting=r.acting,
        shards=shards,
        matmul=cfg.kernels.matmul,
        bias_grad=cfg.kernels.bias_grad,
        acting_product=r.acting_product,
        acting_activations=r.acting_activations,
        learner_activations=r.learner_activations,
        raw_heads=losses.raw_head_width(r.loss_head, cfg.model.num_atoms),
    )


def make_agent_dynamics(r: Resolved) -> dynamics.Dynamics:
    """The training-statistics functions of the resolved config ``r`` (its reward unit, γⁿ and
    L3 bound); a population's host EMA of the validation Q spread (M14) runs at each agent's
    own ``dynamics.eval_q_std_alpha``."""
    cfg = r.cfg
    dyn = dynamics.make_dynamics(
        cfg.dynamics,
        num_atoms=cfg.model.num_atoms,
        gamma_n=r.gamma_n,
        reward_unit=r.reward_unit,
        gap_cap=r.spread_max_gap,
    )
    agent_cfgs = agent_configs(cfg)
    if agent_cfgs is None:
        return dyn
    rates = tuple(c.dynamics.eval_q_std_alpha for c in agent_cfgs)
    each = functools.partial(dynamics.next_eval_q_std, alpha=rates)
    return dataclasses.replace(dyn, next_eval_q_std=each)


def make_population_values(cfg: Config) -> population.MemberValues | None:
    """The ``[M · S]`` member values of ``cfg``'s population; None without one."""
    if not population_grid(cfg.population):
        return None
    member_cfgs = [m.cfg for m in members(cfg)]
    return population.make_member_values(member_cfgs, cfg.train.num_seeds)


SHARDED_FIELDS = ("replay", "nstep", "env", "obs")
"""The :class:`TrainState` fields one device of a data-parallel agent holds its own share of
(leading device axis ``[D, ...]``); every other field is the same on every device."""


def init_train_state(
    agent: Agent, market: env_lib.MarketData, key: chex.PRNGKey, lr: chex.Numeric
) -> TrainState:
    """A fresh train state for ``agent``; every random choice is split from ``key``. ``lr``
    (a float32 scalar, ``agent.lr`` through :func:`make_init`) is the main Adam's learning rate
    in its optax state.

    Split over ``D`` devices (``agent.shards``) the :data:`SHARDED_FIELDS` get a leading device
    axis: device ``d`` holds environments ``d·E/D … (d+1)·E/D − 1`` of the one-device state
    (the same reset keys) and an empty replay shard.
    """
    num_envs, count = agent.acting.num_envs, agent.shards.count
    k_params, k_env, k_run = jax.random.split(key, 3)
    params = agent.model.init(k_params)
    env_keys = jax.random.split(k_env, num_envs * count)
    reset = jax.vmap(env_lib.reset, in_axes=(None, None, None, None, 0))
    init_nstep = lambda o: agent.nstep.init(o, jnp.zeros((num_envs, NUM_BRANCHES), jnp.int32))
    if count == 1:
        env_state, obs = reset(agent.env_params, market, agent.lo, agent.hi, env_keys)
        replay_state, nstep_state = agent.replay.init(), init_nstep(obs)
    else:
        env_keys = env_keys.reshape(count, num_envs, *env_keys.shape[1:])
        env_state, obs = jax.vmap(reset, in_axes=(None, None, None, None, 0))(
            agent.env_params, market, agent.lo, agent.hi, env_keys
        )
        stack = lambda x: jnp.broadcast_to(x, (count, *x.shape))
        replay_state = jax.tree.map(stack, agent.replay.init())
        nstep_state = jax.vmap(init_nstep)(obs)
    state = TrainState(
        params=params,
        target_params=jax.tree.map(jnp.copy, params),
        opt_state=optim.set_learning_rate(agent.optimizer.init(params), lr),
        replay=replay_state,
        nstep=nstep_state,
        env=env_state,
        obs=obs,
        dynamics=agent.dynamics.init(
            agent.model.xlstm.init_state(), agent.acting.iqn_readiness, agent.acting.kappa_start
        ),
        key=k_run,
        iteration=jnp.zeros((), jnp.int32),
        updates=jnp.zeros((), jnp.int32),
    )
    # Distinct buffers for every leaf: the iteration donates the state, and a buffer shared by
    # two leaves (e.g. one learning-rate array injected into two Adam states) cannot be donated
    # twice.
    return jax.tree.map(lambda x: jnp.array(x, copy=True), state)


def make_init(agent: Agent, *, num_seeds: int | None = None):
    """``jit(init_train_state)`` for ``agent``: ``(market, key) -> TrainState``; with
    ``num_seeds`` it takes ``keys [S, 2]`` and returns states with a leading seed axis."""
    fn = lambda lr, market, key: init_train_state(agent, market, key, lr)
    if num_seeds is not None:
        fn = jax.vmap(fn, in_axes=(None, None, 0))
    return with_lr(agent, jax.jit(with_members(agent, fn, num_seeds)))


def with_lr(agent: Agent, init) -> functools.partial:
    """``(market, key) -> init(agent.lr as a float32 array, market, key)``: the learning rate an
    argument of the compiled ``init`` (``.func``), not a constant folded into it."""
    return functools.partial(init, jnp.asarray(agent.lr, jnp.float32))


def with_members(agent: Agent, init, num_seeds: int | None):
    """``init`` whose states carry ``agent.members`` (a population: every agent its member's
    values); ``init`` itself without a population.

    Raises:
      ValueError: ``num_seeds`` agents for a population of another size.
    """
    if agent.members is None:
        return init
    size = agent.members.lr.shape[0]
    if num_seeds != size:
        raise ValueError(f"make_init: {num_seeds} agents for a population of {size}")
    return lambda *args: init(*args).replace(members=agent.members)
