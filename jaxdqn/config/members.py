"""The members of a hyperparameter population (:mod:`jaxdqn.config.population_sections`).

:func:`members` expands ``cfg.population`` into its grid: one :class:`Member` per combination
of the listed values, each with the config it trains (the values set, checked exactly as the
same ``key=value`` overrides would be) and its overrides for reports. A config without a
population has one member, itself.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from jaxdqn.config import loading
from jaxdqn.config.loading import _build, _set_nested, to_dict
from jaxdqn.config.population_sections import POPULATION_KEYS, PopulationConfig
from jaxdqn.config.sections import Config, ConfigError

__all__ = [
    "Member",
    "agent_base_lrs",
    "load",
    "members",
    "num_members",
    "population_grid",
    "population_size",
]


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
        return (Member({}, cfg),)
    for key, values in grid.items():
        if len(set(values)) != len(values):
            raise ConfigError(f"population.{key}: a value is listed twice ({list(values)})")
    base = to_dict(dataclasses.replace(cfg, population=PopulationConfig()))
    out = []
    for combo in itertools.product(*grid.values()):
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


def num_members(cfg: Config) -> int:
    """``M``: the members of ``cfg``'s population (the grid's size; 1 without one)."""
    return math.prod(len(v) for v in population_grid(cfg.population).values())


def ranked_members(cfg: Config) -> int:
    """The members whose checkpoints are ranked one by one (each walked at its own best
    epoch): ``M`` with a population, 0 without one."""
    return num_members(cfg) if population_grid(cfg.population) else 0


def population_size(cfg: Config) -> int:
    """``P = M · S``: the agents the run trains (members × ``train.num_seeds``)."""
    return num_members(cfg) * cfg.train.num_seeds


def agent_base_lrs(cfg: Config) -> tuple[float, ...] | None:
    """Every agent's base learning rate, member-major (None without a population: every
    agent has ``optim.lr``)."""
    if not population_grid(cfg.population):
        return None
    return tuple(m.cfg.optim.lr for m in members(cfg) for _ in range(cfg.train.num_seeds))


def load(path: str | Path | None = None, overrides: Iterable[str] = ()) -> Config:
    """:func:`jaxdqn.config.loading.load`, and every population member's values checked as its
    own ``key=value`` overrides would be (:func:`members`), so a bad member fails at load time.

    Raises:
      ConfigError: as :func:`jaxdqn.config.loading.load`, or a bad population (one line).
    """
    cfg = loading.load(path, overrides)
    members(cfg)
    return cfg
