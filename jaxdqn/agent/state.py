"""The train state: everything that changes during training, on device, as one pytree.

Online and target parameters, optimiser state, replay, the n-step carry, the vectorised
environments and their observations, the training statistics (:mod:`jaxdqn.agent.dynamics`:
support, EMAs, M13, M14 and the host-set inputs, all float32 arrays so changing them never
recompiles), the PRNG key and counters. It is vmappable over a leading seed axis;
:func:`jaxdqn.agent.build.build_agent` makes the functions that create and advance it.
"""

from __future__ import annotations

from typing import Any

import chex
import jax
from flax import struct

from jaxdqn.agent.dynamics import DynamicsState
from jaxdqn.agent.nstep import NStepState
from jaxdqn.agent.population import MemberValues
from jaxdqn.agent.replay import ReplayState
from jaxdqn.market.env import EnvState

__all__ = ["TrainState", "fold_keys"]


@struct.dataclass
class TrainState:
    """Everything that changes during training (one seed; vmap adds a leading axis)."""

    params: Any
    target_params: Any
    opt_state: Any
    replay: ReplayState
    nstep: NStepState
    env: EnvState  # leaves [E, ...]
    obs: chex.Array  # [E, obs_dim]
    dynamics: DynamicsState
    key: chex.PRNGKey
    iteration: chex.Array  # int32, iterations run
    updates: chex.Array  # int32, learner updates applied
    # a population member's values (jaxdqn.agent.population); None: the values bound at build
    members: MemberValues | None = None


def fold_keys(state: TrainState, salt: int) -> TrainState:
    """``state`` (leading seed axis) with ``salt`` folded into every seed's key."""
    return state.replace(key=jax.vmap(lambda k: jax.random.fold_in(k, salt))(state.key))
