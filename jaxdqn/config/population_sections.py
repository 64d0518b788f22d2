"""The ``population`` section: hyperparameter populations (issue 32).

``population.SECTION.KEY: [v1, v2, ...]`` lists the values of one hyperparameter; the members
of the population are the grid of every listed key (the first listed key varies slowest), and
each member trains ``train.num_seeds`` seeds, all in the one vmapped program that trains seeds
(``python -m jaxdqn.train population.optim.lr=[1e-4,3e-4] population.loss.gamma=[0.9,0.95]``:
4 members). Only values that change no array shape can vary inside one program; they are listed
here (the learner's and store step's values on device, the host schedule's A1, A2, O2 and
O3 values per agent), and any other key under ``population`` is refused with the list. An
empty list (the default) leaves the key at its value in the rest of the config; no list at all
is an ordinary run, bit-identical to one without this section.
"""

from __future__ import annotations

from dataclasses import dataclass

from jaxdqn.config.fields import _f, _sub

__all__ = [
    "LOG_UNIFORM",
    "POPULATION_KEYS",
    "PopulationActing",
    "PopulationConfig",
    "PopulationDynamics",
    "PopulationLoss",
    "PopulationOptim",
    "PopulationReplay",
]

_VALUES = "values, one member each (empty: the key's own value for every member)"


@dataclass(frozen=True)
class PopulationOptim:
    lr: tuple[float, ...] = _f((), f"optim.lr (O1/O2 base learning rate): {_VALUES}")
    sgdr_floor: tuple[float, ...] = _f((), f"optim.sgdr_floor (O2 cycle's floor): {_VALUES}")
    restart_moment_scale: tuple[float, ...] = _f(
        (), f"optim.restart_moment_scale (O3 Adam moment factor at a restart): {_VALUES}"
    )


@dataclass(frozen=True)
class PopulationActing:
    kappa_start: tuple[float, ...] = _f((), f"acting.kappa_start (A1 κ at epoch 0): {_VALUES}")
    kappa_end: tuple[float, ...] = _f((), f"acting.kappa_end (A1 final κ): {_VALUES}")
    iqn_readiness: tuple[float, ...] = _f(
        (), f"acting.iqn_readiness (A2 initial readiness; acting.iqn_blend on): {_VALUES}"
    )
    iqn_readiness_end: tuple[float, ...] = _f(
        (), f"acting.iqn_readiness_end (A2 final readiness; acting.iqn_blend on): {_VALUES}"
    )


@dataclass(frozen=True)
class PopulationLoss:
    gamma: tuple[float, ...] = _f((), f"loss.gamma (discount γ of the n-step returns): {_VALUES}")
    polyak_tau: tuple[float, ...] = _f((), f"loss.polyak_tau (L2 Polyak rate): {_VALUES}")
    entropy_base: tuple[float, ...] = _f((), f"loss.entropy_base (L4 base): {_VALUES}")
    spread_weight: tuple[float, ...] = _f(
        (), f"loss.spread_weight (L3 weight; loss.spread on): {_VALUES}"
    )


@dataclass(frozen=True)
class PopulationReplay:
    priority_beta0: tuple[float, ...] = _f((), f"replay.priority_beta0 (L8 IS β₀): {_VALUES}")
    priority_alpha: tuple[float, ...] = _f(
        (), f"replay.priority_alpha (L8 priority exponent α; replay.prioritised on): {_VALUES}"
    )


@dataclass(frozen=True)
class PopulationDynamics:
    stats_alpha: tuple[float, ...] = _f(
        (), f"dynamics.stats_alpha (EMA rate of the reward std and Q statistics): {_VALUES}"
    )
    eval_q_std_alpha: tuple[float, ...] = _f(
        (), f"dynamics.eval_q_std_alpha (M14 host EMA rate; dynamics.liquid on): {_VALUES}"
    )
    support_sigmas: tuple[float, ...] = _f(
        (), f"dynamics.support_sigmas (L7 half-width in return stds; adaptive): {_VALUES}"
    )
    support_alpha: tuple[float, ...] = _f(
        (), f"dynamics.support_alpha (L7 base EMA rate; adaptive): {_VALUES}"
    )
    support_max_alpha: tuple[float, ...] = _f(
        (), f"dynamics.support_max_alpha (L7 rate for abnormal shifts; adaptive): {_VALUES}"
    )


@dataclass(frozen=True)
class PopulationConfig:
    optim: PopulationOptim = _sub(PopulationOptim, "members' optim values")
    loss: PopulationLoss = _sub(PopulationLoss, "members' loss values")
    replay: PopulationReplay = _sub(PopulationReplay, "members' replay values")
    acting: PopulationActing = _sub(PopulationActing, "members' acting schedules (A1, A2)")
    dynamics: PopulationDynamics = _sub(PopulationDynamics, "members' dynamics rates (L7, EMAs)")
    random: int = _f(
        0,
        "members drawn at random instead of the grid: every listed key then gives its range "
        "[low, high] (the scales optim.lr, loss.polyak_tau, loss.entropy_base, "
        "loss.spread_weight, dynamics.stats_alpha and dynamics.support_alpha log-uniform, the "
        "others uniform); 0: the grid of the listed values",
        lo=0,
    )
    seed: int = _f(0, "seed of the random members' draw (population.random)")


POPULATION_KEYS: tuple[str, ...] = (
    "optim.lr",
    "loss.gamma",
    "loss.polyak_tau",
    "loss.entropy_base",
    "replay.priority_beta0",
    "replay.priority_alpha",
    "loss.spread_weight",
    "optim.sgdr_floor",
    "optim.restart_moment_scale",
    "acting.kappa_start",
    "acting.kappa_end",
    "acting.iqn_readiness",
    "acting.iqn_readiness_end",
    "dynamics.stats_alpha",
    "dynamics.eval_q_std_alpha",
    "dynamics.support_sigmas",
    "dynamics.support_alpha",
    "dynamics.support_max_alpha",
)
"""The keys a population may vary, in grid order (the first varies slowest)."""

LOG_UNIFORM: frozenset[str] = frozenset(
    {
        "optim.lr",
        "loss.polyak_tau",
        "loss.entropy_base",
        "loss.spread_weight",
        "dynamics.stats_alpha",
        "dynamics.support_alpha",
    }
)
"""The keys a random population draws log-uniformly (scales); the others uniformly."""
