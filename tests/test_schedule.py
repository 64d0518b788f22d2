"""The per-epoch schedule (O2 SGDR learning rate, O3 restart, A2 readiness ramp, A1 κ) and
writing it into a seed-stacked train state without recompiling the iteration."""

from __future__ import annotations

import math
from pathlib import Path

import jax
import numpy as np
import optax
import pytest

from jaxdqn import config
from jaxdqn.agent import iteration, optim
from jaxdqn.agent.build import build_agent, make_init
from jaxdqn.config import ActingConfig, OptimConfig
from jaxdqn.market import market as market_lib
from jaxdqn.program.run.placement import place
from jaxdqn.program.run.schedule import EpochSchedule, apply_schedule, schedule

SMOKE = Path(__file__).resolve().parent.parent / "configs" / "smoke.yaml"
OPT = OptimConfig(lr=1e-3, sgdr_period=4, sgdr_floor=0.2, restart_moment_scale=0.5)
ACT = ActingConfig(
    iqn_readiness=0.5,
    iqn_readiness_end=1.0,
    iqn_readiness_epochs=4,
    kappa_start=1.0,
    kappa_end=0.25,
    kappa_epochs=4,
)
# One cycle of T = 4 epochs by hand: base · (f + (1 − f) · ½(1 + cos(π c / 4))), f = 0.2.
CYCLE = [
    1e-3,
    1e-3 * (0.2 + 0.8 * (2 + math.sqrt(2)) / 4),
    0.6e-3,
    1e-3 * (0.2 + 0.8 * (2 - math.sqrt(2)) / 4),
]


def test_o2_lr_follows_the_cosine_cycle_and_restarts_at_base():
    lrs = [schedule(e, 0, 0, OPT, ACT).lr for e in range(9)]
    assert lrs == pytest.approx(CYCLE + CYCLE + [1e-3], rel=1e-12)
    assert lrs[0] == 1e-3 and lrs[4] == 1e-3  # exactly the base rate at each cycle start
    # A rewind starts a new cycle at cycle_start: its position is epoch − cycle_start.
    assert [schedule(5 + c, 5, 0, OPT, ACT).lr for c in range(4)] == pytest.approx(CYCLE)
    # An interrupted epoch resumed part-way keeps its epoch's rate.
    assert schedule(6, 0, 3, OPT, ACT).lr == schedule(6, 0, 0, OPT, ACT).lr


def test_o3_restart_exactly_at_cycle_boundaries_and_first_iteration():
    restarts = [e for e in range(13) if schedule(e, 0, 0, OPT, ACT).restart]
    assert restarts == [4, 8, 12]  # not epoch 0: the run's first cycle is no restart
    # Only before an epoch's first iteration: a resumed interrupted epoch is not scaled twice.
    assert not any(schedule(e, 0, i, OPT, ACT).restart for e in range(13) for i in (1, 2))
    # After a rewind at cycle_start 5 the new cycle starts without O3; restarts follow it.
    assert [e for e in range(5, 14) if schedule(e, 5, 0, OPT, ACT).restart] == [9, 13]


def test_a2_readiness_ramps_linearly_to_its_end_by_run_epoch():
    # r = r0 + (r1 − r0) · min(1, e/N) with r0 = 0.5, r1 = 1 (the seed's end), N = 4
    ready = [schedule(e, 0, 0, OPT, ACT).readiness for e in range(7)]
    assert ready == [0.5, 0.625, 0.75, 0.875, 1.0, 1.0, 1.0]
    # The ramp follows the run's epoch, not the SGDR cycle (a rewind does not restart it).
    assert schedule(2, 2, 0, OPT, ACT).readiness == 0.75
    start = ActingConfig(iqn_readiness=1.0, iqn_readiness_end=1.0, iqn_readiness_epochs=4)
    assert schedule(0, 0, 0, OPT, start).readiness == 1.0
    # The default ends at the Q10/Q90 midpoint 0.5 (from 0 over 20 epochs), then stays.
    default = ActingConfig()
    assert (default.iqn_readiness, default.iqn_readiness_end) == (0.0, 0.5)
    assert [schedule(e, 0, 0, OPT, default).readiness for e in (0, 10, 20, 40)] == [
        0.0,
        0.25,
        0.5,
        0.5,
    ]


