"""Plateau detection (O5) and the decisions it drives (O4 branch reset, O6 rewind).

Host-side and pure: :func:`observe` maps ``(PlateauState, epoch metrics)`` to a new state and a
:class:`PlateauReport`; nothing here touches devices, files or clocks. The epoch loop acts on
``report.action`` and, after a rewind it actually performed, calls :func:`after_rewind`.

Per epoch ``e`` with validation Sharpe ``s_e`` and the four per-branch Q-gap EMAs ``g_e[b]``
(branches direction, magnitude, order, urgency):

* velocity ``v_e[b] = g_e[b] − g_{e−1}[b]``; branch ``b`` is *frozen* when
  ``|v_e[b]| < ε_v · max(|g_{e−1}[b]|, 1e-12)`` (``plateau_velocity_eps``, relative: Q's units
  are the reward scale's, so an absolute ε would mean different things in different runs);
* the **Q-gap detector** fires when every branch is frozen;
* the **Sharpe detector** fires when ``|s_e − s_{e−1}| < ε_s · SE`` (``plateau_sharpe_eps``)
  with SE the standard error of the val Sharpe (:func:`jaxdqn.evaluation.metrics.sharpe_se`;
  ≈ 0.65 on 600 daily bars, so a fixed 0.01 could never tell a plateau from noise);
* ``plateau_epochs`` counts consecutive epochs on which either detector fired and returns to 0
  on the first epoch on which neither did;
* action ``"reset_branches"`` (O4) exactly when ``plateau_epochs == plateau_threshold`` and
  ``branch_reset`` is on; ``"rewind"`` (O6) exactly when ``plateau_epochs ==
  plateau_threshold + 3`` and ``rewind`` is on. Because the actions fire on equality, a plateau
  that persists past ``threshold + 3`` without a rewind (switch off) triggers nothing more.

Neither detector runs on the first epoch, nor on the first epoch after a rewind (no previous
values: :func:`after_rewind` clears them). The comparisons are strict, so an ε of 0 disables its
detector.

Non-finite values. A Sharpe ratio is NaN when the validation returns have zero variance (e.g. a
policy that stays flat). Two NaN Sharpes in a row are treated as identical — the agent produced
no usable signal twice, which is a plateau — so the Sharpe detector fires; NaN next to a finite
value does not fire. Equal infinities count as identical too. A NaN Q-gap gives a NaN velocity,
which is never below ε, so that branch is not frozen (non-finite training is the fault handler's
business, not a plateau).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, Literal

from jaxdqn.branches import NUM_BRANCHES
from jaxdqn.config import TrainConfig

__all__ = [
    "PlateauReport",
    "PlateauState",
    "after_rewind",
    "observe",
]

Fired = Literal["none", "q_gap", "sharpe", "both"]
Action = Literal["none", "reset_branches", "rewind"]


@dataclasses.dataclass(frozen=True)
class PlateauState:
    """Host-side plateau state carried from epoch to epoch, inside the run state saved with
    each checkpoint (:class:`jaxdqn.program.run.run_state.RunState`), which keeps the O4/O6
    counters nowhere else.

    Attributes:
      prev_sharpe: last epoch's validation Sharpe (``None`` before the first observation and
        after a rewind; may be NaN).
      prev_q_gap: last epoch's four per-branch Q-gap EMAs, or ``None``.
      plateau_epochs: consecutive epochs on which a detector fired.
      rewinds: rewinds performed (incremented by :func:`after_rewind`).
      resets: branch-moment resets requested (incremented by :func:`observe` when it returns the
        ``"reset_branches"`` action).
    """

    prev_sharpe: float | None = None
    prev_q_gap: tuple[float, ...] | None = None
    plateau_epochs: int = 0
    rewinds: int = 0
    resets: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly dict (for the checkpoint's host state); NaN stays a float NaN."""
        d = dataclasses.asdict(self)
        if self.prev_q_gap is not None:
            d["prev_q_gap"] = list(self.prev_q_gap)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PlateauState:
        """Inverse of :meth:`to_dict`."""
        q = d.get("prev_q_gap")
        s = d.get("prev_sharpe")
        return cls(
            prev_sharpe=None if s is None else float(s),
            prev_q_gap=None if q is None else tuple(float(x) for x in q),
            plateau_epochs=int(d.get("plateau_epochs", 0)),
            rewinds=int(d.get("rewinds", 0)),
            resets=int(d.get("resets", 0)),
        )


