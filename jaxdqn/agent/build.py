"""The agent builder: ``build_agent(cfg, market) -> Agent``, the one place the pieces meet.

Each factory closes over its own config section (``make_replay(cfg.replay, ...)``,
``make_loss(cfg.loss, ...)``, ``make_dynamics(cfg.dynamics, ...)``), so the jitted functions
take arrays and states only. :class:`Agent` is static (hashable by identity) and is closed over
by the jitted iteration and initialiser.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdqn.agent import acting, dynamics, learner, losses, nstep, optim, replay
from jaxdqn.agent.state import TrainState
from jaxdqn.branches import NUM_BRANCHES
from jaxdqn.config import Config, ConfigError, ReplayConfig
from jaxdqn.market import env as env_lib
from jaxdqn.market.market import PanelPrepared, Prepared
from jaxdqn.model import network
from jaxdqn.shards import ONE_DEVICE, Shards

__all__ = ["SHARDED_FIELDS", "Agent", "build_agent", "make_device_config", "make_replay"]


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
      dynamics: the training-statistics functions (L7, EMAs, M13/M14 state).
      learner: one learner update (L1–L8).
      reward_scale: learning rewards = reward_scale × log equity return
        (:func:`reward_units`).
      reward_unit: the Q value of one std of the train split's log return per bar (1 with
        ``reward_scale: auto``); every threshold in reward units is multiplied by it.
      selectivity: whether M12 scales insertion priorities.
      learning_starts: replay size before the first update (over every device's shard).
      updates: ``U`` learner updates per iteration.
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
    dynamics: dynamics.Dynamics
    learner: learner.Learner
    reward_scale: float
    reward_unit: float
    selectivity: bool
    learning_starts: int
    updates: int
    shards: Shards = ONE_DEVICE


def make_replay(cfg: ReplayConfig, obs_dim: int) -> replay.Replay:
    """L8 replay of n-step transitions with observations of width ``obs_dim``."""
    item = nstep.Transition(
        obs=jax.ShapeDtypeStruct((obs_dim,), jnp.float32),
        action=jax.ShapeDtypeStruct((NUM_BRANCHES,), jnp.int32),
        reward=jax.ShapeDtypeStruct((), jnp.float32),
        discount=jax.ShapeDtypeStruct((), jnp.float32),
        next_obs=jax.ShapeDtypeStruct((obs_dim,), jnp.float32),
        selectivity=jax.ShapeDtypeStruct((), jnp.float32),
    )
    alpha = cfg.priority_alpha if cfg.prioritised else 0.0
    return replay.make_prioritised_replay(cfg.capacity, item, alpha=alpha)


def reward_units(
    reward_scale: float | str, close: np.ndarray | Sequence[np.ndarray]
) -> tuple[float, float]:
    """``(reward_scale, reward_unit)`` for ``loss.reward_scale`` and the train split's closes
    (one array, or a panel's one array per instrument).

    σ = std(ddof=1) of the log returns per bar log(close[t+1]/close[t]) of the train split (a
    panel's: every instrument's returns pooled, none across two instruments).
    ``auto``: reward_scale = 1/σ, so Q is in units of one day's return std and the reward unit
    is 1; a number c: reward_scale = c and the reward unit c·σ.

    Raises:
      ConfigError: σ is 0 or not finite (a constant price series).
    """
    closes = [close] if isinstance(close, np.ndarray) else list(close)
    r = np.concatenate([np.diff(np.log(np.asarray(c, dtype=np.float64))) for c in closes])
    sigma = float(np.std(r, ddof=1)) if r.size > 1 else float("nan")
    if not (np.isfinite(sigma) and sigma > 0):
        raise ConfigError(
            "loss.reward_scale: the train split's log returns have no variance "
            f"(std {sigma}); auto cannot scale them"
        )
    if reward_scale == "auto":
        return 1.0 / sigma, 1.0
    return float(reward_scale), float(reward_scale) * sigma


def fused_kernels(setting: str) -> bool:
    """``kernels.fused`` resolved: ``fused`` / ``reference``, or ``auto`` = fused unless JAX
    runs on the CPU (``jax.default_backend()``)."""
    if setting == "auto":
        return jax.default_backend() != "cpu"
    return setting == "fused"


def make_device_config(cfg: Config, count: int) -> Config:
    """``cfg`` with one device's share of an agent split over ``count`` devices: E/D
    environments, C/D replay slots, B/D rows per update (``learning_starts`` stays global).

    Raises:
      ConfigError: a size that ``count`` does not divide.
    """
    if count == 1:
        return cfg
    sizes = {
        "acting.num_envs": cfg.acting.num_envs,
        "replay.batch_size": cfg.replay.batch_size,
        "replay.capacity": cfg.replay.capacity,
    }
    bad = [f"{k}={v}" for k, v in sizes.items() if v % count]
    if bad:
        raise ConfigError(
            f"train.mesh: one agent over {count} devices needs sizes divisible by {count}; "
            f"got {', '.join(bad)}"
        )
    acting_cfg = dataclasses.replace(cfg.acting, num_envs=cfg.acting.num_envs // count)
    replay_cfg = dataclasses.replace(
        cfg.replay,
        batch_size=cfg.replay.batch_size // count,
        capacity=cfg.replay.capacity // count,
        # (what one shard holds when the global threshold is reached; the agent compares the
        # global size with the global threshold)
        learning_starts=-(-cfg.replay.learning_starts // count),
    )
    return dataclasses.replace(cfg, acting=acting_cfg, replay=replay_cfg)


def projection_backend(setting: str, deterministic: bool) -> str:
    """``kernels.projection`` resolved: ``auto`` = ``pallas`` (the Triton pull kernel: one
    writer per output; the jnp ``dense`` pull where it cannot be built) on accelerators under
    ``train.deterministic``, else ``reference`` (the scatter-add, the fastest at the learner's
    16,384 rows on the H200: 22 vs 44 µs, dense 85 µs; on the CPU it runs in a fixed order,
    so it is deterministic there).

    Raises:
      ConfigError: ``reference`` asked for with ``train.deterministic`` on an accelerator.
    """
    accelerator = jax.default_backend() != "cpu"
    if setting == "auto":
        return "pallas" if deterministic and accelerator else "reference"
    if setting == "reference" and deterministic and accelerator:
        raise ConfigError(
            "kernels.projection=reference: its scatter-adds land in a varying order on "
            f"{jax.default_backend()} devices; with train.deterministic use auto, dense or pallas"
        )
    return setting


def build_agent(
    cfg: Config, market: Prepared | PanelPrepared, shards: Shards = ONE_DEVICE
) -> Agent:
    """Every static piece of the agent for ``cfg`` on ``market`` (acting on its train split);
    with ``shards`` over ``D`` devices, one device's pieces (:func:`make_device_config`)."""
    learning_starts = cfg.replay.learning_starts
    cfg = make_device_config(cfg, shards.count)
    lo, hi = market.bar_range("train")
    scale, unit = reward_units(cfg.loss.reward_scale, market.train_closes())
    tau_floor = cfg.acting.tau_floor * unit
    obs_dim = env_lib.obs_dim(market.env_params, market.num_features)
    fused = fused_kernels(cfg.kernels.fused)
    model = network.make_model(
        cfg.model,
        obs_dim,
        kan_backend=cfg.kernels.kan,
        fused=fused,
        shards=shards,
        matmul=cfg.kernels.matmul,
    )
    buffer = make_replay(cfg.replay, obs_dim)
    oc = cfg.optim
    optimizer = optim.make_optimizer(
        network.param_labels,
        lr=oc.lr,
        clip_norm=oc.clip_norm,
        aux_lr=oc.aux_lr,
        xlstm_lr=oc.xlstm_lr,
        flat=oc.flat,
    )
    dyn = dynamics.make_dynamics(
        cfg.dynamics,
        num_atoms=cfg.model.num_atoms,
        gamma_n=cfg.loss.gamma**cfg.loss.n_step,
        reward_unit=unit,
        gap_cap=cfg.loss.spread_max_gap * unit,
    )
    projection = projection_backend(cfg.kernels.projection, cfg.train.deterministic)
    update = learner.make_learner(
        cfg.loss,
        cfg.replay,
        dataclasses.replace(cfg.kernels, projection=projection),
        model=model,
        loss=losses.make_loss(cfg.loss, cfg.model, model, reward_unit=unit, shards=shards),
        replay=buffer,
        optimizer=optimizer,
        dynamics=dyn,
        tau_floor=tau_floor,
        fused=fused,
        shards=shards,
    )
    return Agent(
        model=model,
        env_params=market.env_params,
        lo=int(lo),
        hi=int(hi),
        obs_dim=obs_dim,
        acting=acting.make_acting(cfg.acting, model, eval_policy=cfg.eval.policy, reward_unit=unit),
        replay=buffer,
        nstep=nstep.make_nstep_accumulator(cfg.loss.n_step, cfg.loss.gamma),
        optimizer=optimizer,
        dynamics=dyn,
        learner=update,
        reward_scale=scale,
        reward_unit=unit,
        selectivity=cfg.model.selectivity,
        learning_starts=learning_starts,
        updates=cfg.optim.updates,
        shards=shards,
    )


SHARDED_FIELDS = ("replay", "nstep", "env", "obs")
"""The :class:`TrainState` fields one device of a data-parallel agent holds its own share of
(leading device axis ``[D, ...]``); every other field is the same on every device."""


def init_train_state(agent: Agent, market: env_lib.MarketData, key: chex.PRNGKey) -> TrainState:
    """A fresh train state for ``agent``; every random choice is split from ``key``.

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
        opt_state=agent.optimizer.init(params),
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
    fn = lambda market, key: init_train_state(agent, market, key)
    if num_seeds is not None:
        fn = jax.vmap(fn, in_axes=(None, 0))
    return jax.jit(fn)