def test_a1_kappa_moves_linearly_from_start_to_end_by_run_epoch():
    # κ = 0.25 + 0.75 · max(0, 1 − e/4)
    kappas = [schedule(e, 0, 0, OPT, ACT).kappa for e in range(7)]
    assert kappas == [1.0, 0.8125, 0.625, 0.4375, 0.25, 0.25, 0.25]
    # by the run's epoch, not the SGDR cycle's (a rewind does not restart it), nor the iteration
    assert schedule(2, 2, 0, OPT, ACT).kappa == 0.625
    assert schedule(2, 0, 3, OPT, ACT).kappa == 0.625
    # the defaults: the seed's κ = 1 at epoch 0, 0.25 from epoch 20 on
    default = ActingConfig()
    assert (default.kappa_start, default.kappa_end, default.kappa_epochs) == (1.0, 0.25, 20)
    assert schedule(0, 0, 0, OPT, default).kappa == 1.0
    assert schedule(10, 0, 0, OPT, default).kappa == pytest.approx(0.625)
    assert schedule(20, 0, 0, OPT, default).kappa == 0.25
    assert schedule(100, 0, 0, OPT, default).kappa == 0.25
    # a constant κ (the seed system: start = end = 1)
    const = ActingConfig(kappa_start=1.0, kappa_end=1.0)
    assert {schedule(e, 0, 0, OPT, const).kappa for e in range(30)} == {1.0}


@pytest.fixture(scope="module")
def smoke():
    """A 2-seed smoke agent and its fresh state, placed as ``python -m jaxdqn.train`` places it
    (committed to the device), so that its iteration is the training's own program."""
    cfg = config.load(SMOKE, ["train.num_seeds=2"])
    p = market_lib.prepare(cfg)
    placed = place(cfg, p, build_agent(cfg, p))
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    state = placed.put(placed.init(placed.market, keys))
    return placed.agent, p, state, placed.put


def _avals(state):
    leaves, treedef = jax.tree.flatten(state)
    return treedef, [jax.typeof(x) for x in leaves]


def _main_adam(opt_state):
    """The trunk's and branches' Adam states of a seed-stacked optimiser state."""
    found = []
    is_mt = lambda n: isinstance(n, optax.MultiTransformState)
    is_adam = lambda n: isinstance(n, optax.ScaleByAdamState)
    for node in jax.tree.leaves(opt_state, is_leaf=is_mt):
        if is_mt(node):
            for name in optim.MAIN:
                found += [
                    n for n in jax.tree.leaves(node.inner_states[name], is_leaf=is_adam)
                    if is_adam(n)
                ]  # fmt: skip
    assert found
    return found


@pytest.mark.slow
def test_o2_o3_a2_apply_writes_values_and_keeps_avals(smoke):
    agent, _, state, _ = smoke
    bumped = state.replace(
        opt_state=jax.tree.map(lambda x: x + 1.0 if x.dtype == np.float32 else x, state.opt_state)
    )
    sched = EpochSchedule(lr=3e-4, restart=True, readiness=0.625, kappa=0.4375, moment_scale=0.5)
    out = apply_schedule(bumped, sched, agent.dynamics, [0.25, 0.75])
    assert _avals(out) == _avals(state)
    lr = np.asarray(jax.vmap(optim.get_learning_rate)(out.opt_state))
    np.testing.assert_array_equal(lr, np.full(2, 3e-4, np.float32))
    for before, after in zip(_main_adam(bumped.opt_state), _main_adam(out.opt_state), strict=True):
        for a, b in zip(jax.tree.leaves(before.mu), jax.tree.leaves(after.mu), strict=True):
            np.testing.assert_array_equal(np.asarray(a) * np.float32(0.5), b)
        for a, b in zip(jax.tree.leaves(before.nu), jax.tree.leaves(after.nu), strict=True):
            np.testing.assert_array_equal(np.asarray(a) * np.float32(0.5), b)
    np.testing.assert_array_equal(out.dynamics.iqn_readiness, np.float32([0.625, 0.625]))
    np.testing.assert_array_equal(out.dynamics.kappa, np.float32([0.4375, 0.4375]))
    np.testing.assert_array_equal(out.dynamics.eval_q_std_ema, np.float32([0.25, 0.75]))
    # No restart: moments untouched; no EMA yet (before the first validation): zeros.
    calm = apply_schedule(bumped, EpochSchedule(1e-3, False, 0.5, 1.0, 0.5), agent.dynamics, None)
    for a, b in zip(
        jax.tree.leaves(_main_adam(bumped.opt_state)),
        jax.tree.leaves(_main_adam(calm.opt_state)),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(calm.dynamics.eval_q_std_ema, np.zeros(2, np.float32))
    np.testing.assert_array_equal(calm.dynamics.kappa, np.ones(2, np.float32))


@pytest.mark.slow
def test_h1_apply_writes_each_agents_own_values(smoke):
    """A population's schedule (``[P]`` values): each agent's learning rate, readiness and κ
    written, and at a restart each agent's Adam moments scaled by its own O3 factor."""
    agent, _, state, _ = smoke
    bumped = state.replace(
        opt_state=jax.tree.map(lambda x: x + 1.0 if x.dtype == np.float32 else x, state.opt_state)
    )
    sched = EpochSchedule((3e-4, 1e-3), True, (0.1, 0.9), (2.0, 0.5), (0.5, 0.25))
    out = apply_schedule(bumped, sched, agent.dynamics, None)
    assert _avals(out) == _avals(state)
    lr = np.asarray(jax.vmap(optim.get_learning_rate)(out.opt_state))
    np.testing.assert_array_equal(lr, np.float32([3e-4, 1e-3]))
    np.testing.assert_array_equal(out.dynamics.iqn_readiness, np.float32([0.1, 0.9]))
    np.testing.assert_array_equal(out.dynamics.kappa, np.float32([2.0, 0.5]))
    scale = np.float32([0.5, 0.25]).reshape(2, 1)
    for before, after in zip(_main_adam(bumped.opt_state), _main_adam(out.opt_state), strict=True):
        for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True):
            if a.dtype == np.float32:  # μ and ν; the step count is untouched
                flat = np.asarray(a).reshape(2, -1)
                np.testing.assert_array_equal(flat * scale, np.asarray(b).reshape(2, -1))