@dataclasses.dataclass(frozen=True)
class PlateauReport:
    """What :func:`observe` found this epoch.

    Attributes:
      fired: which detector fired: ``"none"``, ``"q_gap"``, ``"sharpe"`` or ``"both"``.
      frozen: per branch, the relative velocity below ``plateau_velocity_eps`` (all ``False``
        when there is no previous Q-gap).
      velocity: per-branch Q-gap change since the previous epoch (NaN when there is none).
      sharpe_delta: ``val_sharpe − prev_sharpe`` (NaN when there is none or either is NaN).
      plateau_epochs: the counter after this epoch.
      action: ``"none"``, ``"reset_branches"`` (O4) or ``"rewind"`` (O6).
    """

    fired: Fired
    frozen: tuple[bool, ...]
    velocity: tuple[float, ...]
    sharpe_delta: float
    plateau_epochs: int
    action: Action

    def to_dict(self) -> dict[str, Any]:
        """Flat dict for the per-epoch log line (lists, not tuples)."""
        return {
            "plateau_fired": self.fired,
            "plateau_frozen": list(self.frozen),
            "plateau_velocity": list(self.velocity),
            "plateau_sharpe_delta": self.sharpe_delta,
            "plateau_epochs": self.plateau_epochs,
            "plateau_action": self.action,
        }


def _same_sharpe(prev: float, cur: float, eps: float) -> bool:
    """The Sharpe detector: ``|cur − prev| < eps``, with NaN≡NaN and equal infinities identical."""
    if math.isnan(prev) or math.isnan(cur):
        return math.isnan(prev) and math.isnan(cur)
    if math.isinf(prev) or math.isinf(cur):
        return prev == cur
    return abs(cur - prev) < eps


def observe(
    state: PlateauState,
    val_sharpe: float,
    q_gap: Sequence[float],
    cfg: TrainConfig,
    *,
    sharpe_se: float,
) -> tuple[PlateauState, PlateauReport]:
    """One epoch of O5 detection and the O4/O6 decision (see the module docstring).

    Args:
      state: the state after the previous epoch.
      val_sharpe: this epoch's validation Sharpe (may be NaN).
      q_gap: the four per-branch Q-gap EMAs at the end of this epoch (any float sequence or a
        ``[4]`` array; converted to Python floats).
      cfg: ``plateau_threshold``, ``plateau_velocity_eps``, ``plateau_sharpe_eps``,
        ``branch_reset`` and ``rewind`` are read.
      sharpe_se: the standard error of ``val_sharpe`` (the Sharpe detector's unit).

    Returns:
      ``(new_state, report)``. ``new_state.resets`` is incremented when the action is
      ``"reset_branches"``; a ``"rewind"`` changes nothing until the caller has rewound and
      calls :func:`after_rewind`.
    """
    gap = tuple(float(g) for g in q_gap)
    if len(gap) != NUM_BRANCHES:
        raise ValueError(f"q_gap: need {NUM_BRANCHES} per-branch values, got {len(gap)}")
    sharpe = float(val_sharpe)

    if state.prev_q_gap is None:
        velocity = (math.nan,) * NUM_BRANCHES
        frozen = (False,) * NUM_BRANCHES
    else:
        velocity = tuple(g - p for g, p in zip(gap, state.prev_q_gap, strict=True))
        # abs(nan) < eps is False: a NaN velocity never counts as frozen.
        eps = cfg.plateau_velocity_eps
        frozen = tuple(
            abs(v) < eps * max(abs(p), 1e-12)
            for v, p in zip(velocity, state.prev_q_gap, strict=True)
        )
    q_fired = state.prev_q_gap is not None and all(frozen)

    if state.prev_sharpe is None:
        sharpe_delta, s_fired = math.nan, False
    else:
        sharpe_delta = sharpe - state.prev_sharpe
        s_fired = _same_sharpe(state.prev_sharpe, sharpe, cfg.plateau_sharpe_eps * sharpe_se)

    fired: Fired = {
        (False, False): "none",
        (True, False): "q_gap",
        (False, True): "sharpe",
        (True, True): "both",
    }[(q_fired, s_fired)]
    plateau_epochs = state.plateau_epochs + 1 if fired != "none" else 0

    action: Action = "none"
    if cfg.branch_reset and plateau_epochs == cfg.plateau_threshold:
        action = "reset_branches"
    elif cfg.rewind and plateau_epochs == cfg.plateau_threshold + 3:
        action = "rewind"

    new_state = dataclasses.replace(
        state,
        prev_sharpe=sharpe,
        prev_q_gap=gap,
        plateau_epochs=plateau_epochs,
        resets=state.resets + (action == "reset_branches"),
    )
    report = PlateauReport(
        fired=fired,
        frozen=frozen,
        velocity=velocity,
        sharpe_delta=sharpe_delta,
        plateau_epochs=plateau_epochs,
        action=action,
    )
    return new_state, report


def after_rewind(state: PlateauState) -> PlateauState:
    """State after an O6 rewind: counter to 0, one more rewind, previous values forgotten.

    The previous Sharpe and Q-gaps belong to the abandoned trajectory; comparing the restored
    checkpoint's metrics against them would measure the jump, not a plateau, so the first epoch
    after a rewind runs no detector.
    """
    return dataclasses.replace(
        state, prev_sharpe=None, prev_q_gap=None, plateau_epochs=0, rewinds=state.rewinds + 1
    )
