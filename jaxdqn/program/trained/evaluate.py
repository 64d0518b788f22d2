"""Evaluate a saved agent (what ``python -m jaxdqn.evaluate`` runs): one run directory's
checkpoint walked over a split, or every fold of a panel's walk-forward on its own test segment.

:func:`evaluate_run` walks a checkpoint of ``RUN_DIR`` deterministically over a split
(:func:`jaxdqn.program.run.walks.walk_seed`) with data, env (costs) and eval keys overridden, and
writes ``eval_<split>.csv`` and ``metrics_<split>.json``: each seed's metrics and the population
statistics of the split against the baselines walked on the same bars. On a panel the
statistics are those of the equal-weight portfolios, ``metrics_<split>.json`` adds
``instruments`` and ``panel`` (:mod:`jaxdqn.program.report.panel_results`), and
``portfolio_<split>.csv`` and ``baselines_instruments_<split>.csv`` are written too.

:func:`evaluate_walkforward` does it for every fold of a panel's walk-forward (``fold_<k>``, its
checkpoint on its own test dates, the same overrides: e.g. instruments the walk-forward never
trained on) into ``OUT/fold_<k>/``, then stitches the folds instrument by instrument
(:func:`jaxdqn.program.walkforward.panel.stitch_instruments`) into ``OUT/metrics_test.json``::

    {"run_dir", "walkforward": true, "checkpoint", "overrides", "bar_clock",
     "folds": [{"fold": k, "dir": "fold_<k>", "checkpoint_step", "instruments": [...]}, ...],
     "seeds": [portfolio metrics per seed], "statistics": {...},   # the equal-weight portfolio
     "instruments": {name: {"folds", "bars", "test", "test_seeds", "baselines"}},
     "panel": {"instruments", "cross_section": {"test": ...},
               "portfolio": {"test": {"agent": ..., "baselines": {...}}}}}

and ``OUT/stitched_instruments_test.csv``. A fold already evaluated in ``OUT/fold_<k>/`` with
the same overrides and checkpoint (``best``: the step its ``summary.json`` selected) is reused,
so an evaluation killed halfway continues where it stopped. The equal-weight portfolio of the
stitched
instruments is, on each date, the mean over the instruments with that bar — the fold's own
portfolio, as each date lies in one fold's test segment.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from jaxdqn import config as config_lib
from jaxdqn.config import ConfigError
from jaxdqn.config.members import num_members, population_size, ranked_members
from jaxdqn.evaluation import metrics as metrics_lib
from jaxdqn.evaluation import panel_statistics
from jaxdqn.program.records.formats import to_jsonable
from jaxdqn.program.records.results import write_eval_log, write_text_atomic
from jaxdqn.program.report import panel_results, run_statistics
from jaxdqn.program.walkforward import panel as walkforward_panel

__all__ = [
    "EVAL_OVERRIDABLE",
    "Evaluation",
    "evaluate_run",
    "evaluate_walkforward",
]

EVAL_OVERRIDABLE = ("data.", "env.", "eval.", "seed=")
"""The overrides an evaluation accepts (the network must match the checkpoint)."""
PORTFOLIO_COLUMNS = ("return", "position", "traded")


class Evaluation(NamedTuple):
    """What :func:`evaluate_run` wrote: ``payload`` is ``metrics_<split>.json``'s content."""

    payload: dict[str, Any]
    log_path: Path
    metrics_path: Path


def check_overrides(overrides: Sequence[str]) -> None:
    """Raises ConfigError for an override an evaluation may not change."""
    for item in overrides:
        if not item.startswith(EVAL_OVERRIDABLE):
            key = item.split("=", 1)[0]
            raise ConfigError(
                f"{key}: evaluation may override only data.*, env.*, eval.* and seed "
                "(the network must match the checkpoint)"
            )


