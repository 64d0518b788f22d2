"""Where a run's population lives: its device layout, the compiled iteration and initialiser
for it, and the market placed on every device (:mod:`jaxdqn.agent.mesh`).

The :class:`jaxdqn.program.run.loop.Trainer` asks :func:`place` once. On one device everything is
the plain single-device program (no mesh, no placement); on several, the iteration runs under
``shard_map`` over the ``("seed", "data")`` mesh of ``train.mesh`` and every state the host
hands to it is put on the layout's shardings first (:meth:`Placement.put`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from jaxdqn.agent import mesh as mesh_lib
from jaxdqn.agent.build import Agent, build_agent
from jaxdqn.agent.population import population_keys
from jaxdqn.agent.state import TrainState
from jaxdqn.config import Config
from jaxdqn.config.members import population_size
from jaxdqn.market.env import MarketData
from jaxdqn.market.market import Prepared
from jaxdqn.program.launch import runtime

__all__ = ["Placement", "place"]


@dataclasses.dataclass(frozen=True)
class Placement:
    """The layout of a run and its compiled functions.

    Attributes:
      layout: seed × data devices (:class:`jaxdqn.agent.mesh.Layout`).
      agent: the agent the iteration runs (one device's share when data-parallel).
      iterate: ``(state, market) -> (state, metrics)``, jitted, state donated.
      init: ``(market, keys [S, 2]) -> state`` on the layout.
      market: the market arrays, on every device of the layout.
      xla_options: the XLA options ``iterate`` alone is compiled with
        (:func:`jaxdqn.program.launch.runtime.iteration_compiler_options`).
    """

    layout: mesh_lib.Layout
    agent: Agent
    iterate: Callable[[TrainState, MarketData], tuple[TrainState, dict[str, Any]]]
    init: Callable[[MarketData, jax.Array], TrainState]
    market: MarketData
    xla_options: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def primary(self) -> bool:
        """Whether this process writes the run's files (process 0)."""
        return jax.process_index() == 0

    def view(self, state: TrainState) -> TrainState:
        """What the host reads of ``state`` — the parameters and the dynamics the walks use —
        on one device ``state`` itself; on a mesh gathered onto every device and copied to
        host memory, so that the walks run the same one-device program whatever the layout
        and however many processes (under ``jax.distributed`` every process walks every
        seed). The other fields are left out (``None``) of a gathered view."""
        if self.layout.mesh is None:
            return state
        wanted = (state.params, state.dynamics)
        whole = jax.jit(lambda t: t, out_shardings=mesh_lib.replicated(self.layout))(wanted)
        params, dynamics = jax.tree.map(np.asarray, whole)
        empty = {f.name: None for f in dataclasses.fields(state)}
        return state.replace(**{**empty, "params": params, "dynamics": dynamics})

    def fresh(self, seed: int, num_seeds: int) -> TrainState:
        """The initial ``[P, ...]`` state of the run seed ``seed`` with ``num_seeds`` seeds per
        member: agent ``p`` from the key of seed ``p mod S`` (:func:`population_keys`)."""
        return self.init(self.market, population_keys(seed, self.layout.num_seeds, num_seeds))

    def put(self, state: TrainState) -> TrainState:
        """``state`` on the layout's shardings; on one device, committed to that device.

        One device: a fresh state (the initialiser's output from uncommitted inputs) is
        uncommitted, a restored one (resume, rewind, fault recovery: orbax places it on the
        device) committed, and ``jax.jit`` compiles the iteration once for each — a second
        compilation, which the persistent cache never holds for a resumed run (2-core CPU,
        smoke config: two 16-20 s compilations in every resume). Committing both makes them one
        program. Leaves already on the device are not copied."""
        if self.layout.mesh is None:
            return jax.device_put(state, jax.devices()[0])
        if jax.process_count() > 1:
            # A value the host made on this process's device (e.g. a learning rate) goes onto
            # the global layout from host memory: it is the same on every process.
            local = lambda x: isinstance(x, jax.Array) and len(x.sharding.device_set) == 1
            state = jax.tree.map(lambda x: np.asarray(x) if local(x) else x, state)
        return jax.device_put(state, mesh_lib.shardings(self.layout, state))


def place(cfg: Config, prepared: Prepared, agent: Agent) -> Placement:
    """The placement of ``cfg.train`` (``num_seeds``, ``mesh``, ``devices``) for ``agent``
    (built for one device; rebuilt for one device's share when the layout is data-parallel).

    Raises:
      ConfigError: a mesh the devices or sizes do not allow.
    """
    tc = cfg.train
    layout = mesh_lib.make_layout(population_size(cfg), tc.mesh, tc.devices)
    if layout.data > 1:
        agent = build_agent(cfg, prepared, layout.shards)
    # the reward scale as data: folds of a walk-forward then compile one iteration program
    market = prepared.market.replace(reward_scale=jax.numpy.float32(agent.reward_scale))
    if layout.mesh is not None:
        market = jax.device_put(market, mesh_lib.replicated(layout))
    options = runtime.iteration_compiler_options()
    return Placement(
        layout=layout,
        agent=agent,
        iterate=mesh_lib.make_iteration(agent, layout, options),
        init=mesh_lib.make_init(agent, layout),
        market=market,
        xla_options=options,
    )
