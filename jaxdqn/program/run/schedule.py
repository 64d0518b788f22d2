"""What the host sets before each epoch: O2 learning rate, O3 restart, A2 readiness, A1 κ.

:func:`schedule` is pure arithmetic on the run's position; :func:`apply_schedule` writes its
result into a seed-stacked train state without changing any abstract value (shape, dtype, weak
type), so the jitted iteration is compiled once for the whole run.

With ``c = epoch − cycle_start`` the epoch's position in the current SGDR cycle (a rewind starts
a new cycle), ``T = optim.sgdr_period``, ``f = optim.sgdr_floor``, ``r₀ = acting.iqn_readiness``,
``r₁ = acting.iqn_readiness_end`` and ``N = acting.iqn_readiness_epochs``:

* O2 ``lr = optim.lr · (f + (1 − f) · ½(1 + cos(π · (c mod T) / T)))``;
* O3 ``restart = c > 0 ∧ c mod T = 0 ∧ iteration_in_epoch = 0``: Adam's ``μ, ν`` are scaled by
  ``optim.restart_moment_scale`` once, before the epoch's first iteration (never again when an
  interrupted epoch is resumed part-way);
* A2 ``readiness = r₀ + (r₁ − r₀) · min(1, epoch / N)`` (by the run's epoch, not the
  cycle's). The seed ramped to r₁ = 1, acting on Q10 alone: Q10 of any position is about
  −1.3 σ_G·|position| below its mean, far more than a daily edge, so the behaviour policy went
  flat (training |position| 0.28 → 0.06 over 20 epochs, measured) and validation decayed with
  it; r₁ = 0.5 acts on the Q10/Q90 midpoint, which keeps E[Q]'s ordering for a symmetric
  distribution;
* A1 ``κ = κ_end + (κ_start − κ_end) · max(0, 1 − epoch / N_κ)`` (``acting.kappa_start``,
  ``kappa_end``, ``kappa_epochs``; by the run's epoch): exploration sharpens from the seed's
  κ = 1 (best action e ≈ 2.7× the worst) toward greedier sampling as Q becomes trustworthy.

A population (issue 32) gives every agent its member's config: each agent's learning rate,
readiness, κ and O3 factor are those of its own config, computed exactly as a run with that
config computes them (the epoch counts ``T``, ``N`` and ``N_κ`` are not member values, so the
restart falls on the same epochs for all).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import numpy as np

from jaxdqn.agent import optim
from jaxdqn.agent.dynamics import Dynamics
from jaxdqn.agent.state import TrainState
from jaxdqn.config import ActingConfig, Config, OptimConfig

__all__ = ["EpochSchedule", "apply_schedule", "schedule"]


@dataclasses.dataclass(frozen=True)
class EpochSchedule:
    """The host-set inputs of one epoch (see the module docstring).

    Attributes:
      lr: O2 learning rate of the trunk and branches (Python float; logged as ``lr``), or
        a population's one per agent (``[P]`` floats, each member's own base scaled alike).
      restart: O3, scale the Adam moments before this epoch's first iteration.
      readiness: A2 IQN readiness in ``[0, 1]`` (a population: ``[P]``).
      kappa: A1 temperature factor κ (a population: ``[P]``).
      moment_scale: O3 factor of the Adam moments at a restart (a population: ``[P]``).
    """

    lr: float | tuple[float, ...]
    restart: bool
    readiness: float | tuple[float, ...]
    kappa: float | tuple[float, ...]
    moment_scale: float | tuple[float, ...]


def schedule(
    epoch: int,
    cycle_start: int,
    iteration_in_epoch: int,
    optim_cfg: OptimConfig,
    acting_cfg: ActingConfig,
    agents: Sequence[Config] | None = None,
) -> EpochSchedule:
    """The schedule of ``epoch`` (0-based) whose SGDR cycle began at epoch ``cycle_start``;
    ``iteration_in_epoch`` > 0 when an interrupted epoch is resumed (no second O3 restart).
    ``agents``: a population's config per agent (``[P]``,
    :func:`jaxdqn.config.members.agent_configs`): every value but ``restart`` per agent, from
    its own ``optim`` and ``acting`` sections; None: ``optim_cfg`` and ``acting_cfg``."""
    if agents is not None:
        each = [schedule(epoch, cycle_start, iteration_in_epoch, a.optim, a.acting) for a in agents]
        if len({e.restart for e in each}) > 1:
            raise ValueError("schedule: the agents' SGDR periods differ")
        column = lambda name: tuple(getattr(e, name) for e in each)
        return EpochSchedule(
            lr=column("lr"),
            restart=each[0].restart,
            readiness=column("readiness"),
            kappa=column("kappa"),
            moment_scale=column("moment_scale"),
        )
    cycle_epoch = epoch - cycle_start
    period, floor = optim_cfg.sgdr_period, optim_cfg.sgdr_floor
    lr = optim.sgdr_learning_rate(cycle_epoch, optim_cfg.lr, period, floor)
    restart = optim.is_restart(cycle_epoch, optim_cfg.sgdr_period) and iteration_in_epoch == 0
    r0 = acting_cfg.iqn_readiness
    r1 = acting_cfg.iqn_readiness_end
    readiness = r0 + (r1 - r0) * min(1.0, epoch / acting_cfg.iqn_readiness_epochs)
    k0, k1 = acting_cfg.kappa_start, acting_cfg.kappa_end
    kappa = k1 + (k0 - k1) * max(0.0, 1.0 - epoch / acting_cfg.kappa_epochs)
    return EpochSchedule(
        lr=lr,
        restart=restart,
        readiness=readiness,
        kappa=kappa,
        moment_scale=optim_cfg.restart_moment_scale,
    )


def apply_schedule(
    state: TrainState,
    sched: EpochSchedule,
    dynamics: Dynamics,
    eval_q_std_ema: Sequence[float] | None,
) -> TrainState:
    """Write ``sched`` into a train state with a leading seed axis ``[S, ...]``.

    Every seed gets the same learning rate (float32, written into the injected optax
    hyperparameters), readiness and κ (a population: each agent its own, ``[P]``); at a
    restart every seed's trunk and branch Adam ``μ, ν`` are multiplied by
    ``sched.moment_scale`` (a population: each agent's by its own).
    ``eval_q_std_ema`` (``[S]`` floats, or ``None`` before the first validation → 0) is M14's input
    from the host EMA of the validation Q spread. Only values change, never shapes or dtypes.
    """
    opt_state = state.opt_state
    # one O3 factor and one learning rate per agent (an ordinary run: the same for all)
    per_agent = lambda v: np.broadcast_to(np.asarray(v, np.float32), state.updates.shape)
    if sched.restart:
        opt_state = jax.vmap(optim.scale_adam_moments)(opt_state, per_agent(sched.moment_scale))
    lrs = per_agent(sched.lr)
    opt_state = jax.vmap(optim.set_learning_rate)(opt_state, lrs)
    # set_host_inputs broadcasts to the stored [S] shape as float32.
    host_inputs = dynamics.set_host_inputs(
        state.dynamics,
        iqn_readiness=sched.readiness,
        kappa=sched.kappa,
        eval_q_std_ema=0.0 if not eval_q_std_ema else list(eval_q_std_ema),
    )
    return state.replace(opt_state=opt_state, dynamics=host_inputs)
