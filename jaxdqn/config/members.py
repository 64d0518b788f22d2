"""The members of a hyperparameter population (:mod:`jaxdqn.config.population_sections`).

:func:`members` expands ``cfg.population`` into its grid: one :class:`Member` per combination
of the listed values (or ``population.random`` members drawn from the listed ranges), each
with the config it trains (the values set, checked exactly as the same ``key=value``
overrides would be) and its overrides for reports. A config without a population has one
member, itself.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple

import numpy as np

from jaxdqn.config import loading
from jaxdqn.config.loading import _build, _set_nested, to_dict
from jaxdqn.config.population_sections import LOG_UNIFORM, POPULATION_KEYS, PopulationConfig
from jaxdqn.config.sections import Config, ConfigError

__all__ = [
    "NEEDS",
    "Member",
    "agent_configs",
    "load",
    "members",
    "num_members",
    "population_grid",
    "population_size",
]


_IQN = (lambda c: c.acting.iqn_blend, "acting.iqn_blend is off (A2 acts on E[Q])")
_L7 = (lambda c: c.dynamics.adaptive_support, "dynamics.adaptive_support is off (fixed support)")

NEEDS: dict[str, tuple[Callable[[Config], bool], str]] = {
    "replay.priority_alpha": (
        lambda c: c.replay.prioritised,
        "replay.prioritised is off (every α is 0: uniform sampling)",
    ),
    "loss.spread_weight": (lambda c: c.loss.spread, "loss.spread is off (L3 is not computed)"),
    "acting.iqn_readiness": _IQN,
    "acting.iqn_readiness_end": _IQN,
    "dynamics.eval_q_std_alpha": (
        lambda c: c.dynamics.liquid,
        "dynamics.liquid is off (M14, the validation Q spread's only reader)",
    ),
    "dynamics.support_sigmas": _L7,
    "dynamics.support_alpha": _L7,
    "dynamics.support_max_alpha": _L7,
}
"""Keys whose component may be switched off: ``key → (is_on(cfg), why the key is refused)``."""


class Member(NamedTuple):
    """One member: ``overrides`` (dotted key → value, in :data:`POPULATION_KEYS` order; empty
    without a population) and ``cfg``, the config it trains (population section empty)."""

    overrides: dict[str, float]
    cfg: Config


def population_grid(population: PopulationConfig) -> dict[str, tuple[float, ...]]:
    """The listed keys and their values, in :data:`POPULATION_KEYS` order."""
    grid = {}
    for key in POPULATION_KEYS:
        section, name = key.split(".")
        values = getattr(getattr(population, section), name)
        if values:
            grid[key] = tuple(values)
    return grid


def members(cfg: Config) -> tuple[Member, ...]:
    """Every member of ``cfg``'s population (the first listed key varies slowest).

    Raises:
      ConfigError: a value its key does not accept, named ``population.KEY[i]``; a key listed
        twice with the same value (two identical members).
    """
    grid = population_grid(cfg.population)
    if not grid:
        if cfg.population.random:
            raise ConfigError("population.random: list the range of at least one key to draw")
        return (Member({}, cfg),)
    for key in grid:
        if key in NEEDS and not NEEDS[key][0](cfg):
            raise ConfigError(f"population.{key}: {NEEDS[key][1]}")
    for key, values in grid.items():
        if len(set(values)) != len(values):
            raise ConfigError(f"population.{key}: a value is listed twice ({list(values)})")
    base = to_dict(dataclasses.replace(cfg, population=PopulationConfig()))
    out = []
    combos = _draws(cfg.population, grid) if cfg.population.random else itertools.product(
        *grid.values()
    )  # fmt: skip
    for combo in combos:
        overrides = dict(zip(grid, combo, strict=True))
        member_tree = copy.deepcopy(base)
        for key, value in overrides.items():
            _set_nested(member_tree, key.split("."), value)
        try:
            member_cfg = _build(Config, member_tree)
        except ConfigError as e:
            where = ", ".join(f"{k}={v}" for k, v in overrides.items())
            raise ConfigError(f"population member ({where}): {e}") from None
        out.append(Member(overrides, member_cfg))
    return tuple(out)


def _draws(population: PopulationConfig, ranges: dict[str, tuple[float, ...]]) -> list[tuple]:
    """``population.random`` members' values: per member and key (in ``ranges`` order) one draw
    from ``[low, high]``, log-uniform for :data:`LOG_UNIFORM` keys, from a generator seeded
    with ``population.seed`` (the same config draws the same members)."""
    for key, values in ranges.items():
        if len(values) != 2 or not values[0] < values[1]:
            raise ConfigError(
                f"population.{key}: population.random draws from a range [low, high] with low "
                f"< high, got {list(values)}"
            )
        if key in LOG_UNIFORM and values[0] <= 0:
            raise ConfigError(f"population.{key}: a log-uniform range needs low > 0")
    rng = np.random.default_rng(population.seed)
    u = rng.random((population.random, len(ranges)))
    cols = []
    for j, (key, (lo, hi)) in enumerate(ranges.items()):
        if key in LOG_UNIFORM:
            cols.append(np.exp(np.log(lo) + u[:, j] * (np.log(hi) - np.log(lo))))
        else:
            cols.append(lo + u[:, j] * (hi - lo))
    return [tuple(float(c[i]) for c in cols) for i in range(population.random)]


def num_members(cfg: Config) -> int:
    """``M``: the members of ``cfg``'s population (the grid's size, or ``population.random``;
    1 without one)."""
    if cfg.population.random and population_grid(cfg.population):
        return cfg.population.random
    return math.prod(len(v) for v in population_grid(cfg.population).values())


def ranked_members(cfg: Config) -> int:
    """The members whose checkpoints are ranked one by one (each walked at its own best
    epoch): ``M`` with a population, 0 without one."""
    return num_members(cfg) if population_grid(cfg.population) else 0


def population_size(cfg: Config) -> int:
    """``P = M · S``: the agents the run trains (members × ``train.num_seeds``)."""
    return num_members(cfg) * cfg.train.num_seeds


def agent_configs(cfg: Config) -> tuple[Config, ...] | None:
    """Every agent's config, member-major (``[P]``: member ``m``'s config for each of its
    ``train.num_seeds`` seeds; None without a population: every agent has ``cfg``)."""
    if not population_grid(cfg.population):
        return None
    return tuple(m.cfg for m in members(cfg) for _ in range(cfg.train.num_seeds))


def load(path: str | Path | None = None, overrides: Iterable[str] = ()) -> Config:
    """:func:`jaxdqn.config.loading.load`, and every population member's values checked as its
    own ``key=value`` overrides would be (:func:`members`), so a bad member fails at load time.

    Raises:
      ConfigError: as :func:`jaxdqn.config.loading.load`, or a bad population (one line).
    """
    cfg = loading.load(path, overrides)
    members(cfg)
    return cfg
