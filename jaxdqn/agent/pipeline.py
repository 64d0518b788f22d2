"""The pipelined learner (``optim.pipeline``, DESIGN L2): each update learns from a batch
sampled, and a target built, during the update before it.

The plain update (:func:`jaxdqn.agent.learner.update`) is one chain of dependent steps: sample
(L8) → target network at s′ → a′ and projection (L2, P1) → loss gradient → optimiser (O1). Here
:func:`pipelined_update` runs :func:`jaxdqn.agent.learner.learn` on the batch prefetched one
update earlier and, independently of it, prefetches the next one (:func:`prefetch`), so a GPU
can run the sampling, the target pass and the projection beside the gradient, not before it.
"""

from __future__ import annotations

import chex
import jax

from jaxdqn.agent.learner import Learner, Prepared, learn, member_hypers, prepare, sample
from jaxdqn.agent.state import TrainState

__all__ = ["pipelined_update", "pipelined_updates", "prefetch"]


def _bound(learner: Learner, state: TrainState) -> dict:
    """The learner's pieces, spec and numbers (a population member's own:
    :func:`~jaxdqn.agent.learner.member_hypers`)."""
    hypers = member_hypers(learner.hypers, state.members)
    return {"pieces": learner.pieces, "spec": learner.spec, "hypers": hypers}


def prefetch(learner: Learner, state: TrainState, key: chex.PRNGKey) -> Prepared:
    """:func:`~jaxdqn.agent.learner.sample` and :func:`~jaxdqn.agent.learner.prepare` at
    ``state`` with ``key`` (split in two): the batch an update learns from and its target, as
    the plain update computes them at ``state``."""
    bound = _bound(learner, state)
    k_sample, k_target = jax.random.split(key)
    batch = sample(state, learner.spec.shards.fold(k_sample), **bound)
    return prepare(state, batch, k_target, **bound)


def pipelined_update(
    learner: Learner, carry: tuple[TrainState, Prepared]
) -> tuple[tuple[TrainState, Prepared], dict[str, chex.Array]]:
    """One pipelined update: learn from the batch prefetched at the state before this one and,
    independently of it, :func:`prefetch` the next update's batch and target at this state.

    With ``θ_k, θ⁻_k, R_k`` the online and target parameters and the replay (its priorities)
    before update k, the plain update k samples from ``R_k`` and builds its target with
    ``θ⁻_k``; the pipelined one learns from a batch sampled from ``R_{k−1}`` with a target from
    ``θ⁻_{k−1}`` (and the support, reward-std EMA and β of before update k − 1): one update
    stale, the loss reading the online network on the support that target lives on. The
    gradient, the optimiser, the priorities' write and the target network's move use the
    current state, as in the plain update."""
    state, prepared = carry
    key, k_next = jax.random.split(state.key)
    # The barrier gives the prefetch its own values of the state: without it XLA fuses the
    # prefetch's first reads of θ⁻ (the bfloat16 cast of its weights) with the Polyak move
    # that reads the same θ⁻ after Adam (a multi-output sibling fusion), and the whole prefetch
    # waited for the learn half (H100 trace: the chain 37 → 41 kernels, 602 → 654 µs).
    upcoming = prefetch(learner, jax.lax.optimization_barrier(state), k_next)
    new_state, metrics = learn(state.replace(key=key), prepared, **_bound(learner, state))
    return (new_state, upcoming), metrics


def pipelined_updates(
    learner: Learner, state: TrainState, count: int, *, unroll: int = 1
) -> tuple[TrainState, dict[str, chex.Array]]:
    """``count`` :func:`pipelined_update` steps under one ``lax.scan`` (``unroll`` updates a
    loop body): the first batch is prefetched at ``state`` before the scan (it learns from the
    state's own replay and target network, like the plain update), and the batch the last step
    prefetches is dropped: each scan starts afresh, so nothing prefetched crosses an iteration,
    its acting or a checkpoint. ``(state, metrics)``, each metric ``[count, ...]``."""
    key, k_first = jax.random.split(state.key)
    state = state.replace(key=key)
    first = prefetch(learner, state, k_first)
    body = lambda c, _: pipelined_update(learner, c)
    (state, _), metrics = jax.lax.scan(body, (state, first), None, count, unroll=unroll)
    return state, metrics
