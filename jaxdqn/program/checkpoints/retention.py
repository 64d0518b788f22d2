"""Which checkpoints a :class:`~jaxdqn.program.checkpoints.checkpoint.Checkpointer` keeps (O6):
the ``keep_latest`` most recent steps, the ``keep_best`` best by the saved val Sharpe, and for a
population each member's best step by its own metric (issue 32), as an orbax preservation
policy and as :func:`kept` (the same rule, known before a save).

The metrics item of a step is ``{"val_sharpe": metric}``, with ``"members": [metric_m, ...]``
for a population. ``score(m) = m`` for finite ``m`` and ``−inf`` otherwise, so a NaN (or
infinite) Sharpe is never preferred to a finite one; ties go to the later step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orbax.checkpoint as ocp

__all__ = [
    "best_first",
    "kept",
    "metrics_item",
    "metrics_score",
    "policy",
    "saved_members",
    "saved_metric",
    "score",
]

METRIC_KEY = "val_sharpe"
MEMBERS_KEY = "members"


def score(metric: Any) -> float:
    """Ranking key of a metric: the value itself when finite, ``-inf`` otherwise (NaN is worst)."""
    try:
        x = float(metric)
    except (TypeError, ValueError):
        return -math.inf
    return x if math.isfinite(x) else -math.inf


def metrics_score(metrics: Any) -> float:
    # Called by orbax's BestN on whatever the metrics file held; it must never raise.
    if not isinstance(metrics, dict):
        return -math.inf
    return score(metrics.get(METRIC_KEY, math.nan))


def saved_metric(metrics: Any) -> float:
    """The metric as saved (NaN when the metrics item is missing or not a number)."""
    try:
        return float(metrics[METRIC_KEY])
    except (KeyError, TypeError, ValueError):
        return math.nan


def _member_metric(metrics: Any, m: int) -> float:
    """Member ``m``'s metric as saved (NaN when missing)."""
    try:
        return float(metrics[MEMBERS_KEY][m])
    except (KeyError, IndexError, TypeError, ValueError):
        return math.nan


def _member_score(m: int) -> Callable[[Any], float]:
    # orbax's BestN calls this on whatever the metrics file held; it must never raise.
    return lambda metrics: score(_member_metric(metrics, m))


def best_first(metrics: dict[int, float]) -> list[int]:
    """Steps from best to worst by ``(score(metric), step)``: ties go to the later step."""
    return sorted(metrics, key=lambda s: (score(metrics[s]), s), reverse=True)


def saved_members(metrics: Any) -> list[float]:
    """Every member's metric as saved (empty without members)."""
    held = metrics.get(MEMBERS_KEY) if isinstance(metrics, Mapping) else None
    return [_member_metric(metrics, m) for m in range(len(held or []))]


def metrics_item(metric: float, members: Sequence[float] | None) -> dict[str, Any]:
    """The metrics item of a step (module docstring)."""
    item: dict[str, Any] = {METRIC_KEY: metric}
    if members is not None:
        item[MEMBERS_KEY] = list(members)
    return item


def policy(keep_latest: int, keep_best: int, members: int) -> Any:
    """The orbax preservation policy of the module docstring."""
    policies = ocp.checkpoint_managers
    best = lambda fn, n: policies.BestN(
        get_metric_fn=fn, reverse=False, n=n, keep_checkpoints_without_metrics=False
    )
    return policies.AnyPreservationPolicy(
        [
            policies.LatestN(n=keep_latest),
            best(metrics_score, keep_best),
            *(best(_member_score(m), 1) for m in range(members)),
        ]
    )


def kept(
    steps: Sequence[int],
    metrics: Mapping[int, float],
    member_metrics: Sequence[Mapping[int, float]],
    keep_latest: int,
    keep_best: int,
) -> list[int]:
    """The steps :func:`policy` keeps of ``steps`` (ascending) with these metrics."""
    out = set(sorted(steps)[-keep_latest:]) | set(best_first(dict(metrics))[:keep_best])
    out |= {best_first(dict(mine))[0] for mine in member_metrics if mine}
    return sorted(out)
