"""The Optuna study of a sweep: its storage, how workers open it, and the trials' states.

The storage is an RDB: a SQLite file by default (one machine, any number of worker processes),
or any SQLAlchemy URL (``postgresql://user:pw@host/db``: workers on many machines). Every
worker runs the same command; the first creates the study and records the sweep file's
identity (:meth:`SweepSpec.identity`) in it, and a worker whose sweep file differs is refused.

Workers beat a heartbeat into the storage while a trial runs. A trial whose worker died
(SIGKILL, a lost machine) stops beating; once its heartbeat is older than the grace period any
worker marks it failed and :func:`requeue` puts it back in the queue with the same values and
its run directory, which the next worker resumes from the run's last checkpoint. A trial
interrupted with SIGINT is requeued the same way.
"""

from __future__ import annotations

import os
import re
import socket
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from jaxdqn.config import ConfigError
from jaxdqn.program.sweep.space import SweepSpec

__all__ = [
    "MAX_RETRIES",
    "Counts",
    "SweepError",
    "counts",
    "default_storage",
    "open_study",
    "redact",
    "requeue",
    "trial_rows",
    "worker_seed",
]

MAX_RETRIES = 3
"""Times one trial is requeued after its worker died before it counts as failed for good."""


class SweepError(RuntimeError):
    """The search cannot go on (too many failed trials, a study in another state); one line."""


def default_storage(sweep_dir: Path) -> str:
    return f"sqlite:///{(Path(sweep_dir) / 'study.db').resolve()}"


def redact(url: str) -> str:
    """``url`` without its password (written to files and logs)."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


def requeue(study: Any, trial: Any) -> None:
    """Put a trial whose worker died (or was interrupted) back in the queue: the same values,
    its run directory to resume, and the count of retries so far (at most
    :data:`MAX_RETRIES`)."""
    attrs = trial.user_attrs
    retries = int(attrs.get("retries", 0))
    if retries >= MAX_RETRIES or "run_dir" not in attrs:
        return
    study.enqueue_trial(
        trial.params,
        user_attrs={"resumes": trial.number, "run_dir": attrs["run_dir"], "retries": retries + 1},
    )


def _storage(url: str, heartbeat_s: int) -> Any:
    import optuna

    kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        # several processes write one file: wait for its lock instead of failing at once
        kwargs["engine_kwargs"] = {"connect_args": {"timeout": 60}}
    try:
        with warnings.catch_warnings():  # (heartbeats are "experimental" in Optuna 4.9-5.x)
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.storages.RDBStorage(
                url,
                heartbeat_interval=heartbeat_s,
                grace_period=2 * heartbeat_s,
                heartbeat_stale_trial_callback=requeue,
                **kwargs,
            )
    except Exception as e:  # a bad URL, a missing driver, a server that does not answer
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"--storage {redact(url)}: cannot open it ({first})") from None


def worker_seed(seed: int) -> int:
    """The sampler seed of this worker: ``seed`` mixed with the host and process id, so that
    workers of one study draw different values (workers seeded alike would propose the same
    trials; a search over several workers is not repeatable draw by draw anyway)."""
    import numpy as np

    host = int.from_bytes(socket.gethostname().encode()[:8].ljust(8, b"\0"), "little")
    return int(np.random.SeedSequence([seed, host, os.getpid()]).generate_state(1)[0])


def _sampler(spec: SweepSpec) -> Any:
    import optuna

    seed = worker_seed(spec.seed)
    if spec.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def _pruner(spec: SweepSpec) -> Any:
    """Optuna's pruner for ``spec.pruner`` (None: never prune). Steps are epochs (1-based), so
    ``warmup`` W epochs never pruned after is Optuna's ``n_warmup_steps`` W + 1."""
    import optuna

    p = spec.pruner
    if p is None:
        return optuna.pruners.NopPruner()
    if p.type == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=p.startup, n_warmup_steps=p.warmup + 1)
    bound = "lower" if spec.direction == "maximize" else "upper"
    return optuna.pruners.ThresholdPruner(**{bound: p.worse_than}, n_warmup_steps=p.warmup + 1)


def open_study(spec: SweepSpec, url: str, *, resume: bool, heartbeat_s: int = 10) -> Any:
    """The study ``spec.study`` in the storage at ``url``: created by the first worker, joined
    by the others (they may start together); with ``resume`` it must exist already.

    Raises:
      ConfigError: the storage cannot be opened; ``resume`` and no such study; the study was
        started from another sweep file (other space, base config, metric or sampler).
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)  # failed trials: the worker says why
    storage = _storage(url, heartbeat_s)
    names = {s.study_name for s in optuna.get_all_study_summaries(storage)}
    if resume and spec.study not in names:
        raise ConfigError(
            f"--resume: no study {spec.study!r} in {redact(url)} (studies there: "
            f"{', '.join(sorted(names)) or 'none'})"
        )
    study = optuna.create_study(
        storage=storage,
        study_name=spec.study,
        direction=spec.direction,
        sampler=_sampler(spec),
        pruner=_pruner(spec),
        load_if_exists=True,
    )
    identity = study.user_attrs.get("spec_identity")
    if identity is None:
        study.set_user_attr("spec_identity", spec.identity())
        study.set_user_attr("spec", spec.to_json())
    elif identity != spec.identity():
        raise ConfigError(
            f"study {spec.study!r} in {redact(url)} was started from another sweep file "
            "(its space, base config, overrides, metric or sampler differ); give this one "
            "another study name"
        )
    return study


class Counts(NamedTuple):
    """The study's trials by state (``failed``: those not requeued, i.e. bad values or runs
    that could not go on; ``died``: failed because their worker died or was interrupted;
    ``pruned``: stopped early by the sweep's pruner)."""

    complete: int
    running: int
    waiting: int
    failed: int
    died: int
    pruned: int = 0

    @property
    def finished(self) -> int:
        """The trials that count toward the budget ``trials``: complete or pruned."""
        return self.complete + self.pruned


def counts(study: Any) -> Counts:
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    resumed = {t.user_attrs.get("resumes") for t in trials}
    state = lambda s: [t for t in trials if t.state == s]
    failed = state(TrialState.FAIL)
    return Counts(
        complete=len(state(TrialState.COMPLETE)),
        running=len(state(TrialState.RUNNING)),
        waiting=len(state(TrialState.WAITING)),
        failed=sum(1 for t in failed if t.number not in resumed),
        died=sum(1 for t in failed if t.number in resumed),
        pruned=len(state(TrialState.PRUNED)),
    )


def trial_rows(study: Any) -> list[Mapping[str, Any]]:
    """Every trial as a JSON row: number, state, values, val score (complete trials only: the
    run's selected val metric), run directory, what it resumed, its error or pruning note, and
    its per-epoch val scores (``epochs``: epoch → score, what the pruner saw)."""
    rows = []
    for t in study.get_trials(deepcopy=False):
        rows.append(
            {
                "number": t.number,
                "state": t.state.name.lower(),
                "params": dict(t.params),
                "value": t.value if t.state.name == "COMPLETE" else None,  # (a pruned: in epochs)
                "run_dir": t.user_attrs.get("run_dir"),
                "resumes": t.user_attrs.get("resumes"),
                "error": t.user_attrs.get("error"),
                "epochs": {int(k): v for k, v in sorted(t.intermediate_values.items())},
            }
        )
    return rows
