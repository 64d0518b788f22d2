"""The offset table of the four branches computed together (``kernels.fused``, M3–M6).

:func:`jaxdqn.model.fused_branches.fused_branches` computes every branch's value and gate
path in one matrix product and reads each branch's columns back by this one table; the order
it computes the branches in and the order it returns them in are named here too, so the
orderings cannot drift apart.
"""

from __future__ import annotations

from jaxdqn.branches import BRANCH_KEYS

__all__ = ["FROM_FUSED", "FUSED_ORDER", "fused_columns", "fused_order"]

FUSED_ORDER = ("branch_direction", "branch_order", "branch_urgency", "branch_magnitude")
"""The fused computation's branch order under M5: magnitude last, so that M5 can condition it
on the direction's output after one pass over the other three."""

FROM_FUSED = tuple(FUSED_ORDER.index(k) for k in BRANCH_KEYS)
"""Position in :data:`FUSED_ORDER` of each branch of :data:`BRANCH_KEYS` (the output order)."""


def fused_order(m5: bool) -> tuple[str, ...]:
    """The order the fused branches are computed in: :data:`FUSED_ORDER` with M5 (magnitude's
    pass comes after the direction's), else the output order :data:`BRANCH_KEYS` itself, so
    the heads' ``[B, 4, 3, N]`` result is the model's output with no reordering copy."""
    return FUSED_ORDER if m5 else BRANCH_KEYS


def fused_columns(ah: int, order: tuple[str, ...] = FUSED_ORDER) -> dict[tuple[str, str], slice]:
    """The offset table of the fused first layer: ``(path, branch) -> its columns`` of the
    ``[B, 8·AH]`` pre-activations, the value paths of the branches in ``order``
    (:func:`fused_order`) then their gate paths, ``AH`` columns each (in insertion order,
    which is the column order)."""
    paths = [(path, k) for path in ("value", "gate") for k in order]
    return {pk: slice(i * ah, (i + 1) * ah) for i, pk in enumerate(paths)}