def evaluate_run(
    run_dir: Path,
    split: str,
    which: str | int,
    overrides: Sequence[str],
    out: Path,
    *,
    trials: tuple[Any, str] | None = None,
    agents: Sequence[int] | None = None,
) -> Evaluation:
    """Walk checkpoint ``which`` (best, latest or a step) of ``run_dir`` over ``split`` with
    ``overrides`` on its saved config, and write the files of the module docstring into
    ``out``.

    ``trials``: the DSR's ``(val Sharpes, description)`` (default: the run's own,
    :func:`~jaxdqn.program.report.run_statistics.selection_trials`; a sweep passes every trial
    of the search). ``agents``: walk only these agents (a population's winning member's; the
    payload's ``seeds`` and ``agents`` follow them); default every agent.

    Raises:
      ConfigError: no config.yaml or checkpoint (or not that step), or a bad override.
      DataError: the overridden data cannot be read or split.
      CheckpointError: the checkpoint cannot be restored.
    """

    from jaxdqn.agent.build import build_agent
    from jaxdqn.evaluation.baselines import run_baselines
    from jaxdqn.evaluation.panel_baselines import run_panel_baselines
    from jaxdqn.market import market as market_lib
    from jaxdqn.program.run.walks import walk_seed
    from jaxdqn.program.trained import load

    run_dir, out = Path(run_dir), Path(out)
    saved = run_dir / "config.yaml"
    if not saved.exists():
        raise ConfigError(f"{run_dir}: no config.yaml (not a jaxdqn run directory)")
    check_overrides(overrides)
    cfg = config_lib.load(saved, list(overrides))
    prepared = market_lib.prepare(cfg)
    agent = build_agent(cfg, prepared)
    num_seeds = population_size(cfg)  # every agent: members × seeds
    chosen = list(range(num_seeds)) if agents is None else [int(a) for a in agents]
    if not chosen or not all(0 <= a < num_seeds for a in chosen):
        raise ConfigError(f"agents {chosen}: the run has agents 0..{num_seeds - 1}")
    # "best" of a population: each member's agents at the member's own best checkpoint
    restored = load.restore_agents(run_dir, cfg, agent, prepared, which, agents=chosen)
    out.mkdir(parents=True, exist_ok=True)
    results = [walk_seed(agent, prepared, cfg.eval, restored[a][0], split, a) for a in chosen]
    step = restored[chosen[0]][1]
    log_path = write_eval_log(out / f"eval_{split}.csv", [r.log for r in results])
    base_logs: dict = {}
    stat_logs, panel = [r.log for r in results], {}
    if prepared.is_panel:
        base = run_panel_baselines(cfg, prepared, splits=(split,))
        portfolios = panel_results.portfolio_logs({split: results}, base)
        stat_logs, base_logs = portfolios[0][split], portfolios[1]
        panel = panel_results.panel_entries(cfg, prepared, {split: results}, base, portfolios)
        write_eval_log(out / f"portfolio_{split}.csv", stat_logs)
        panel_results.write_instrument_baselines(out, base, (split,))
    else:
        run_baselines(cfg, prepared, splits=(split,), logs=base_logs)
    stats = run_statistics.split_statistics(
        cfg,
        stat_logs,
        base_logs,
        split,
        trials or run_statistics.selection_trials(run_dir, num_members(cfg)),
        bars_per_year=prepared.bars_per_year,
    )
    payload = {
        "run_dir": str(run_dir),
        "checkpoint_step": step,
        "split": split,
        "overrides": list(overrides),
        "bar_clock": prepared.bar_clock.to_json(),
        "seeds": [r.metrics for r in results],
        **({"agents": chosen} if agents is not None else {}),
        **({"checkpoint_steps": [restored[a][1] for a in chosen]} if ranked_members(cfg) else {}),
        "statistics": stats,
        **panel,
    }
    metrics_path = out / f"metrics_{split}.json"
    metrics_path.write_text(json.dumps(payload, indent=2, default=float))
    return Evaluation(payload, log_path, metrics_path)