@pytest.mark.slow
def test_a1_kappa_written_by_apply_schedule_drives_the_acting_temperature(smoke):
    """The iteration's acting samples at the κ the host wrote: same κ, same actions (same
    keys); a near-zero κ (almost greedy) changes them."""
    agent, p, state, _ = smoke
    state = jax.tree.map(lambda x: x.copy(), state)  # the fixture's state is not donated
    assert np.all(np.asarray(state.dynamics.kappa) == agent.acting.kappa_start)
    actions = jax.jit(
        jax.vmap(lambda s, m: iteration.act(agent, s, m)[1].actions, in_axes=(0, None))
    )

    def acted(kappa):
        sched = EpochSchedule(lr=1e-3, restart=False, readiness=0.5, kappa=kappa, moment_scale=0.5)
        return np.asarray(actions(apply_schedule(state, sched, agent.dynamics, None), p.market))

    one = acted(1.0)
    np.testing.assert_array_equal(acted(1.0), one)
    assert not np.array_equal(acted(1e-3), one)


@pytest.mark.slow
def test_o2_schedule_changes_do_not_recompile_the_iteration(smoke, monkeypatch):
    agent, p, state, put = smoke
    traces = []
    real = iteration.iteration

    def counted(agent_, state_, market):
        traces.append(1)
        return real(agent_, state_, market)

    monkeypatch.setattr(iteration, "iteration", counted)
    iterate = iteration.make_iteration(agent, num_seeds=2)
    state = jax.tree.map(lambda x: x.copy(), state)  # the fixture's state is not donated
    ema = None
    for epoch in range(6):  # restarts at 4 (period 4), lr and readiness change every epoch
        sched = schedule(epoch, 0, 0, OPT, ACT)
        state = apply_schedule(state, sched, agent.dynamics, ema)
        state, _ = iterate(put(state), p.market)
        ema = [0.1 * (epoch + 1), 0.2]
    state = state.replace(opt_state=jax.vmap(optim.reset_branch_moments)(state.opt_state))
    iterate(put(state), p.market)
    assert len(traces) == 1


@pytest.mark.slow
def test_o2_init_takes_the_learning_rate_as_an_argument_so_lr_sweeps_share_one_program():
    """Runs that differ only in ``optim.lr`` (a sweep's trials) lower one init program, so the
    persistent compilation cache compiles it once; each fresh state still holds its own lr."""
    cfg = config.load(SMOKE, [*config.ALL_OFF, "optim.lr=3e-4"])
    p = market_lib.prepare(cfg)
    keys = jax.random.split(jax.random.PRNGKey(0), 1)
    texts, rates = [], []
    for lr in (3e-4, 7e-4):
        agent = build_agent(config.load(SMOKE, [*config.ALL_OFF, f"optim.lr={lr}"]), p)
        init = make_init(agent, num_seeds=1)
        texts.append(init.func.lower(*init.args, p.market, keys).as_text())
        state = init(p.market, keys)
        rates.append(np.asarray(jax.vmap(optim.get_learning_rate)(state.opt_state)))
    assert texts[0] == texts[1]
    np.testing.assert_array_equal(rates[0], np.float32(3e-4))
    np.testing.assert_array_equal(rates[1], np.float32(7e-4))
