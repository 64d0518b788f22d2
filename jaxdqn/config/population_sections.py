"""The ``population`` section: hyperparameter populations (issue 32).

``population.SECTION.KEY: [v1, v2, ...]`` lists the values of one hyperparameter; the members
of the population are the grid of every listed key (the first listed key varies slowest), and
each member trains ``train.num_seeds`` seeds, all in the one vmapped program that trains seeds
(``python -m jaxdqn.train population.optim.lr=[1e-4,3e-4] population.loss.gamma=[0.9,0.95]``:
4 members). Only values that change no array shape can vary inside one program; they are listed
here, and any other key under ``population`` is refused with the list. An empty list (the
default) leaves the key at its value in the rest of the config; no list at all is an ordinary
run, bit-identical to one without this section.
"""

from __future__ import annotations

from dataclasses import dataclass

from jaxdqn.config.fields import _f, _sub

__all__ = [
    "LOG_UNIFORM",
    "POPULATION_KEYS",
    "PopulationConfig",
    "PopulationLoss",
    "PopulationOptim",
    "PopulationReplay",
]

_VALUES = "values, one member each (empty: the key's own value for every member)"


@dataclass(frozen=True)
class PopulationOptim:
    lr: tuple[float, ...] = _f((), f"optim.lr (O1/O2 base learning rate): {_VALUES}")


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
class PopulationConfig:
    optim: PopulationOptim = _sub(PopulationOptim, "members' optim values")
    loss: PopulationLoss = _sub(PopulationLoss, "members' loss values")
    replay: PopulationReplay = _sub(PopulationReplay, "members' replay values")
    random: int = _f(
        0,
        "members drawn at random instead of the grid: every listed key then gives its range "
        "[low, high] (the scales optim.lr, loss.polyak_tau, loss.entropy_base and "
        "loss.spread_weight log-uniform, the others uniform); 0: the grid of the listed values",
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
)
"""The keys a population may vary, in grid order (the first varies slowest)."""

LOG_UNIFORM: frozenset[str] = frozenset(
    {"optim.lr", "loss.polyak_tau", "loss.entropy_base", "loss.spread_weight"}
)
"""The keys a random population draws log-uniformly (scales); the others uniformly."""
