"""E3 baselines on a panel (issue 29): every baseline of :mod:`jaxdqn.evaluation.baselines` on
every instrument, through the panel's one walk program.

Each instrument's signals are computed on its own bars alone (momentum, MACD and the volatility
target never look across two instruments) and laid end to end like the panel's bars, so one
:func:`~jaxdqn.evaluation.panel_walk.stress_walk_panel` per baseline and split walks every
instrument. On a synthetic panel the oracle's execution is chosen per instrument on its val
walk (the best its known direction achieves there; ties: the first in table order), as one
instrument's is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import numpy as np
import pandas as pd

from jaxdqn import config
from jaxdqn.evaluation import baselines as base_lib
from jaxdqn.evaluation import panel_walk
from jaxdqn.evaluation.walk import EvalResult
from jaxdqn.market.panel_market import PanelPrepared

__all__ = ["PanelBaselines", "run_panel_baselines"]


class PanelBaselines(NamedTuple):
    """Every baseline walked on every instrument of a panel.

    Attributes:
      results: ``(baseline, split)`` → the :class:`~jaxdqn.evaluation.panel_walk.PanelResult`
        of its instruments' walks (``oracle``: each instrument's execution chosen on val).
      tables: instrument name → its table, as :func:`~jaxdqn.evaluation.baselines.run_baselines`
        returns one for one instrument (``attrs["oracle_execution"]`` its oracle's execution).
      table: the cross-sectional table: each baseline's ``PanelResult.metrics`` per split.
    """

    results: dict[tuple[str, str], panel_walk.PanelResult]
    tables: dict[str, pd.DataFrame]
    table: pd.DataFrame


def _table(rows: dict[str, dict[tuple[str, str], float]]) -> pd.DataFrame:
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.columns = pd.MultiIndex.from_tuples(table.columns, names=["split", "metric"])
    table.index.name = "baseline"
    return table


def run_panel_baselines(
    cfg: config.Config, prepared: PanelPrepared, splits: Sequence[str] = ("val", "test")
) -> PanelBaselines:
    """Walk every baseline over each split of every instrument of ``prepared``."""
    key = jax.random.PRNGKey(cfg.eval.key)
    ppy, names = prepared.bars_per_year, prepared.names
    parts: dict[str, list[base_lib.Signal]] = {}
    for inst in prepared.instruments:
        own = jax.tree.map(
            lambda x, inst=inst: x[inst.offset : inst.offset + inst.num_bars],
            prepared.market.replace(episode_ranges=None, episode_cdf=None),
        )
        for name, sig in base_lib.signals(own, prepared.env_params, cfg, bars_per_year=ppy).items():
            parts.setdefault(name, []).append(sig)
    sigs = {
        name: base_lib.Signal(
            np.concatenate([p.direction for p in ps]), np.concatenate([p.scale for p in ps])
        )
        for name, ps in parts.items()
    }
    jobs = base_lib.walk_jobs(sigs)

    offsets = [inst.offset for inst in prepared.instruments]
    dates = [prepared.dates_of(i) for i in range(len(names))]
    walked: dict[tuple[str, str], list[EvalResult]] = {}
    for name, (policy_fn, params) in jobs.items():
        need = [*splits, "val"] if name in base_lib.ORACLE_EXECUTIONS else splits
        for split in dict.fromkeys(need):
            walked[(name, split)] = panel_walk.stress_walk_panel(
                prepared.market,
                prepared.env_params,
                prepared.ranges(split, walk=True),
                offsets,
                dates,
                policy_fn,
                key,
                periods_per_year=ppy,
                policy_params=params,
            )[0]

    chosen: list[str | None] = [None] * len(names)
    if "oracle" in sigs:
        for i in range(len(names)):
            chosen[i] = base_lib.best_execution(
                [walked[(e, "val")][i].metrics["sharpe"] for e in base_lib.ORACLE_EXECUTIONS]
            )
        for split in splits:
            walked[("oracle", split)] = [walked[(e, split)][i] for i, e in enumerate(chosen)]

    order = [n for n in base_lib.BASELINE_NAMES if (n, splits[0]) in walked]
    order += [n for n in base_lib.ORACLE_EXECUTIONS if (n, splits[0]) in walked]
    results = {
        (name, split): panel_walk.cross_section(walked[(name, split)], names, cfg.eval.select_on)
        for name in order
        for split in splits
    }
    tables = {}
    for i, inst in enumerate(names):
        rows = {
            name: {(s, k): v for s in splits for k, v in walked[(name, s)][i].metrics.items()}
            for name in order
        }
        tables[inst] = _table(rows)
        if chosen[i] is not None:
            tables[inst].attrs["oracle_execution"] = chosen[i]
    table = _table(
        {
            name: {(s, k): v for s in splits for k, v in results[(name, s)].metrics.items()}
            for name in order
        }
    )
    return PanelBaselines(results, tables, table)
