"""The end of a panel run (issue 29): what :func:`jaxdqn.program.run.finish.finish` adds to
``summary.json`` when the run trades a universe.

* ``instruments``: ``{name: {"val": metrics, "test": metrics, "baselines": {baseline: {"val",
  "test"}}}}`` — the agent's metrics on that instrument (the mean over seeds, NaN ignored, keyed
  as the run's ``val``/``test``) and every baseline's; on a synthetic panel the oracle's entry
  names the execution chosen on that instrument's val walk.
* ``panel``: the instruments, ``select_on``, and per split the cross-section
  (:func:`jaxdqn.evaluation.panel_statistics.cross_section_statistics`: the mean and median
  Sharpe over instruments with bootstrap intervals over instruments and seeds, the fraction of
  instruments where the agent beats buy-and-hold) and the equal-weight portfolio of the
  per-instrument agents against the equal-weight portfolio of each baseline
  (:func:`~jaxdqn.evaluation.panel_statistics.portfolio_log`). The run's ``statistics`` (PSR,
  DSR, SPA, bootstrap) are those portfolios'.
* ``panel["gate"]`` with ``eval.gate_t`` set and both splits walked: the validation-gated
  portfolio (:func:`~jaxdqn.evaluation.panel_statistics.validation_gate`): each agent trades
  on test the instruments whose own val walk passed the gate.
* ``baselines_instruments_{split}.csv`` (:func:`write_instrument_baselines`): every baseline's
  equity on every instrument's walk.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from jaxdqn.config import Config
from jaxdqn.evaluation import panel_statistics
from jaxdqn.evaluation.baselines import ORACLE_EXECUTIONS
from jaxdqn.evaluation.panel_baselines import PanelBaselines
from jaxdqn.evaluation.panel_statistics import seed_mean
from jaxdqn.evaluation.panel_walk import PanelResult
from jaxdqn.market.panel_market import PanelPrepared
from jaxdqn.program.records import results

__all__ = ["panel_entries", "portfolio_logs", "seed_mean", "write_instrument_baselines"]


def portfolio_logs(
    walks: Mapping[str, Sequence[PanelResult]], base: PanelBaselines
) -> tuple[dict[str, list[pd.DataFrame]], dict[tuple[str, str], pd.DataFrame]]:
    """The equal-weight portfolios: per split each seed's, and per ``(baseline, split)``."""
    agent = {
        split: [panel_statistics.portfolio_log(r.log) for r in rs] for split, rs in walks.items()
    }
    baselines = {key: panel_statistics.portfolio_log(r.log) for key, r in base.results.items()}
    return agent, baselines


def panel_entries(
    cfg: Config,
    prepared: PanelPrepared,
    walks: Mapping[str, Sequence[PanelResult]],
    base: PanelBaselines,
    portfolios: tuple[dict[str, list[pd.DataFrame]], dict[tuple[str, str], pd.DataFrame]],
) -> dict[str, Any]:
    """``{"instruments": ..., "panel": ...}`` of the module docstring; ``walks[split][s]`` is
    seed s's walk of the best checkpoint, ``portfolios`` :func:`portfolio_logs`'s."""
    splits = list(walks)
    instruments = {}
    for name in prepared.names:
        entry: dict[str, Any] = {
            split: seed_mean([r.instruments[name].metrics for r in walks[split]])
            for split in splits
        }
        table = base.tables[name]
        entry["baselines"] = {
            b: {split: {k: float(v) for k, v in table.loc[b, split].items()} for split in splits}
            for b in table.index
        }
        if table.attrs.get("oracle_execution"):
            entry["baselines"]["oracle"]["execution"] = table.attrs["oracle_execution"]
        instruments[name] = entry

    ppy = prepared.bars_per_year
    agent_pf, base_pf = portfolios
    cross, portfolio = {}, {}
    for split in splits:
        sharpe = np.asarray(
            [[r.instruments[n].metrics["sharpe"] for n in prepared.names] for r in walks[split]]
        )
        bh = np.asarray(
            [instruments[n]["baselines"]["buy_and_hold"][split]["sharpe"] for n in prepared.names]
        )
        cross[split] = panel_statistics.cross_section_statistics(
            sharpe, bh, reps=cfg.eval.bootstrap_reps, seed=cfg.eval.key
        )
        portfolio[split] = {
            "agent": seed_mean(
                [panel_statistics.portfolio_metrics(log, ppy) for log in agent_pf[split]]
            ),
            "baselines": {
                b: panel_statistics.portfolio_metrics(base_pf[(b, split)], ppy)
                for b in base.table.index
                if (b, split) in base_pf and not b.startswith("oracle_")
            },
        }
    panel = {
        "instruments": list(prepared.names),
        "select_on": cfg.eval.select_on,
        "cross_section": cross,
        "portfolio": portfolio,
    }
    if cfg.eval.gate_t is not None and "val" in walks and "test" in walks:
        panel["gate"] = panel_statistics.validation_gate(
            walks["val"], walks["test"], ppy, cfg.eval.gate_t
        )
    return {"instruments": instruments, "panel": panel}


def write_instrument_baselines(out_dir: Path, base: PanelBaselines, splits: Sequence[str]) -> None:
    """``baselines_instruments_{split}.csv`` of every split: each baseline's equity on each
    instrument's walk (the oracle's chosen execution, not each of its candidates), what a
    walk-forward stitches instrument by instrument."""
    for split in splits:
        logs = {
            b: r.log
            for (b, sp), r in base.results.items()
            if sp == split and b not in ORACLE_EXECUTIONS
        }
        results.write_instrument_baselines(
            Path(out_dir) / results.INSTRUMENT_BASELINES.format(split=split), logs
        )
