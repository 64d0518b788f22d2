"""Deterministic walks (A1, E3) of one seed of a seed-stacked train state.

The training loop validates every seed after each epoch, the run's end walks the best
checkpoint on val and test, and ``python -m jaxdqn.evaluate`` walks any checkpoint: all three
go through :func:`walk_seed`, so a checkpoint walked by any of them gives the identical log.
:func:`stress_seed` walks the same policy at multiples of the costs (the cost stress). On a
panel every walk is every instrument's, in one program
(:func:`jaxdqn.evaluation.panel_walk.stress_walk_panel`), and its result a
:class:`~jaxdqn.evaluation.panel_walk.PanelResult` whose metrics are the ``eval.select_on``
statistic over instruments.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdqn.agent.build import Agent
from jaxdqn.agent.state import TrainState
from jaxdqn.config import EvalConfig
from jaxdqn.evaluation import cost_stress, panel_walk
from jaxdqn.evaluation import walk as walk_lib
from jaxdqn.market.market import PanelPrepared, Prepared

__all__ = ["make_validate", "seed_policy_params", "stress_seed", "walk_seed"]


@jax.jit
def _take_seed(tree: Any, s: jax.Array) -> Any:
    """Every leaf ``[S, ...]`` of ``tree`` at seed ``s`` (exact slices). One compiled program
    for all seeds and one call per walk (2-core CPU, A's sizes: six walks' slices 0.9 s, against
    3.0 s slicing the ~120 leaves one by one, one dispatch each)."""
    return jax.tree.map(lambda x: x[s], tree)


def seed_policy_params(agent: Agent, state: TrainState, s: int) -> tuple[Any, Any, Any, Any]:
    """``(params, v_min, Δz, readiness)`` of seed ``s`` of ``state`` ``[S, ...]``: the traced
    arguments of ``agent.acting.eval_policy`` (support grid from ``agent.dynamics.grid``)."""
    params, dyn = _take_seed((state.params, state.dynamics), jnp.int32(s))
    # the grid stays outside the compiled slice: computed as before, to the same bits
    v_min, dz = agent.dynamics.grid(dyn)
    return params, v_min, dz, dyn.iqn_readiness


def walk_seed(
    agent: Agent,
    prepared: Prepared | PanelPrepared,
    eval_cfg: EvalConfig,
    state: TrainState,
    split: str,
    s: int,
) -> walk_lib.EvalResult:
    """Seed ``s``'s evaluation policy walked over ``split`` with the fixed key ``eval.key``: the
    walk of :func:`jaxdqn.evaluation.walk.walk`, compiled with the cost rates as arguments (the
    1× walk of :func:`stress_seed`, whose other multiples then reuse its compilation)."""
    return stress_seed(agent, prepared, eval_cfg, state, split, s, (1.0,))[0]


def stress_seed(
    agent: Agent,
    prepared: Prepared | PanelPrepared,
    eval_cfg: EvalConfig,
    state: TrainState,
    split: str,
    s: int,
    multiples: Sequence[float],
) -> list[walk_lib.EvalResult]:
    """Seed ``s``'s walk of ``split`` at each of ``multiples`` × the configured costs
    (:func:`jaxdqn.evaluation.cost_stress.stress_walk`; one walk per multiple, in order)."""
    if prepared.is_panel:
        return panel_seed(agent, prepared, eval_cfg, state, split, s, multiples)
    lo, hi = prepared.eval_range(split)
    return cost_stress.stress_walk(
        prepared.market,
        prepared.env_params,
        lo,
        hi,
        agent.acting.eval_policy,
        jax.random.PRNGKey(eval_cfg.key),
        prepared.dates,
        multiples,
        periods_per_year=prepared.bars_per_year,
        policy_params=seed_policy_params(agent, state, s),
    )


def panel_seed(
    agent: Agent,
    prepared: PanelPrepared,
    eval_cfg: EvalConfig,
    state: TrainState,
    split: str,
    s: int,
    multiples: Sequence[float],
) -> list[panel_walk.PanelResult]:
    """:func:`stress_seed` on a panel: every instrument's walk of ``split`` at each multiple,
    one :class:`~jaxdqn.evaluation.panel_walk.PanelResult` per multiple."""
    per_multiple = panel_walk.stress_walk_panel(
        prepared.market,
        prepared.env_params,
        prepared.ranges(split, walk=True),
        [inst.offset for inst in prepared.instruments],
        [prepared.dates_of(i) for i in range(len(prepared.instruments))],
        agent.acting.eval_policy,
        jax.random.PRNGKey(eval_cfg.key),
        multiples,
        periods_per_year=prepared.bars_per_year,
        policy_params=seed_policy_params(agent, state, s),
    )
    return [panel_walk.cross_section(w, prepared.names, eval_cfg.select_on) for w in per_multiple]


def make_validate(
    agent: Agent, prepared: Prepared | PanelPrepared, eval_cfg: EvalConfig, num_seeds: int
) -> Callable[[TrainState], tuple[list[walk_lib.EvalResult], np.ndarray]]:
    """``validate(state) -> (results, spread)``: every seed's val walk and the ``[S]``
    validation Q spreads (:func:`jaxdqn.evaluation.walk.value_spread`, M14's host input; on
    a panel over every instrument's val bars)."""
    model, market, env_params = agent.model, prepared.market, prepared.env_params
    if prepared.is_panel:
        rows = jnp.asarray(
            np.concatenate([np.arange(lo, hi) for lo, hi in prepared.ranges("val", walk=True)]),
            jnp.int32,
        )
        one = lambda params, vmin, dz: panel_walk.value_spread_rows(
            model, params, market, env_params, rows, vmin, dz
        )
    else:
        vlo, vhi = prepared.eval_range("val")
        one = lambda params, vmin, dz: walk_lib.value_spread(
            model, params, market, env_params, vlo, vhi, vmin, dz
        )
    spread_fn = jax.jit(jax.vmap(one))

    def validate(state: TrainState) -> tuple[list[walk_lib.EvalResult], np.ndarray]:
        results = [walk_seed(agent, prepared, eval_cfg, state, "val", s) for s in range(num_seeds)]
        v_min, dz = agent.dynamics.grid(state.dynamics)  # [S] each
        return results, np.asarray(spread_fn(state.params, v_min, dz))

    return validate
