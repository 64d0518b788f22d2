"""The action layout: four branches of three choices each, and the typed :class:`Action`.

=========== ====================================== =================================
branch      choice 0 / 1 / 2                        used by
=========== ====================================== =================================
direction   short / flat / long                     target sign
magnitude   low / mid / high level                  ``env.magnitude_levels``
order       market / limit / limit-then-market      fill rule (E1)
urgency     low / mid / high                        fill price or limit depth (E1)
=========== ====================================== =================================

The one definition of these constants; every other module imports them from here.
"""

from __future__ import annotations

from typing import NamedTuple

import chex

__all__ = [
    "ACTION_NAMES",
    "BRANCHES",
    "BRANCH_KEYS",
    "NUM_ACTIONS",
    "NUM_BRANCHES",
    "NUM_Q",
    "Action",
]

BRANCHES: tuple[str, ...] = ("direction", "magnitude", "order", "urgency")
NUM_BRANCHES = len(BRANCHES)
NUM_ACTIONS = 3
NUM_Q = NUM_BRANCHES * NUM_ACTIONS
#: Parameter-tree names of the branches' sub-networks (M3).
BRANCH_KEYS: tuple[str, ...] = tuple(f"branch_{b}" for b in BRANCHES)
#: Readable names of each branch's choices, index = action.
ACTION_NAMES: dict[str, tuple[str, str, str]] = {
    "direction": ("short", "flat", "long"),
    "magnitude": ("low", "mid", "high"),
    "order": ("market", "limit", "limit_then_market"),
    "urgency": ("low", "mid", "high"),
}


class Action(NamedTuple):
    """What the agent sends to the environment for one decision (leading axes allowed).

    Attributes:
      choice: int32 ``[..., NUM_BRANCHES]``, one choice in ``0..NUM_ACTIONS-1`` per branch.
      scale: float32 ``[...]``, the A3 position scale in (0, 1] (1 when sizing is off).
    """

    choice: chex.Array
    scale: chex.Array
