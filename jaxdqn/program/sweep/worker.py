"""A sweep worker: trains the study's trials, one after another, until the search has its
finished trials, then (the last worker) hands over to :mod:`.finale`.

A trial is an ordinary run (``python -m jaxdqn.train``'s :class:`Trainer`) in
``DIR/trials/trial_<number>`` with the trial's overrides and ``eval.walk_test=false``; its
report is its own, its value is the metric ``spec.metric`` of its ``summary.json`` ``val`` (the
run's checkpoint selection; a population's winner). Its console output goes to
``DIR/logs/trial_<number>.log``. A trial requeued after its worker died resumes that run
directory from its last checkpoint (a run with none starts afresh in its own directory).

A trial fails, and the search goes on, when its values make a config or data the program
refuses, or the run cannot go on (non-finite losses) or cannot be resumed; its error is kept in
the study (``error``) and ``max_failed`` such failures stop every worker.

With a ``pruner`` every epoch's val score (:func:`epoch_score`) is reported to Optuna as the
trial's value at that epoch, and a trial the pruner stops ends *pruned* after that epoch's
checkpoint (the run is left unfinished; a requeued trial that resumes a run reports the
epochs its log holds first).
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from jaxdqn import config as config_lib
from jaxdqn.config import ConfigError
from jaxdqn.config.members import ranked_members
from jaxdqn.market.errors import DataError
from jaxdqn.program.checkpoints.contents import CheckpointError
from jaxdqn.program.records.logger import read_metrics
from jaxdqn.program.sweep.space import SweepSpec, trial_overrides
from jaxdqn.program.sweep.study import SweepError, counts, requeue

__all__ = ["TRIALS", "epoch_score", "run_trial", "work"]

TRIALS = "trials"
"""The folder of the trials' run directories inside the sweep directory."""


class TrialFailed(Exception):
    """A trial that failed for a reason kept in the study; the search goes on."""


def _has_checkpoint(run_dir: Path) -> bool:
    ckpt = run_dir / "checkpoints"
    return ckpt.is_dir() and any(p.name.isdigit() for p in ckpt.iterdir())


def run_trial(trial: Any, spec: SweepSpec, sweep_dir: Path) -> float:
    """Train ``trial``'s run and return its val ``spec.metric`` (module docstring).

    Raises:
      TrialFailed: the values or the run failed (the reason is the trial's ``error``).
      KeyboardInterrupt: SIGINT; the run saved a checkpoint and the trial is requeued.
    """
    import optuna

    from jaxdqn.program.run import loop

    values = {p.key: p.suggest(trial) for p in spec.space}
    old = trial.user_attrs.get("run_dir")
    resume = old is not None and _has_checkpoint(sweep_dir / old)
    rel = old if resume else f"{TRIALS}/trial_{trial.number:04d}"
    run_dir = sweep_dir / rel
    trial.set_user_attr("run_dir", rel)
    overrides = trial_overrides(spec, values)
    trial.set_user_attr("overrides", overrides)
    log_path = sweep_dir / "logs" / f"trial_{trial.number:04d}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        if not resume and run_dir.exists() and any(run_dir.iterdir()):
            raise ConfigError(f"{run_dir}: already holds a run (not this trial's); not touched")
        cfg = config_lib.load(spec.config, overrides)
        with (
            open(log_path, "a") as log,
            contextlib.redirect_stdout(log),
            contextlib.redirect_stderr(log),
        ):
            trainer = loop.Trainer(cfg, run_dir, resume=resume, progress=False)
            reported: list[tuple[int, float]] = []
            if spec.pruner is not None:
                shape = (ranked_members(cfg), cfg.train.num_seeds, cfg.train.epochs)
                trainer.on_epoch = _pruning(trial, spec, shape, reported, run_dir)
            summary = trainer.run()
    except loop.Stopped:
        epoch, value = reported[-1]
        note = f"pruned after epoch {epoch} (val {spec.metric} {value:.4f})"
        trial.set_user_attr("error", note)
        raise optuna.TrialPruned(note) from None
    except KeyboardInterrupt:
        requeue(trial.study, trial)
        raise
    except (ConfigError, DataError, loop.TrainingError, CheckpointError) as e:
        trial.set_user_attr("error", f"{type(e).__name__}: {e}")
        raise TrialFailed(str(e)) from None
    val = summary["val"]
    if spec.metric not in val:
        raise SweepError(
            f"metric {spec.metric!r}: not a val metric of the runs (they have "
            f"{', '.join(sorted(val))})"
        )
    value = float(val[spec.metric])
    trial.set_user_attr("val", val)
    trial.set_user_attr("best_epoch", summary["best_epoch"])
    if "winner" in summary:  # a population: the trial's value is its winner's
        trial.set_user_attr("member", summary["winner"])
    if not math.isfinite(value):
        trial.set_user_attr("error", f"val {spec.metric} is {value}")
        raise TrialFailed(f"val {spec.metric} is {value}")
    return value


