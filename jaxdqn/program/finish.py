"""The end of a run (E3): the best checkpoint walked once on val and test, the baselines,
``summary.json`` and ``report.md``.

The best checkpoint is the one with the best mean validation Sharpe over the seeds
(:class:`jaxdqn.program.checkpoint.Checkpointer`, ``"best"``). Each seed is walked on val and
test with :func:`jaxdqn.program.walks.walk_seed`; the summary's ``val``/``test`` metrics are the
means over seeds (NaN ignored) and, with several seeds, ``seeds`` lists each seed's.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from jaxdqn.agent.build import Agent
from jaxdqn.agent.state import TrainState
from jaxdqn.config import Config
from jaxdqn.evaluation import baselines
from jaxdqn.market.market import Prepared
from jaxdqn.program import checkpoint, report, results
from jaxdqn.program.run_state import RunState
from jaxdqn.program.walks import walk_seed

__all__ = ["finish"]

SPLITS = ("val", "test")


def finish(
    cfg: Config,
    prepared: Prepared,
    agent: Agent,
    ckpt: checkpoint.Checkpointer,
    template: TrainState,
    run: RunState,
    run_dir: Path,
    start_wall: float,
) -> dict[str, Any]:
    """Walk the best checkpoint of ``ckpt`` (restored into ``template``'s structure, ``[S,
    ...]``) for every seed; write ``eval_{val,test}.csv``, ``baselines_test.csv``,
    ``summary.json`` and the report in ``run_dir``; return the summary. ``run`` is the final
    run state (epochs, rewinds, fault events) and ``start_wall`` the run's start time."""
    best, best_host, best_step = ckpt.restore("best", template)
    num_seeds = cfg.train.num_seeds
    logs: dict[str, list[pd.DataFrame]] = {split: [] for split in SPLITS}
    per_seed = []
    for s in range(num_seeds):
        seed_metrics = {}
        for split in SPLITS:
            res = walk_seed(agent, prepared, cfg.eval, best, split, s)
            logs[split].append(res.log)
            seed_metrics[split] = res.metrics
        per_seed.append({"seed": s, **seed_metrics})
    for split, frames in logs.items():
        results.write_eval_log(run_dir / f"eval_{split}.csv", frames)

    base_logs: dict[tuple[str, str], pd.DataFrame] = {}
    table = baselines.run_baselines(cfg, prepared, logs=base_logs)
    base_summary = {
        name: {split: {k: float(v) for k, v in table.loc[name, split].items()} for split in SPLITS}
        for name in table.index
    }
    if baselines.oracle_execution(table) is not None:
        base_summary["oracle"]["execution"] = baselines.oracle_execution(table)
    # the equity plot draws the baselines, not each of the oracle's executions
    drawn = [name for name in table.index if name not in baselines.ORACLE_EXECUTIONS]
    results.write_baseline_equity(
        run_dir / "baselines_test.csv",
        logs["test"][0]["date"],
        {name: base_logs[(name, "test")]["equity"].to_numpy() for name in drawn},
    )

    mean = lambda split: {
        k: float(np.nanmean([m[split][k] for m in per_seed])) for k in per_seed[0][split]
    }
    summary = {
        "best_epoch": RunState.from_json(best_host).epoch,
        "best_step": best_step,
        "val": mean("val"),
        "test": mean("test"),
        "baselines": base_summary,
        "wall_time_s": time.time() - start_wall,
        "epochs": run.epoch,
        "rewinds": run.rewinds,
        "fault_events": run.fault_events,
    }
    if num_seeds > 1:
        summary["seeds"] = per_seed
    results.write_summary(run_dir, summary)
    report.write_report(run_dir)
    return summary