def _earlier(
    fdir: Path, which: str | int, overrides: Sequence[str], out: Path
) -> dict[str, Any] | None:
    """The payload of an earlier evaluation of fold ``fdir`` in ``out`` when it is this one: the
    same overrides, the test split, and the checkpoint asked for (``best``: the step the fold's
    ``summary.json`` selected; a step: that step; ``latest`` is never reused). None otherwise."""
    path = out / "metrics_test.json"
    if which == "latest" or not path.exists():
        return None
    try:
        payload = json.loads(path.read_text())
        summary = json.loads((fdir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    step = summary.get("best_step") if which == "best" else which
    same = (
        payload.get("split") == "test"
        and payload.get("overrides") == list(overrides)
        and step is not None
        and payload.get("checkpoint_step") == step
        and "instruments" in payload
    )
    return payload if same else None


def _evaluate_folds(wf_dir: Path, plan, which, overrides, out: Path, echo):
    """Each fold of ``plan`` evaluated on its test segment into ``out/fold_<k>`` (an earlier
    evaluation with the same checkpoint and overrides reused): ``(fold entries, their walks,
    the first fold's config with the overrides)``."""
    folds, walks, cfg = [], [], None
    for entry in plan["folds"]:
        k = entry["fold"]
        fdir = wf_dir / f"fold_{k}"
        if not (fdir / "summary.json").exists():
            raise ConfigError(f"{fdir}: the fold has not finished (no summary.json)")
        span = " .. ".join(entry["dates"]["test"])
        payload = _earlier(fdir, which, overrides, out / f"fold_{k}")
        if payload is None:
            echo(f"fold {k + 1}/{len(plan['folds'])}: test {span}")
            payload = evaluate_run(fdir, "test", which, overrides, out / f"fold_{k}").payload
        else:
            echo(f"fold {k + 1}/{len(plan['folds'])}: test {span} (evaluated earlier, reused)")
        cfg = cfg or config_lib.load(fdir / "config.yaml", list(overrides))
        walks.append(walkforward_panel.read_fold_walks(k, out / f"fold_{k}"))
        folds.append(
            {
                "fold": k,
                "dir": f"fold_{k}",
                "checkpoint_step": payload["checkpoint_step"],
                "instruments": list(payload["instruments"]),
            }
        )
    assert cfg is not None  # a plan has at least one fold
    return folds, walks, cfg


def _portfolio_logs(frame: pd.DataFrame, walks):
    """The stitched equal-weight portfolios from ``stitched_instruments_test.csv``'s rows: each
    seed's (the mean over the instruments trading each date) and each baseline's returns."""
    by_date = frame.groupby("date", sort=True)
    seeds = sorted(walks[0].log["seed"].unique())
    dates = pd.Series(list(by_date.groups), name="date")
    seed_logs = [
        pd.DataFrame(
            {
                "date": dates,
                **{c: by_date[f"seed_{s}_{c}"].mean().to_numpy() for c in PORTFOLIO_COLUMNS},
            }
        )
        for s in seeds
    ]
    names_b = [c for c in walks[0].baselines.columns if c not in ("instrument", "date")]
    base_logs = {
        (n, "test"): pd.DataFrame({"date": dates, "return": by_date[f"{n}_return"].mean().values})
        for n in names_b
    }
    return seed_logs, base_logs


def evaluate_walkforward(
    wf_dir: Path,
    which: str | int,
    overrides: Sequence[str],
    out: Path,
    echo: Callable[[str], Any] = print,
) -> dict[str, Any]:
    """Evaluate every fold of the panel walk-forward ``wf_dir`` on its test segment with
    ``overrides`` into ``out/fold_<k>`` and write the stitched ``out/metrics_test.json`` and
    ``out/stitched_instruments_test.csv`` (module docstring); returns the JSON's content.

    Raises:
      ConfigError: ``wf_dir`` is not a finished panel walk-forward, or a bad override.
      DataError, CheckpointError: as :func:`evaluate_run`.
    """
    wf_dir, out = Path(wf_dir), Path(out)
    plan = json.loads((wf_dir / "walkforward_plan.json").read_text())
    if not all("instruments" in f for f in plan["folds"]):
        raise ConfigError(
            f"{wf_dir}: a walk-forward of one instrument; evaluate one of its folds "
            f"({wf_dir}/fold_<k>) instead"
        )
    check_overrides(overrides)
    ppy = float(plan["bar_clock"]["bars_per_year"])
    folds, walks, cfg = _evaluate_folds(wf_dir, plan, which, overrides, out, echo)
    per, cross, frame = walkforward_panel.stitch_instruments(
        walks, ppy, reps=cfg.eval.bootstrap_reps, seed=cfg.eval.key
    )
    frame.to_csv(out / walkforward_panel.INSTRUMENTS_FILE, index=False)
    seed_logs, base_logs = _portfolio_logs(frame, walks)
    trials = run_statistics.fold_trials([wf_dir / f"fold_{f['fold']}" for f in folds])
    stats = run_statistics.split_statistics(
        cfg, seed_logs, base_logs, "test", trials, bars_per_year=ppy
    )
    seed_metrics = [panel_statistics.portfolio_metrics(log, ppy) for log in seed_logs]
    payload = {
        "run_dir": str(wf_dir),
        "walkforward": True,
        "checkpoint": which,
        "overrides": list(overrides),
        "bar_clock": dict(plan["bar_clock"]),
        "folds": folds,
        "seeds": seed_metrics,
        "statistics": stats,
        "instruments": per,
        "panel": {
            "instruments": list(per),
            "cross_section": {"test": cross},
            "portfolio": {
                "test": {
                    "agent": panel_results.seed_mean(seed_metrics),
                    "baselines": {
                        n: metrics_lib.performance(log["return"].to_numpy(), ppy)
                        for (n, _), log in base_logs.items()
                        if n != "flat"
                    },
                }
            },
        },
    }
    text = json.dumps(to_jsonable(payload, "evaluate"), indent=2, allow_nan=False)
    write_text_atomic(out / "metrics_test.json", text + "\n")
    return payload