def epoch_score(record: dict[str, Any], metric: str, members: int, seeds: int) -> float:
    """The val score of one epoch's log ``record`` that the pruner compares: the mean over
    seeds of ``val_<metric>``; a population (``members`` > 1, ``seeds`` each, member-major):
    the best member's mean val Sharpe, which the run's own checkpoint selection ranks (one
    member: its mean over seeds)."""
    if members <= 1:
        return float(record[f"val_{metric}"])
    sharpes = np.asarray(record["val_sharpe_seeds"], np.float64).reshape(members, seeds)
    return float(np.nanmax(np.nanmean(sharpes, axis=1)))


def _pruning(
    trial: Any,
    spec: SweepSpec,
    shape: tuple[int, int, int],
    reported: list[tuple[int, float]],
    run_dir: Path,
) -> Callable[[dict[str, Any]], bool]:
    """The trainer's ``on_epoch``: report the epoch's score (appended to ``reported``, as
    ``(epoch, score)``); True (stop) when the pruner says so, before the run's last epoch
    (after it, stopping would save nothing but lose the finished run's selection and report).
    ``shape``: (members, seeds, epochs).
    A resumed run's first call reports the epochs its log already holds first (the trainer
    has truncated the log to its checkpoint by then), so the pruner sees the whole run."""

    def report(record: dict[str, Any]) -> None:
        if f"val_{spec.metric}" not in record:
            return
        value = epoch_score(record, spec.metric, *shape[:2])
        if math.isfinite(value):  # (Optuna's pruners skip non-finite values too)
            trial.report(value, int(record["epoch"]))
            reported.append((int(record["epoch"]), value))

    replayed = False  # the log is read once, at the first call

    def on_epoch(record: dict[str, Any]) -> bool:
        nonlocal replayed
        if not replayed:
            replayed = True
            for past in read_metrics(run_dir):
                if past["epoch"] < record["epoch"] and not past.get("fault"):
                    report(past)
        report(record)
        judged = bool(reported) and reported[-1][0] == record["epoch"] < shape[2]
        return judged and trial.should_prune()

    return on_epoch


def work(
    study: Any,
    spec: SweepSpec,
    sweep_dir: Path,
    *,
    poll_s: float = 2.0,
    say: Callable[[str], None] = print,
) -> None:
    """Train trials until ``spec.trials`` have completed and no other worker is still
    running one (then return: the finale may run).

    Each round fails the trials whose worker died (their heartbeat is older than the grace
    period; they are requeued), then starts the next trial (a requeued one first) unless the
    completed and running trials already make ``spec.trials``, in which case it waits.

    Raises:
      SweepError: ``spec.failures_allowed`` trials have failed (bad values or runs), or the
        metric is not one the runs report.
    """
    import optuna

    def objective(trial: Any) -> float:
        start = time.time()
        resumes = trial.user_attrs.get("resumes")
        again = f", resuming trial {resumes}'s run" if resumes is not None else ""
        say(f"trial {trial.number}: started{again}")
        try:
            value = run_trial(trial, spec, sweep_dir)
        except TrialFailed as e:
            say(f"trial {trial.number}: failed: {e}")
            raise
        except optuna.TrialPruned as e:
            c = counts(study)
            done = f"[{c.finished + 1}/{spec.trials} finished]"
            say(f"trial {trial.number} ({_values(trial.params)}): {e} in "
                f"{time.time() - start:.0f} s {done}")  # fmt: skip
            raise
        c = counts(study)
        say(
            f"trial {trial.number} ({_values(trial.params)}): val {spec.metric} {value:.4f} "
            f"in {time.time() - start:.0f} s [{c.finished + 1}/{spec.trials} finished]"
        )
        return value

    while True:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
        c = counts(study)
        if c.failed >= spec.failures_allowed:
            errors = [t.user_attrs.get("error") for t in study.get_trials(deepcopy=False)]
            last = next((e for e in reversed(errors) if e), "no error recorded")
            raise SweepError(
                f"{c.failed} trials failed (max_failed {spec.failures_allowed}); the last: {last}"
            )
        if c.finished >= spec.trials and c.running == 0:
            return
        if c.finished + c.running >= spec.trials:
            time.sleep(poll_s)  # the last trials run in other workers (or their worker died)
            continue
        study.optimize(objective, n_trials=1, catch=(TrialFailed,))


def _values(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in
                     params.items())  # fmt: skip
