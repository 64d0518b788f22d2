"""A trained run restored with its own market: what ``predict`` and ``export`` start from.

:func:`load_run` reads a run directory's config, prepares its market exactly as training did
(the splits, the per-instrument feature normalisers and the reward unit its walks used),
rebuilds the agent and restores checkpoint ``which`` (:func:`restore_state`). :func:`read_bars`
reads the bars to decide on: the run's own, or a file or panel with more bars, read with the
run's data settings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from jaxdqn import config as config_lib
from jaxdqn.config import ConfigError
from jaxdqn.config.members import population_size
from jaxdqn.market import data as data_lib
from jaxdqn.market import features as features_lib
from jaxdqn.market.errors import DataError
from jaxdqn.market.splits import Splits
from jaxdqn.program.checkpoints.checkpoint import Checkpointer

__all__ = [
    "InstrumentView",
    "LoadedRun",
    "load_run",
    "read_bars",
    "restore_agents",
    "restore_state",
]


class InstrumentView(NamedTuple):
    """One instrument as the run saw it: its bars, splits and train-fitted features."""

    name: str
    bars: pd.DataFrame
    splits: Splits
    features: features_lib.Features


class LoadedRun(NamedTuple):
    """A run's restored agent and market (:func:`load_run`)."""

    run_dir: Path
    cfg: config_lib.Config
    prepared: Any
    agent: Any
    state: Any
    step: int
    views: tuple[InstrumentView, ...]
    first_decision: int


def _instrument_name(cfg: config_lib.Config) -> str:
    if cfg.data.source in ("sp500", "synthetic") or not cfg.data.path:
        return cfg.data.source
    return Path(cfg.data.path).name.split(".")[0]


def load_run(run_dir: Path, which: str | int = "best") -> LoadedRun:
    """The run in ``run_dir`` with checkpoint ``which`` (best, latest or a step) restored.

    Raises:
      ConfigError: not a run directory, no checkpoint (or not that step).
      DataError: the run's data can no longer be read.
      CheckpointError: the checkpoint cannot be restored.
    """
    from jaxdqn.agent.build import build_agent
    from jaxdqn.market import market as market_lib

    run_dir = Path(run_dir)
    saved = run_dir / "config.yaml"
    if (run_dir / "walkforward_plan.json").exists():
        folds = sorted(run_dir.glob("fold_*"), key=lambda f: int(f.name.split("_")[-1]))
        last = f" (its latest: {folds[-1]})" if folds else ""
        raise ConfigError(f"{run_dir}: a walk-forward; predict with one of its folds{last}")
    if not saved.exists():
        raise ConfigError(f"{run_dir}: no config.yaml (not a jaxdqn run directory)")
    cfg = config_lib.load(saved, [])
    prepared = market_lib.prepare(cfg)
    agent = build_agent(cfg, prepared)
    state, step = restore_state(run_dir, cfg, agent, prepared, which)
    if prepared.is_panel:
        views = tuple(
            InstrumentView(i.name, i.bars, i.splits, i.features) for i in prepared.instruments
        )
    else:
        name = _instrument_name(cfg)
        views = (InstrumentView(name, prepared.df, prepared.splits, prepared.features),)
    return LoadedRun(run_dir, cfg, prepared, agent, state, step, views, prepared.first_decision)


def read_bars(run: LoadedRun, path: str | None) -> dict[str, pd.DataFrame]:
    """The bars to decide on, by instrument: the run's own (``path`` None), else the file (one
    instrument's run) or the panel directory / glob / long file ``path`` read with the run's
    data settings (column names, date format, close-only).

    Raises:
      DataError: unreadable or invalid bars, or an instrument the run did not train on.
    """
    if path is None:
        return {v.name: v.bars for v in run.views}
    from jaxdqn.market import panel as panel_lib

    kind = data_lib.file_kind(Path(path)) or "csv"
    dcfg = dataclasses.replace(run.cfg.data, source=kind, path=str(path), instruments=())
    if not run.prepared.is_panel:
        return {run.views[0].name: data_lib.load(dcfg)}
    loaded = panel_lib.load_panel(str(path), dcfg, run.cfg.data.symbol_column)
    known = [v.name for v in run.views]
    unknown = [n for n in loaded.names if n not in known]
    if unknown:
        raise DataError(
            f"{path}: instrument {unknown[0]} is not one the run trained on ({', '.join(known)}); "
            "its normaliser is unknown (judge never-seen instruments with python -m "
            "jaxdqn.evaluate RUN_DIR data.path=... instead)"
        )
    return dict(zip(loaded.names, loaded.bars, strict=True))


def restore_state(
    run_dir: Path, cfg: Any, agent: Any, prepared: Any, which: str | int
) -> tuple[Any, int]:
    """``(state, step)``: checkpoint ``which`` (best, latest or a step) of ``run_dir``, the
    seed-stacked train state of ``agent`` on ``prepared``'s market.

    Raises:
      ConfigError: no checkpoint, or none at step ``which``.
      CheckpointError: the checkpoint cannot be restored.
    """
    return restore_agents(run_dir, cfg, agent, prepared, which, agents=[0], by_member=False)[0]


def restore_agents(
    run_dir: Path,
    cfg: Any,
    agent: Any,
    prepared: Any,
    which: str | int,
    *,
    agents: Sequence[int] | None = None,
    by_member: bool = True,
) -> dict[int, tuple[Any, int]]:
    """Each agent's ``(state, step)`` to walk (``agents``; default every agent): checkpoint
    ``which`` for all, except ``best`` of a population (``by_member``), where each member's
    agents get the member's own best checkpoint, as the run's finish walked them
    (:func:`jaxdqn.program.run.finish.best_checkpoints`; each step restored once).

    Raises:
      ConfigError: no checkpoint, or none at step ``which``.
      CheckpointError: a checkpoint cannot be restored.
    """
    import jax

    from jaxdqn.agent.build import make_init
    from jaxdqn.agent.population import population_keys
    from jaxdqn.program.run.finish import best_checkpoints

    num_seeds = population_size(cfg)  # every agent: members × seeds
    # The restore template: the abstract seed-stacked train state (nothing is computed).
    keys = population_keys(cfg.seed, num_seeds, cfg.train.num_seeds)
    template = jax.eval_shape(make_init(agent, num_seeds=num_seeds), prepared.market, keys)
    run_dir = Path(run_dir)
    ckpt = Checkpointer(
        run_dir / "checkpoints", keep_latest=cfg.train.keep_latest, keep_best=cfg.train.keep_best
    )
    try:
        steps = ckpt.steps()
        if not steps:
            raise ConfigError(f"{run_dir}: no checkpoints in {run_dir / 'checkpoints'}")
        if isinstance(which, int) and which not in steps:
            shown = ", ".join(map(str, steps))
            raise ConfigError(
                f"--checkpoint {which}: {run_dir} has no checkpoint at that step (steps: {shown})"
            )
        if which == "best" and by_member:
            chosen = best_checkpoints(cfg, ckpt, template, agents=agents)
            return {p: (state, step) for p, (state, _, step) in chosen.items()}
        state, _, step = ckpt.restore(which, template)
        return {p: (state, step) for p in (range(num_seeds) if agents is None else agents)}
    finally:
        ckpt.close()
