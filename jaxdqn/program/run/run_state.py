"""The host side of a run that a checkpoint must carry for a resume to continue bit-exactly.

The device side is the train state (:class:`jaxdqn.agent.state.TrainState`); everything else
that decides the future — the epoch and schedule position, the plateau detector, the best
checkpoint so far, the fault counters, the host EMA of the validation Q spread and the metrics
of an interrupted epoch — is one :class:`RunState`, saved as JSON with every checkpoint.
Each counter lives in one place: rewinds and branch resets in the plateau state
(:class:`jaxdqn.program.run.plateau.PlateauState`), which decides them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from jaxdqn.program.run.plateau import PlateauState

__all__ = ["RunState"]


@dataclasses.dataclass
class RunState:
    """Host run state (mutable; the epoch loop updates it in place).

    Attributes:
      epoch: the next epoch to run (0-based; equals the number of finished epochs).
      iteration: iterations already run in that epoch (> 0 only for an interrupted epoch).
      total_iterations: iterations run so far (monotonic; the checkpoint step).
      cycle_start: epoch at which the current SGDR cycle began (O2; moved by a rewind).
      best_sharpe: best validation Sharpe so far as ranked by ``checkpoint.score``
        (``-inf`` before the first epoch).
      best_epoch, best_step: epoch and checkpoint step of that Sharpe (-1 before).
      consecutive_faults: epochs in a row that ended non-finite.
      fault_events: non-finite epochs in the whole run.
      eval_q_std_ema: ``[S]`` host EMA of the validation Q spread (M14), ``None`` before the
        first validation.
      plateau: O5 detector state with the O4/O6 counters.
      partial: per-iteration metrics ``{name: nested lists [i, S, ...]}`` of an interrupted
        epoch's first part, or ``None``.
      wall_time: seconds of training so far (across resumes).
    """

    epoch: int = 0
    iteration: int = 0
    total_iterations: int = 0
    cycle_start: int = 0
    best_sharpe: float = -math.inf
    best_epoch: int = -1
    best_step: int = -1
    consecutive_faults: int = 0
    fault_events: int = 0
    eval_q_std_ema: list[float] | None = None
    plateau: PlateauState = dataclasses.field(default_factory=PlateauState)
    partial: dict[str, Any] | None = None
    wall_time: float = 0.0

    @property
    def rewinds(self) -> int:
        """O6 rewinds performed (kept by the plateau state)."""
        return self.plateau.rewinds

    @property
    def resets(self) -> int:
        """O4 branch-moment resets performed (kept by the plateau state)."""
        return self.plateau.resets

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable dict (``-inf`` best Sharpe as ``None``; NaN stays NaN)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["best_sharpe"] = self.best_sharpe if math.isfinite(self.best_sharpe) else None
        d["plateau"] = self.plateau.to_dict()
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RunState:
        """Inverse of :meth:`to_json`."""
        d = dict(d)
        d["best_sharpe"] = -math.inf if d.get("best_sharpe") is None else d["best_sharpe"]
        d["plateau"] = PlateauState.from_dict(d.get("plateau") or {})
        return cls(**d)
