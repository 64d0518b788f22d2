"""The end of a run (E3): the best checkpoint walked once on val and test, the baselines,
the statistics, the cost stress, ``summary.json`` and ``report.md``.

The best checkpoint is the one with the best mean validation Sharpe over the seeds
(:class:`jaxdqn.program.checkpoints.checkpoint.Checkpointer`, ``"best"``). Each seed is walked on
val and test with :func:`jaxdqn.program.run.walks.walk_seed`; the summary's ``val``/``test`` metrics
are the means over seeds (NaN ignored) and, with several seeds, ``seeds`` lists each seed's.
``statistics`` holds, per split, the population statistics of the seeds' walks against the baselines
(:mod:`jaxdqn.program.report.run_statistics`: bootstrap intervals, PSR, DSR over every val Sharpe
the selection saw, SPA; ``eval.bootstrap_reps`` replications; a population's are its winner's
agents'); ``cost_stress`` the test walk of
every seed at each of ``eval.cost_multiples`` × the configured costs (default 0×, 1×, 2×, 3×; 1× is
the test walk itself); ``bar_clock`` the bars per year of every annualised number
(:mod:`jaxdqn.market.clock`), whether it was inferred and how.

On a panel every walk is every instrument's (:mod:`jaxdqn.program.run.walks`): ``eval_*.csv`` has an
``instrument`` column, the baselines walk every instrument
(:mod:`jaxdqn.evaluation.panel_baselines`), ``val``/``test`` and the baselines' table hold the
``eval.select_on`` statistic over instruments, the ``statistics`` are those of the equal-weight
portfolios (``portfolio_*.csv``, ``baselines_*.csv``), each baseline's equity on each
instrument is in ``baselines_instruments_*.csv``, and ``instruments`` and ``panel`` are added
(:mod:`jaxdqn.program.report.panel_results`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from jaxdqn.agent.build import Agent
from jaxdqn.agent.state import TrainState
from jaxdqn.branches import ACTION_NAMES
from jaxdqn.config import Config
from jaxdqn.config.members import num_members, population_size, ranked_members
from jaxdqn.evaluation import baselines, panel_baselines
from jaxdqn.market.env import HELD_ORDER, HELD_URGENCY
from jaxdqn.market.market import PanelPrepared, Prepared
from jaxdqn.program.checkpoints import checkpoint
from jaxdqn.program.records import results
from jaxdqn.program.records.provenance import provenance
from jaxdqn.program.report import document, panel_results, population_results, run_statistics
from jaxdqn.program.run.placement import Placement
from jaxdqn.program.run.run_state import RunState
from jaxdqn.program.run.walks import stress_seed, walk_seed

#: The branches close-only bars hold, and the choice each is held at (E1 ``hold_orders``).
HELD = {
    "order": ACTION_NAMES["order"][HELD_ORDER],
    "urgency": ACTION_NAMES["urgency"][HELD_URGENCY],
}

__all__ = ["finish"]

SPLITS = ("val", "test")


def best_checkpoints(
    cfg: Config,
    ckpt: checkpoint.Checkpointer,
    template: TrainState,
    placed: Placement | None = None,
    agents: Sequence[int] | None = None,
) -> dict[int, tuple[TrainState, dict[str, Any], int]]:
    """Each agent's ``(state, host, step)`` to walk (``agents``; default every agent): the best
    checkpoint (by the mean val Sharpe over the agents) for all, or with a population each
    member's own best for its agents (only the members ``agents`` need, each step restored
    once). ``placed``: the run's devices (every process restores)."""
    members, seeds = ranked_members(cfg), cfg.train.num_seeds
    agents = range(population_size(cfg)) if agents is None else agents
    member_of = {p: p // seeds if members else None for p in agents}
    restored: dict[Any, tuple[TrainState, dict[str, Any], int]] = {}  # by best step
    by_member = {}
    for m in dict.fromkeys(member_of.values()):
        step = ckpt.best_step(member=m)
        if step not in restored:  # (a corrupt best falls back to the member's next best)
            state, host, got = ckpt.restore("best", template, member=m)
            restored[step] = (placed.view(state) if placed else state, host, got)
        by_member[m] = restored[step]
    return {p: by_member[m] for p, m in member_of.items()}


class _Walks(NamedTuple):
    """Every agent's walks of the best checkpoint: ``per_seed`` (each agent's metrics by split,
    its best epoch and step in a population), ``logs`` and ``walks`` by split (one per agent),
    ``stress``: each agent's test walk at every cost multiple (empty without a test walk)."""

    per_seed: list[dict[str, Any]]
    logs: dict[str, list[pd.DataFrame]]
    walks: dict[str, list[Any]]
    stress: list[list[Any]]


def _walk_agents(cfg: Config, prepared, agent: Agent, chosen_by_agent, splits) -> _Walks:
    """Walk every agent's chosen checkpoint on ``splits``; the test walk also at the other cost
    multiples of ``eval.cost_multiples``."""
    ranked = ranked_members(cfg) > 0  # a population: each agent at its member's best epoch
    out = _Walks([], {split: [] for split in splits}, {split: [] for split in splits}, [])
    multiples = cfg.eval.cost_multiples
    stressed = [k for k in multiples if k != 1.0]
    for s in range(population_size(cfg)):  # every agent: members × seeds
        best, host, step = chosen_by_agent[s]
        seed_metrics = {}
        for split in splits:
            res = walk_seed(agent, prepared, cfg.eval, best, split, s)
            out.logs[split].append(res.log)
            out.walks[split].append(res)
            seed_metrics[split] = res.metrics
            if split == "test":
                extra = iter(stress_seed(agent, prepared, cfg.eval, best, split, s, stressed))
                out.stress.append([res if k == 1.0 else next(extra) for k in multiples])
        out.per_seed.append({"seed": s, **seed_metrics})
        if ranked:
            out.per_seed[-1] |= {"best_epoch": RunState.from_json(host).epoch, "best_step": step}
    return out


def _baselines(cfg: Config, prepared, walked: _Walks, splits, run_dir: Path):
    """The baselines on ``splits`` (every instrument's on a panel, with the equal-weight
    portfolios and the panel sections), their CSVs written: ``(summary entries, the logs the
    statistics compare: the agents' and the baselines', the panel sections)``."""
    base_logs: dict[tuple[str, str], pd.DataFrame] = {}
    stat_logs, panel = walked.logs, {}
    if prepared.is_panel:
        base = panel_baselines.run_panel_baselines(cfg, prepared, splits=splits)
        table = base.table
        stat_logs, base_logs = panel_results.portfolio_logs(walked.walks, base)
        for split, frames in stat_logs.items():
            results.write_eval_log(run_dir / f"portfolio_{split}.csv", frames)
        panel_results.write_instrument_baselines(run_dir, base, splits)
        logs = (stat_logs, base_logs)
        panel = panel_results.panel_entries(cfg, prepared, walked.walks, base, logs)
    else:
        table = baselines.run_baselines(cfg, prepared, splits=splits, logs=base_logs)
    base_summary = {
        name: {split: {k: float(v) for k, v in table.loc[name, split].items()} for split in splits}
        for name in table.index
    }
    if baselines.oracle_execution(table) is not None:
        base_summary["oracle"]["execution"] = baselines.oracle_execution(table)
    # the equity plot draws the baselines, not each of the oracle's executions
    drawn = [name for name in table.index if name not in baselines.ORACLE_EXECUTIONS]
    for split in splits:
        results.write_baseline_equity(
            run_dir / f"baselines_{split}.csv",
            stat_logs[split][0]["date"],
            {name: base_logs[(name, split)]["equity"].to_numpy() for name in drawn},
        )
    return base_summary, stat_logs, base_logs, panel


def finish(
    cfg: Config,
    prepared: Prepared | PanelPrepared,
    agent: Agent,
    ckpt: checkpoint.Checkpointer,
    template: TrainState,
    run: RunState,
    run_dir: Path,
    start_wall: float,
    *,
    placed: Placement | None = None,
) -> dict[str, Any] | None:
    """Walk the best checkpoint of ``ckpt`` (restored into ``template``'s structure, ``[S,
    ...]``) for every seed; write ``eval_{val,test}.csv``, ``baselines_{val,test}.csv``,
    ``summary.json`` and the report in ``run_dir``; return the summary. ``run`` is the final
    run state (epochs, rewinds, fault events) and ``start_wall`` the run's start time.
    ``placed``: the run's devices; under ``jax.distributed`` only process 0 walks and writes
    (the others return None)."""
    chosen_by_agent = best_checkpoints(cfg, ckpt, template, placed)
    if placed is not None and not placed.primary:  # under jax.distributed process 0 writes
        return None
    splits = SPLITS if cfg.eval.walk_test else ("val",)
    walked = _walk_agents(cfg, prepared, agent, chosen_by_agent, splits)
    per_seed = walked.per_seed
    for split, frames in walked.logs.items():
        results.write_eval_log(run_dir / f"eval_{split}.csv", frames)
    base_summary, stat_logs, base_logs, panel = _baselines(cfg, prepared, walked, splits, run_dir)

    population = population_results.member_entries(cfg, per_seed)
    # a population's statistics and best epoch are its winner's agents' (every agent is a DSR
    # trial); otherwise every agent shares the one best checkpoint
    chosen = population[0][population[1]["member"]]["agents"] if population else None
    _, best_host, best_step = chosen_by_agent[chosen[0] if chosen else 0]
    trials = run_statistics.selection_trials(run_dir, num_members(cfg))
    stats = {
        split: run_statistics.split_statistics(
            cfg,
            stat_logs[split] if chosen is None else [stat_logs[split][p] for p in chosen],
            base_logs,
            split,
            trials,
            bars_per_year=prepared.bars_per_year,
        )
        for split in splits
    }
    stress = None  # the test walk at multiples of the costs (none without a test walk)
    if walked.stress:
        multiples = cfg.eval.cost_multiples
        stress = run_statistics.cost_stress_table(prepared.env_params, multiples, walked.stress)
    mean = lambda split: {
        k: float(np.nanmean([m[split][k] for m in per_seed])) for k in per_seed[0][split]
    }
    summary = {
        "best_epoch": RunState.from_json(best_host).epoch,
        "best_step": best_step,
        "bar_clock": prepared.bar_clock.to_json(),
        "data": {
            "close_only": prepared.close_only,
            "volume": prepared.has_volume,
            "held_branches": dict(HELD) if prepared.close_only else {},
        },
        **{split: mean(split) for split in splits},
        "baselines": base_summary,
        **panel,
        "statistics": stats,
        **({"cost_stress": stress} if stress is not None else {}),
        "wall_time_s": time.time() - start_wall,
        "epochs": run.epoch,
        "rewinds": run.rewinds,
        "fault_events": run.fault_events,
        "provenance": provenance(cfg, run_dir, placed.xla_options if placed else None),
    }
    if len(per_seed) > 1:
        summary["seeds"] = per_seed
    if population is not None:  # the run's results are its winner's (selected on val)
        summary["members"], summary["winner"] = population
        entry = summary["members"][summary["winner"]["member"]]
        summary.update({split: entry[split] for split in splits})
    results.write_summary(run_dir, summary)
    document.write_report(run_dir)
    return summary
