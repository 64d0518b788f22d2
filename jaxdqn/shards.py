"""Batch-global reductions for one agent split over a ``"data"`` mesh axis.

One agent data-parallel over ``D`` devices (``train.mesh``) runs the same per-device program
inside ``shard_map``: every device holds ``E/D`` environments, a replay shard of ``C/D`` slots and
draws ``B/D`` rows per update. Wherever the single-device program reduces over the batch or the
environments — M8's centring mean, L5's ranks, L2's next-action sample, the L7/M13/M14
statistics, the metrics — it calls a :class:`Shards` method instead of ``jnp`` directly, so that
the reduction covers the global batch and every device computes the same replicated values:

* ``Shards()`` (one device, the default): every method is the identity or the plain reduction;
  the single-device program is unchanged operation for operation.
* ``Shards("data", D)`` (inside ``shard_map`` over the axis): ``mean``/``sum``/``max``/``min``
  are ``lax.pmean``/``psum``/``pmax``/``pmin`` of the per-device values, ``gather`` concatenates
  the rows of every device in device order (``all_gather(tiled=True)``), ``rows`` takes this
  device's rows of a globally computed array, ``fold`` makes a per-device PRNG stream.

``mean`` averages per-device values: for a batch-global mean the shards must hold equally many
rows (guaranteed: ``B`` and ``E`` are multiples of ``D``, checked by the mesh builder).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

__all__ = ["ONE_DEVICE", "Shards"]


@dataclasses.dataclass(frozen=True)
class Shards:
    """Reductions over the devices of one agent (``axis=None``: a single device)."""

    axis: str | None = None
    count: int = 1

    def __post_init__(self):
        if (self.axis is None) != (self.count == 1) or self.count < 1:
            raise ValueError(f"Shards: axis {self.axis!r} with count {self.count}")

    @property
    def active(self) -> bool:
        return self.axis is not None

    def mean(self, x):
        """Mean over devices of per-device values (``x`` unchanged on one device)."""
        return x if self.axis is None else jax.lax.pmean(x, self.axis)

    def sum(self, x):
        return x if self.axis is None else jax.lax.psum(x, self.axis)

    def max(self, x):
        return x if self.axis is None else jax.lax.pmax(x, self.axis)

    def min(self, x):
        return x if self.axis is None else jax.lax.pmin(x, self.axis)

    def index(self):
        """This device's position on the axis (int32 scalar; 0 on one device)."""
        if self.axis is None:
            return jnp.zeros((), jnp.int32)
        return jax.lax.axis_index(self.axis)

    def gather(self, x):
        """``[n, ...]`` per device → ``[D·n, ...]``: every device's rows, in device order."""
        return x if self.axis is None else jax.lax.all_gather(x, self.axis, tiled=True)

    def rows(self, x_global, n: int):
        """This device's ``n`` rows of ``[D·n, ...]`` (the inverse of :meth:`gather`)."""
        if self.axis is None:
            return x_global
        start = self.index() * n
        return jax.lax.dynamic_slice_in_dim(x_global, start, n, axis=0)

    def fold(self, key):
        """A PRNG key for this device's own draws (``key`` itself on one device)."""
        return key if self.axis is None else jax.random.fold_in(key, self.index())


ONE_DEVICE = Shards()
"""The single-device reductions (every default argument)."""
