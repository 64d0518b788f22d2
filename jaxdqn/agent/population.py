"""A hyperparameter population on device (issue 32): each member's values as arrays.

A population's members differ only in values that change no array shape
(:data:`jaxdqn.config.population_sections.POPULATION_KEYS`), so they train as the members of
the one vmapped program that trains seeds: the train state's leading axis holds ``P = M · S``
agents, member-major (agent ``p`` is seed ``p mod S`` of member ``p // S``), and every agent
carries its member's values in ``TrainState.members`` (:class:`MemberValues`, float32 scalars;
``[P]`` stacked). The learner and the store step read them from there instead of the values
bound at build time; the learning rate, which the host sets every epoch (O2), is written per
agent by the schedule. Without a population ``TrainState.members`` is None and nothing changes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxdqn.agent.resolve import replay_weighting
from jaxdqn.config import Config

__all__ = ["MemberValues", "make_member_values", "population_keys"]


@struct.dataclass
class MemberValues:
    """One agent's member values (float32 ``[]``; a population stacks them to ``[P]``).

    Attributes:
      lr: O1/O2 base learning rate (``optim.lr``; the host's SGDR schedule scales it).
      gamma: discount γ of the n-step returns (``loss.gamma``).
      gamma_n: the bootstrap discount γⁿ (L7's support update).
      polyak_rate: L2's Polyak rate (``loss.polyak_tau``).
      entropy_base: L4's base coefficient (``loss.entropy_base``).
      beta0: L8's IS exponent at update 0 (``replay.priority_beta0``).
      alpha: L8's priority exponent (``replay.priority_alpha``; 0 with ``replay.prioritised``
        off, as :func:`jaxdqn.agent.resolve.replay_weighting` has it).
      spread: ``[4]`` L3's per-branch weights ``loss.spread_weight × spread_branch_scale_b``
        (:class:`jaxdqn.agent.losses.LossCoefficients`).
      stats_alpha: EMA rate of the reward std (store step) and the batch statistics (learner)
        (``dynamics.stats_alpha``).
      support_sigmas, support_alpha, support_max_alpha: L7's half-width in return stds and its
        base and abnormal-shift EMA rates (``dynamics.support_*``).

    A1/A2/O2/O3 values and M14's validation EMA rate are host-side: the host schedule and
    :func:`jaxdqn.agent.dynamics.next_eval_q_std` take them per agent.
    """

    lr: chex.Array
    gamma: chex.Array
    gamma_n: chex.Array
    polyak_rate: chex.Array
    entropy_base: chex.Array
    beta0: chex.Array
    alpha: chex.Array
    spread: chex.Array
    stats_alpha: chex.Array
    support_sigmas: chex.Array
    support_alpha: chex.Array
    support_max_alpha: chex.Array


def make_member_values(member_cfgs: Sequence[Config], num_seeds: int) -> MemberValues:
    """The ``[M · S]`` values of ``M`` member configs with ``num_seeds`` seeds each, member-major
    (γⁿ computed in float64 from the member's γ and n, as a single run computes it)."""
    rows = [
        (
            c.optim.lr,
            c.loss.gamma,
            c.loss.gamma**c.loss.n_step,
            c.loss.polyak_tau,
            c.loss.entropy_base,
            c.replay.priority_beta0,
            replay_weighting(c.replay)[0],
            c.dynamics.stats_alpha,
            c.dynamics.support_sigmas,
            c.dynamics.support_alpha,
            c.dynamics.support_max_alpha,
        )
        for c in member_cfgs
    ]
    table = np.repeat(np.asarray(rows, np.float64), num_seeds, axis=0).astype(np.float32)
    # L3's weights are products in float64, rounded once, as a single run's coefficients are
    spread = [[w * c.loss.spread_weight for w in c.loss.spread_branch_scale] for c in member_cfgs]
    spread = np.repeat(np.asarray(spread, np.float64), num_seeds, axis=0).astype(np.float32)
    names = [f.name for f in dataclasses.fields(MemberValues) if f.name != "spread"]
    columns = {name: jnp.asarray(table[:, i]) for i, name in enumerate(names)}
    return MemberValues(**columns, spread=jnp.asarray(spread))


def population_keys(seed: int, num_agents: int, num_seeds: int) -> chex.Array:
    """``[P, 2]`` keys of ``P = M · S`` agents, member-major: every member's seed ``s`` starts
    from the key that seed ``s`` of an ordinary run with ``train.num_seeds = S`` gets, so
    member ``m`` is the run with its values (:func:`make_member_values`); ``P = S``: an
    ordinary run's keys."""
    keys = jax.random.split(jax.random.PRNGKey(seed), num_seeds)
    return jnp.tile(keys, (num_agents // num_seeds, 1))
