"""One epoch's line of ``metrics.jsonl``: the iterations' metrics, reduced and put together
with the validation, schedule, plateau and run counters.

The per-iteration metrics of an epoch are collected by :class:`EpochMetrics`; when an epoch is
interrupted they travel in the run state (``RunState.partial``) so the resumed epoch's means
cover all of its iterations.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdqn.evaluation.walk import EvalResult
from jaxdqn.program.run.plateau import PlateauReport
from jaxdqn.program.run.run_state import RunState
from jaxdqn.program.run.schedule import EpochSchedule

__all__ = ["EpochMetrics", "epoch_means", "epoch_record", "member_means"]


class EpochMetrics:
    """Per-iteration metrics ``{name: [S, ...]}`` of one epoch, in iteration order.

    Args:
      earlier: the metrics of the epoch's iterations run before an interruption
        (``RunState.partial``: nested lists ``[i, S, ...]``), or ``None``.
    """

    def __init__(self, earlier: dict[str, Any] | None):
        self._earlier = {k: np.asarray(v) for k, v in (earlier or {}).items()}
        self._records: list[dict[str, jax.Array]] = []

    def append(self, metrics: dict[str, jax.Array]) -> None:
        """Add one iteration's (device) metrics; nothing is copied to the host here."""
        self._records.append(metrics)

    def stacked(self) -> dict[str, np.ndarray]:
        """``{name: [I, S, ...]}`` over every iteration of the epoch so far (``{}`` if none)."""
        now = (
            jax.device_get(jax.tree.map(lambda *xs: jnp.stack(xs), *self._records))
            if self._records
            else {}
        )
        if not self._earlier:
            return now
        if not now:
            return self._earlier
        return {k: np.concatenate([self._earlier[k], np.asarray(v)]) for k, v in now.items()}

    def to_json(self) -> dict[str, Any]:
        """:meth:`stacked` as nested lists (NaN stays NaN), for ``RunState.partial``."""
        return {k: v.tolist() for k, v in self.stacked().items()}


def epoch_means(stacked: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Means over the epoch's iterations (axis 0) in float64, ignoring non-finite values (the
    warm-up NaNs); NaN where an entry was never finite. The seed axis is kept."""
    out = {}
    for k, v in stacked.items():
        v = np.asarray(v, np.float64)
        with np.errstate(all="ignore"):
            finite = np.isfinite(v)
            s = np.where(finite, v, 0.0).sum(axis=0)
            c = finite.sum(axis=0)
            out[k] = np.where(c > 0, s / np.maximum(c, 1), np.nan)
    return out


def member_means(results: list[EvalResult], members: int, *, blank: bool = False) -> list[float]:
    """Each member's mean val Sharpe over its seeds (agents member-major); empty without a
    population (``members`` 0); all NaN when ``blank`` (a rewound state's checkpoint)."""
    if not members or blank:
        return [math.nan] * members
    sharpes = np.asarray([r.metrics["sharpe"] for r in results], dtype=np.float64)
    return [float(v) for v in sharpes.reshape(members, -1).mean(axis=1)]


def epoch_record(
    run: RunState,
    means: dict[str, np.ndarray],
    results: list[EvalResult],
    sched: EpochSchedule,
    rep: PlateauReport,
    **rest: Any,
) -> dict[str, Any]:
    """The log line of the epoch that ``run`` has just finished.

    Args:
      run: the run state after the epoch (``epoch`` already counts it).
      means: :func:`epoch_means` of the epoch's iteration metrics, ``[S, ...]`` each (the seed
        axis is dropped for one seed); ``finite`` is left out.
      results: every seed's validation walk; ``val_<metric>`` is the mean over seeds and
        ``val_sharpe_seeds`` lists the seeds' Sharpes when there are several.
      sched: the epoch's schedule (``lr``, ``restart``).
      rep: the epoch's plateau report.
      rest: further entries appended last (``checkpoints``, ``best_epoch``, throughputs).
    """
    num_seeds = len(results)
    record: dict[str, Any] = {"epoch": run.epoch, "wall_time": run.wall_time}
    record.update(
        {
            k: (np.squeeze(v, 0) if num_seeds == 1 else v).tolist()
            for k, v in means.items()
            if k != "finite"
        }
    )
    val = {k: float(np.nanmean([r.metrics[k] for r in results])) for k in results[0].metrics}
    record.update({f"val_{k}": v for k, v in val.items()})
    if num_seeds > 1:
        record["val_sharpe_seeds"] = [r.metrics["sharpe"] for r in results]
    record.update(
        lr=sched.lr,
        restart=sched.restart,
        kappa=sched.kappa,
        eval_q_std=run.eval_q_std_ema,
        plateau_epochs=rep.plateau_epochs,
        detector=rep.fired,
        frozen=list(rep.frozen),
        q_gap_velocity=list(rep.velocity),
        action=rep.action,
        rewinds=run.rewinds,
        branch_resets=run.resets,
        fault_events=run.fault_events,
        **rest,
    )
    return record
