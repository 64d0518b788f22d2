"""Walk-forward (E3): every fold trained from scratch, its test segment stitched out of sample.

:func:`run_walkforward` plans the folds of ``cfg.walkforward`` on the config's bars
(:mod:`jaxdqn.market.folds` has the arithmetic: anchored or rolling, purge, embargo), then
trains fold k with :class:`jaxdqn.program.run.loop.Trainer` — the same population program as
``python -m jaxdqn.train``, on ``data.split = bars`` with the fold's ranges — in
``RUN_DIR/fold_<k>/``, a normal run directory (``summary.json``, ``report.md``, ...). The folds'
test walks (``eval_test.csv``, every seed) and baselines (``baselines_test.csv``) are then
stitched into one out-of-sample series (:mod:`jaxdqn.program.walkforward.stitched`).

On a panel the folds are planned on the panel's calendar (the union of its instruments' dates)
and each fold's config cuts every instrument at the fold's dates (``data.split = dates``); the
plan records the instruments each fold keeps (:func:`jaxdqn.market.panel_market.admit`: one too
short for a fold is refused by name, or dropped from it when ``data.min_bars`` > 0), and the
results add every instrument's stitched series (:mod:`jaxdqn.program.walkforward.panel`).

Files of ``RUN_DIR``:

* ``config.yaml`` — the walk-forward's config (each fold's own is in its directory);
* ``walkforward_plan.json`` — the folds' bar ranges and dates, written before the first fold;
* ``fold_<k>/`` — fold k's run directory;
* ``walkforward.json``, ``stitched_test.csv``, ``walkforward.md`` and its plots — the results
  (schema in :mod:`jaxdqn.program.walkforward.stitched`).

Resuming (``resume=True``, after a crash or a kill −9): the plan is made again from the saved
config and must equal the saved plan; a fold with a ``summary.json`` is done and skipped; the
first fold without one resumes from its own latest checkpoint (``Trainer(resume=True)``, as
``python -m jaxdqn.train --resume`` does) or, when it had not saved one yet, starts again. As
every fold's training resumes bit for bit, a resumed walk-forward ends with the results of an
uninterrupted one (wall times aside).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from jaxdqn import config as config_lib
from jaxdqn.config import Config, ConfigError
from jaxdqn.market import clock as clock_lib
from jaxdqn.market import data as data_lib
from jaxdqn.market import folds as folds_lib
from jaxdqn.market import market as market_lib
from jaxdqn.market import panel as panel_lib
from jaxdqn.market.errors import DataError
from jaxdqn.market.panel_market import admit
from jaxdqn.program.records.results import read_summary, write_text_atomic
from jaxdqn.program.report import document
from jaxdqn.program.walkforward import stitched

__all__ = [
    "PLAN_FILE",
    "Plan",
    "fold_config",
    "fold_dir",
    "make_plan",
    "plan_fold_config",
    "plan_record",
    "run_walkforward",
]

PLAN_FILE = "walkforward_plan.json"


class Plan(NamedTuple):
    """The folds of a walk-forward on its bars (a panel's: on its calendar)."""

    cfg: Config
    folds: list[folds_lib.Fold]
    dates: pd.DatetimeIndex
    first_decision: int
    bar_clock: clock_lib.BarClock
    """One bar clock for every fold and the stitched results (inferred on fold 0's train
    split when ``data.bars_per_year`` is auto)."""
    instruments: tuple[tuple[str, ...], ...] | None = None
    """A panel's: the instruments of each fold (None: one instrument)."""


def make_plan(cfg: Config) -> Plan:
    """Load ``cfg``'s bars and plan and check the folds of ``cfg.walkforward`` (on a panel: on
    its calendar, each fold cut by dates, with the instruments each fold keeps).

    Raises:
      DataError: unreadable data, or data too short for the folds (naming the fold, and on a
        panel the instrument when ``data.min_bars`` is 0).
    """
    first = market_lib.first_decision(cfg)
    panel = panel_lib.panel_of(cfg.data)
    if panel is not None:
        return _panel_plan(cfg, panel, first)
    df = data_lib.load(cfg.data)
    folds = folds_lib.plan_folds(pd.DatetimeIndex(df.index), cfg.walkforward)
    folds_lib.check_folds(df, folds, cfg.data, first)
    bar_clock = market_lib.resolve_clock(df, cfg.data.bars_per_year, folds[0].train)
    return Plan(cfg, folds, pd.DatetimeIndex(df.index), first, bar_clock)


def _panel_plan(cfg: Config, panel: panel_lib.Panel, first: int) -> Plan:
    """The plan on ``panel``'s calendar; every fold's instruments are admitted (or dropped) by
    :func:`jaxdqn.market.panel_market.admit` on the fold's date splits, as its training will."""
    dates = folds_lib.calendar(b.index for b in panel.bars)
    folds = folds_lib.plan_folds(dates, cfg.walkforward)
    members, clock_on = [], None
    for f in folds:
        try:
            kept, _ = admit(panel, f.date_config(cfg.data, dates), first)
        except DataError as e:
            raise DataError(f"walk-forward fold {f.index}: {e}") from None
        members.append(tuple(name for name, _, _ in kept))
        if clock_on is None:  # fold 0: the instrument with the longest train split
            clock_on = max(kept, key=lambda k: k[2].train[1] - k[2].train[0])
    _, bars, sp = clock_on
    bar_clock = market_lib.resolve_clock(bars, cfg.data.bars_per_year, sp.train)
    return Plan(cfg, folds, dates, first, bar_clock, tuple(members))


def fold_config(cfg: Config, fold: folds_lib.Fold, bars_per_year: float | None = None) -> Config:
    """``cfg`` with ``data.split = bars`` and the fold's ranges (the fold's run config), and
    ``data.bars_per_year`` set to the plan's clock when given."""
    data = fold.data_config(cfg.data)
    if bars_per_year is not None:
        data = dataclasses.replace(data, bars_per_year=float(bars_per_year))
    return dataclasses.replace(cfg, data=data)


def plan_fold_config(plan: Plan, fold: folds_lib.Fold) -> Config:
    """Fold ``fold``'s run config: :func:`fold_config` at the plan's clock, or on a panel its
    ranges as dates of the panel's calendar (``data.split = dates``)."""
    if plan.instruments is None:
        return fold_config(plan.cfg, fold, plan.bar_clock.bars_per_year)
    data = dataclasses.replace(
        fold.date_config(plan.cfg.data, plan.dates),
        bars_per_year=float(plan.bar_clock.bars_per_year),
    )
    return dataclasses.replace(plan.cfg, data=data)


def fold_dir(run_dir: Path, k: int) -> Path:
    """Fold k's run directory."""
    return Path(run_dir) / f"fold_{k}"


def _dates(plan: Plan, lo: int, hi: int) -> list[str]:
    return [folds_lib.stamp(plan.dates[lo]), folds_lib.stamp(plan.dates[hi - 1])]


def plan_record(plan: Plan) -> dict[str, Any]:
    """The JSON of ``walkforward_plan.json``: the settings, the bars, and per fold its ranges
    (``bars``: ``[start, stop)`` rows as configured, a panel's of its calendar) and the dates of
    its first and last bar (``dates``; train from its first decidable bar, the features' warmup
    excluded), and on a panel the fold's ``instruments``."""
    rows = []
    for k, f in enumerate(plan.folds):
        train = (max(f.train[0], plan.first_decision), f.train[1])
        rows.append(
            {
                "fold": f.index,
                "bars": {"train": list(f.train), "val": list(f.val), "test": list(f.test)},
                "dates": {
                    "train": _dates(plan, *train),
                    "val": _dates(plan, *f.val),
                    "test": _dates(plan, *f.test),
                },
                **({} if plan.instruments is None else {"instruments": list(plan.instruments[k])}),
            }
        )
    return {
        "settings": config_lib.to_dict(plan.cfg.walkforward),
        "num_bars": len(plan.dates),
        "first_decision": plan.first_decision,
        "bar_clock": plan.bar_clock.to_json(),
        "folds": rows,
    }


def _has_checkpoint(run_dir: Path) -> bool:
    """Whether ``run_dir/checkpoints`` holds a committed checkpoint (a step directory; Orbax
    writes into a temporary name and renames it when complete)."""
    ckpt = run_dir / "checkpoints"
    return ckpt.is_dir() and any(p.is_dir() and p.name.isdigit() for p in ckpt.iterdir())


def _run_fold(
    plan: Plan, fold: folds_lib.Fold, run_dir: Path, progress: bool, echo: Callable[[str], Any]
) -> None:
    """Train fold ``fold`` in its directory, resuming it when it has a checkpoint."""
    from jaxdqn.program.run import loop  # (the training program: only when a fold is trained)

    k, total = fold.index, len(plan.folds)
    fdir = fold_dir(run_dir, k)
    cfg = plan_fold_config(plan, fold)
    if read_summary(fdir) is not None:
        if not (fdir / document.REPORT_FILE).exists():  # killed between summary and report
            document.write_report(fdir)
        echo(f"fold {k + 1}/{total}: finished earlier ({fdir})")
        return
    resume = _has_checkpoint(fdir)
    if resume:
        saved = fdir / "config.yaml"
        if not saved.exists() or config_lib.load(saved) != cfg:
            raise ConfigError(
                f"{fdir}: its config.yaml is not the fold's config of this walk-forward; "
                "was the directory changed by hand?"
            )
    elif fdir.exists():
        shutil.rmtree(fdir)  # started, but killed before its first checkpoint: start again
    span = plan_record(plan)["folds"][k]["dates"]
    echo(
        f"fold {k + 1}/{total}: "
        + ", ".join(f"{s} {span[s][0]}..{span[s][1]}" for s in ("train", "val", "test"))
        + (" (resumed from its latest checkpoint)" if resume else "")
    )
    loop.Trainer(cfg, fdir, resume=resume, progress=progress).run()


def run_walkforward(
    cfg: Config,
    run_dir: str | Path,
    *,
    resume: bool = False,
    progress: bool = True,
    echo: Callable[[str], Any] = print,
) -> dict[str, Any]:
    """Train every fold of ``cfg.walkforward`` in ``run_dir`` and write the stitched results;
    returns the ``walkforward.json`` content. ``resume``: continue the walk-forward in
    ``run_dir`` (module docstring). ``echo``: where the one-line fold messages go.

    Raises:
      ConfigError: resuming a directory whose saved plan differs from the config's.
      DataError: data too short for the folds.
      KeyboardInterrupt: SIGINT inside a fold (its checkpoint is saved; resume continues it).
    """
    run_dir = Path(run_dir)
    start = time.time()
    plan = make_plan(cfg)
    record = json.loads(json.dumps(plan_record(plan)))
    plan_path = run_dir / PLAN_FILE
    if resume:
        saved = json.loads(plan_path.read_text()) if plan_path.exists() else None
        if saved != record:
            raise ConfigError(
                f"--resume {run_dir}: the folds planned from its config.yaml differ from its "
                f"{PLAN_FILE} (or it has none): not this walk-forward's directory"
            )
    else:
        if run_dir.exists() and any(run_dir.iterdir()):
            raise ConfigError(f"{run_dir}: not empty; resume it or choose a new directory")
        run_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(run_dir / "config.yaml", config_lib.dump(cfg))
        write_text_atomic(plan_path, json.dumps(record, indent=2) + "\n")
    for fold in plan.folds:
        _run_fold(plan, fold, run_dir, progress, echo)
    fold_dirs = [fold_dir(run_dir, f.index) for f in plan.folds]
    series = stitched.stitch(cfg, record, fold_dirs, session_start=start)
    stitched.write_results(run_dir, series)
    return series.result
