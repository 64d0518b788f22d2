"""Every local device: a ``("seed", "data")`` mesh and the iteration under ``shard_map``.

``train.mesh`` splits the devices between two axes:

* ``seed`` — the population's ``S`` agents split into groups, one group per device row; the
  devices never communicate (each runs the vmapped iteration of its ``S / seed`` agents);
* ``data`` — one agent data-parallel: each device holds ``E/D`` environments, a replay shard of
  ``C/D`` slots and draws ``B/D`` rows per update; gradients are averaged (``pmean``) and every
  batch statistic is global (:class:`jaxdqn.shards.Shards`), so parameters, target network,
  optimiser and dynamics state stay the same on every device of the row.

On one device (a 1×1 mesh) there is no mesh at all: :func:`make_iteration` is the plain jitted
iteration, operation for operation.

State layout: every leaf has the leading seed axis ``S`` (split over ``seed``); with ``D > 1``
the fields in :data:`jaxdqn.agent.build.SHARDED_FIELDS` (replay, n-step carry, environments,
observations) also carry a device axis ``[S, D, ...]`` split over ``data``. A checkpoint
therefore resumes on the same mesh shape (``train.mesh``), on any devices.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxdqn.agent import iteration as iteration_lib
from jaxdqn.agent.build import SHARDED_FIELDS, Agent, init_train_state, with_lr, with_members
from jaxdqn.agent.build import make_init as build_init
from jaxdqn.agent.state import TrainState
from jaxdqn.config import ConfigError
from jaxdqn.shards import Shards

__all__ = ["AXES", "Layout", "make_init", "make_iteration", "make_layout", "parse_mesh"]

AXES = ("seed", "data")


@dataclasses.dataclass(frozen=True)
class Layout:
    """How a population of ``num_seeds`` agents is placed: ``seed × data`` devices.

    ``mesh`` is ``None`` on one device (no ``shard_map``, no placement)."""

    num_seeds: int
    seed: int
    data: int
    mesh: Mesh | None

    @property
    def devices(self) -> int:
        return self.seed * self.data

    @property
    def shards(self) -> Shards:
        """The reductions of one agent over its row of ``data`` devices."""
        return Shards("data", self.data) if self.data > 1 else Shards()

    def describe(self) -> str:
        if self.mesh is None:
            return "1 device"
        kind = self.mesh.devices.flat[0].platform
        return (
            f"{self.devices} {kind} devices: seed {self.seed} × data {self.data} "
            f"({self.num_seeds // self.seed} seed(s) per device row)"
        )


def parse_mesh(spec: str, num_devices: int, num_seeds: int) -> tuple[int, int]:
    """``(seed, data)`` for ``train.mesh`` over ``num_devices`` devices.

    ``auto``: seed = gcd(S, devices), the rest data-parallel; ``seed``: every device on the seed
    axis; ``data``: every device data-parallel; ``AxB``: seed A × data B (A·B = devices).

    Raises:
      ConfigError: a malformed spec, a product that is not the device count, or a seed axis
        that does not divide ``train.num_seeds``.
    """
    spec = str(spec).strip().lower()
    if spec == "auto":
        seed = math.gcd(num_seeds, num_devices)
        data = num_devices // seed
    elif spec == "seed":
        seed, data = num_devices, 1
    elif spec == "data":
        seed, data = 1, num_devices
    else:
        parts = spec.split("x")
        if len(parts) != 2 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
            raise ConfigError(
                f"train.mesh: {spec!r} is not auto, seed, data or SEEDxDATA (e.g. 2x4)"
            )
        seed, data = (int(p) for p in parts)
        if seed * data != num_devices:
            raise ConfigError(
                f"train.mesh: {spec} uses {seed * data} devices but train.devices resolves to "
                f"{num_devices}; set train.devices={seed * data}"
            )
    if num_seeds % seed:
        raise ConfigError(
            f"train.mesh: {seed} devices on the seed axis do not divide train.num_seeds={num_seeds}"
        )
    return seed, data


def make_layout(
    num_seeds: int, spec: str = "auto", devices: int = 0, available: Sequence[Any] | None = None
) -> Layout:
    """The layout for ``train.num_seeds``, ``train.mesh`` and ``train.devices`` (0: every
    device JAX sees, ``jax.devices()`` — all processes' devices under ``jax.distributed``).

    Raises:
      ConfigError: more devices asked for than exist, or a bad mesh (:func:`parse_mesh`).
    """
    available = list(jax.devices() if available is None else available)
    if devices < 0:
        raise ConfigError(f"train.devices: must be >= 0 (0 = every device), got {devices}")
    count = devices or len(available)
    if count > len(available):
        raise ConfigError(
            f"train.devices={devices}: only {len(available)} "
            f"{available[0].platform} device(s) visible"
        )
    seed, data = parse_mesh(spec, count, num_seeds)
    if count == 1:
        return Layout(num_seeds, 1, 1, None)
    grid = np.asarray(available[:count], dtype=object).reshape(seed, data)
    return Layout(num_seeds, seed, data, Mesh(grid, AXES))


def _field_specs(layout: Layout) -> TrainState:
    """A :class:`TrainState`-shaped prefix of partition specs, one per field."""
    seed_only = PartitionSpec("seed")
    split = PartitionSpec("seed", "data") if layout.data > 1 else seed_only
    names = [f.name for f in dataclasses.fields(TrainState)]
    return TrainState(**{n: split if n in SHARDED_FIELDS else seed_only for n in names})


def shardings(layout: Layout, state: TrainState) -> Any:
    """``NamedSharding`` of every leaf of ``state`` (a state or its ``eval_shape``)."""
    specs = _field_specs(layout)
    out = {}
    for f in dataclasses.fields(TrainState):
        named = NamedSharding(layout.mesh, getattr(specs, f.name))
        out[f.name] = jax.tree.map(lambda _, n=named: n, getattr(state, f.name))
    return TrainState(**out)


def _unstack(state: TrainState, axis: int, data: int) -> TrainState:
    """Drop (``axis`` given) the device axis of the sharded fields of a local block."""
    if data == 1:
        return state
    fix = lambda x: x.squeeze(axis)
    return state.replace(**{n: jax.tree.map(fix, getattr(state, n)) for n in SHARDED_FIELDS})


def _restack(state: TrainState, axis: int, data: int) -> TrainState:
    if data == 1:
        return state
    fix = lambda x: jax.numpy.expand_dims(x, axis)
    return state.replace(**{n: jax.tree.map(fix, getattr(state, n)) for n in SHARDED_FIELDS})


def make_iteration(agent: Agent, layout: Layout, compiler_options: dict[str, Any] | None = None):
    """``jit(state [S, ...], market) -> (state, metrics [S, ...])`` over the layout's devices,
    the state donated, compiled with ``compiler_options`` (XLA options of this program alone).
    ``agent`` must be built for the layout's data axis (``build_agent(cfg, market,
    layout.shards)``)."""
    if agent.shards != layout.shards:
        raise ValueError("make_iteration: the agent was built for another data axis")
    if layout.mesh is None:
        return iteration_lib.make_iteration(
            agent, num_seeds=layout.num_seeds, compiler_options=compiler_options
        )
    # (looked up when traced, so a wrapped iteration_lib.iteration is the one compiled)
    per_seed = jax.vmap(lambda s, m: iteration_lib.iteration(agent, s, m), in_axes=(0, None))

    def local(state: TrainState, market: Any):
        # A device's block: [S/seed, ...] and, for the sharded fields, [S/seed, 1, ...].
        state, metrics = per_seed(_unstack(state, 1, layout.data), market)
        # Every device returns every seed's metrics (a few floats), so that the host of any
        # process reads them whole.
        gather = lambda m: jax.lax.all_gather(m, "seed", tiled=True)
        return _restack(state, 1, layout.data), jax.tree.map(gather, metrics)

    specs = _field_specs(layout)
    fn = jax.shard_map(
        local,
        mesh=layout.mesh,
        in_specs=(specs, PartitionSpec()),
        # The metrics: the same on every device (global reductions, gathered seeds).
        out_specs=(specs, PartitionSpec()),
        check_vma=False,
    )
    return jax.jit(fn, donate_argnums=0, compiler_options=compiler_options or None)


def make_init(agent: Agent, layout: Layout):
    """``jit(market, keys [S, 2]) -> TrainState`` placed on the layout (seed ``s`` from
    ``keys[s]``, as on one device)."""
    if layout.mesh is None:
        return build_init(agent, num_seeds=layout.num_seeds)
    fn = lambda lr, market, key: init_train_state(agent, market, key, lr)
    fn = with_members(agent, jax.vmap(fn, in_axes=(None, None, 0)), layout.num_seeds)
    return with_lr(agent, jax.jit(fn, out_shardings=_named(layout, _field_specs(layout))))


def _named(layout: Layout, specs: TrainState) -> TrainState:
    return jax.tree.map(
        lambda s: NamedSharding(layout.mesh, s),
        specs,
        is_leaf=lambda x: isinstance(x, PartitionSpec),
    )


def replicated(layout: Layout) -> NamedSharding | None:
    """The sharding of an array every device holds whole (``None`` on one device)."""
    return None if layout.mesh is None else NamedSharding(layout.mesh, PartitionSpec())
