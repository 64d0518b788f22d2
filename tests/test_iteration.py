"""The one-program iteration (issue 5): act → store → learn, on the smoke config."""

import dataclasses
from pathlib import Path

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from model_overrides import MODEL_OFF

from jaxdqn import config
from jaxdqn.agent import iteration, optim, pipeline
from jaxdqn.agent.build import build_agent, make_init
from jaxdqn.market import market as market_setup
from jaxdqn.program.run.placement import place

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def _one(tree):
    """Seed 0 of a tree with a leading seed axis."""
    return jax.tree.map(lambda x: x[0], tree)


def _training_program(cfg):
    """``(prepared, placement, keys)`` of ``python -m jaxdqn.train`` for ``cfg``: its iteration
    and initialiser over a leading seed axis, states committed to the device by
    ``placement.put``, and the seeds' keys from ``cfg.seed``. The programs are the training's own,
    so the session's compilation cache holds them once for these tests and every smoke training."""
    p = market_setup.prepare(cfg)
    placed = place(cfg, p, build_agent(cfg, p))
    keys = jax.random.split(jax.random.PRNGKey(cfg.seed), cfg.train.num_seeds)
    return p, placed, keys


@pytest.fixture(scope="module")
def smoke():
    cfg = config.load(CONFIGS / "smoke.yaml")
    _, placed, keys = _training_program(cfg)
    state = placed.put(placed.init(placed.market, keys))
    history = []
    for _ in range(4):
        state, metrics = placed.iterate(state, placed.market)
        history.append(_one(jax.device_get(metrics)))
    return {
        "cfg": cfg,
        "placed": placed,
        "agent": placed.agent,
        "state": state,
        "history": history,
    }


@pytest.mark.slow
def test_l8_smoke_iteration_runs_and_every_metric_is_finite(smoke):
    last = smoke["history"][-1]
    assert last["learning"] == 1.0
    for name, value in last.items():
        assert np.all(np.isfinite(value)), name
    cfg = smoke["cfg"]
    state = _one(smoke["state"])
    assert int(state.iteration) == 4
    # every rollout step emits one transition per env (the first n-1 of the run carry
    # probability 0 because their n-step window starts before the first step)
    assert int(state.replay.size) == 4 * cfg.acting.num_envs * cfg.acting.steps
    learned = sum(h["learning"] for h in smoke["history"])
    assert int(state.updates) == int(learned) * cfg.optim.updates


def test_l8_warmup_iterations_do_not_learn(smoke):
    first = smoke["history"][0]
    assert first["learning"] == 0.0
    assert np.isnan(first["loss"])


def test_o2_host_scalars_and_lr_changes_do_not_recompile(smoke):
    placed, agent = smoke["placed"], smoke["agent"]
    it, state = placed.iterate, smoke["state"]
    assert it._cache_size() == 1
    set_lr = jax.vmap(optim.set_learning_rate, in_axes=(0, None))
    scale = jax.vmap(optim.scale_adam_moments, in_axes=(0, None))
    for lr in (1e-4, 2.5e-4, 3e-5):
        opt_state = scale(set_lr(state.opt_state, lr), 0.5)  # Python floats, as the host writes
        state = state.replace(opt_state=opt_state)
        dyn = agent.dynamics.set_host_inputs(
            state.dynamics, iqn_readiness=lr * 1000, eval_q_std_ema=0.01
        )
        state, metrics = it(placed.put(state.replace(dynamics=dyn)), placed.market)
        assert metrics["learning"][0] == 1.0
        # the learning rate the iteration's updates ran with is the one written by the host
        np.testing.assert_allclose(optim.get_learning_rate(state.opt_state), [lr], rtol=1e-6)
        np.testing.assert_allclose(state.dynamics.iqn_readiness, [lr * 1000], rtol=1e-6)
    state = state.replace(opt_state=jax.vmap(optim.reset_branch_moments)(state.opt_state))
    state, _ = it(placed.put(state), placed.market)
    assert it._cache_size() == 1
    smoke["state"] = state


def _agent_with(smoke, *overrides):
    cfg = config.load(CONFIGS / "smoke.yaml", list(overrides))
    return cfg, build_agent(cfg, market_setup.prepare(cfg))


POLYAK = ("loss.target_update=polyak", "loss.polyak_tau=0.25")


@pytest.fixture(scope="module")
def one_update(smoke):
    """One learner update from the smoke state (seed 0) at a Polyak rate of 0.25 (large enough
    to see), by the reference target pass and by the fused one: ``(state, reference, fused)``,
    each an ``(state, metrics)`` pair. Two compilations serve both tests below."""
    _, reference = _agent_with(smoke, *POLYAK, "kernels.fused=reference")
    _, fused = _agent_with(smoke, *POLYAK, "kernels.fused=fused")
    state = _one(smoke["state"])
    return (
        state,
        jax.jit(reference.learner.update)(state),
        jax.jit(fused.learner.update)(state),
    )


@pytest.mark.slow
def test_l2_polyak_target_moves_by_tau_each_update(one_update):
    state, (new, _), _ = one_update
    for o, t, t0 in zip(
        jax.tree.leaves(new.params),
        jax.tree.leaves(new.target_params),
        jax.tree.leaves(state.target_params),
        strict=True,
    ):
        np.testing.assert_allclose(t, 0.75 * t0 + 0.25 * o, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_l2_one_target_pass_over_next_and_current_obs_equals_two(smoke, one_update):
    """kernels.fused=fused runs the target network once over [s'; s] (and the branches
    fused); the reference (what ``auto`` picks on the CPU) runs it on s' and on s. One update from
    the same state agrees to float rounding: the target distributions (L1, L2) and M11's
    regression target."""
    from jaxdqn.agent.resolve import fused_kernels

    assert smoke["cfg"].kernels.fused == "auto" and not fused_kernels("auto")  # CPU tests
    assert fused_kernels("fused") and not fused_kernels("reference")
    _, (new_r, m_r), (new_f, m_f) = one_update
    for key in ("loss", "loss_c51", "loss_denoise", "loss_coord", "td_target_mean"):
        np.testing.assert_allclose(m_f[key], m_r[key], rtol=1e-4, atol=1e-9, err_msg=key)
    assert float(m_r["loss_denoise"]) > 0  # the s-pass target is really in the loss
    for a, b in zip(jax.tree.leaves(new_f.params), jax.tree.leaves(new_r.params), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_l2_p1_target_kernel_update_equals_the_reference_target_pass(smoke, one_update):
    """``kernels.target_head=interpret`` (the target built by one kernel from the target heads'
    ``[v | A]``, with ``kernels.loss_head=dueling_interpret`` making the model give them)
    against the fused reference update from the same state: the same a′ draws (one key), the
    same targets, losses and parameters to float rounding; the program holds the kernel."""
    overrides = (*POLYAK, "kernels.fused=fused", "kernels.loss_head=dueling_interpret")
    _, agent = _agent_with(smoke, *overrides, "kernels.target_head=interpret")
    assert agent.learner.spec.target_head == "interpret"
    state, _, (new_f, m_f) = one_update
    assert "c51_target" in str(jax.make_jaxpr(agent.learner.update)(state))
    new_k, m_k = jax.jit(agent.learner.update)(state)
    for key in ("loss", "loss_c51", "loss_denoise", "td_target_mean", "end_atom_mass"):
        np.testing.assert_allclose(m_k[key], m_f[key], rtol=1e-4, atol=1e-9, err_msg=key)
    for a, b in zip(jax.tree.leaves(new_k.params), jax.tree.leaves(new_f.params), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_l2_hard_target_copies_every_c_updates(smoke):
    cfg, agent = _agent_with(smoke, "loss.target_update=hard")
    state = _one(smoke["state"])
    period = cfg.loss.target_period
    step = jax.jit(agent.learner.update)
    # advance to just after a copy
    while int(state.updates) % period != 0:
        state, _ = step(state)
    same = lambda a, b: all(
        bool(jnp.array_equal(x, y))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )
    assert same(state.params, state.target_params)
    frozen = state.target_params
    for k in range(1, period):
        state, _ = step(state)
        assert same(state.target_params, frozen), k
        assert not same(state.params, state.target_params)
    state, _ = step(state)
    assert same(state.params, state.target_params)


@pytest.mark.slow
def test_l8_states_vmap_over_seeds():
    cfg = config.load(CONFIGS / "smoke.yaml")
    p = market_setup.prepare(cfg)
    agent = build_agent(cfg, p)
    keys = jax.random.split(jax.random.PRNGKey(1), 2)
    states = make_init(agent, num_seeds=2)(p.market, keys)
    leaves = jax.tree.leaves(states.params)
    assert all(w.shape[0] == 2 for w in leaves)
    assert any(not np.array_equal(w[0], w[1]) for w in leaves)  # independent initialisations
    single = make_init(agent, num_seeds=1)(p.market, keys[1:])
    for a, b in zip(jax.tree.leaves(states), jax.tree.leaves(single), strict=True):
        np.testing.assert_array_equal(a[1], b[0])


@pytest.mark.slow
def test_l8_seed_population_member_equals_single_seed_run():
    """Issue 7: seeds are independent agents whose keys come from the run seed; seed s of a
    vmapped population follows exactly the single-seed run started from the same derived key."""
    cfg = config.load(CONFIGS / "smoke.yaml", ["train.num_seeds=2"])
    _, pop_placed, keys = _training_program(cfg)
    _, one_placed, _ = _training_program(config.load(CONFIGS / "smoke.yaml"))
    pop = pop_placed.put(pop_placed.init(pop_placed.market, keys))
    one = one_placed.put(one_placed.init(one_placed.market, keys[1:]))
    for _ in range(3):
        pop, pm = pop_placed.iterate(pop, pop_placed.market)
        one, om = one_placed.iterate(one, one_placed.market)
    assert pm["learning"][1] == 1.0
    # the two seeds act and learn differently
    assert pm["loss"][0] != pm["loss"][1]
    assert not np.array_equal(pop.env.t[0], pop.env.t[1])
    assert not np.array_equal(pop.replay.storage.action[0], pop.replay.storage.action[1])
    # seed 1 of the population is the single run with key 1 (vmapped matmuls may round
    # differently in the last bit, so compare to float32 precision)
    np.testing.assert_allclose(pm["loss"][1], om["loss"][0], rtol=1e-5)
    np.testing.assert_array_equal(pop.replay.storage.action[1], one.replay.storage.action[0])
    for a, b in zip(jax.tree.leaves(pop.params), jax.tree.leaves(one.params), strict=True):
        np.testing.assert_allclose(a[1], b[0], rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_l1_reward_scale_multiplies_the_learning_rewards():
    def stored(scale):
        # (off: the network's components play no part in the rewards)
        cfg = config.load(CONFIGS / "smoke.yaml", [f"loss.reward_scale={scale}", *MODEL_OFF])
        p = market_setup.prepare(cfg)
        agent = build_agent(cfg, p)
        # (the training's initialiser, which the reward scale does not change: one program)
        state = _one(make_init(agent, num_seeds=1)(p.market, jax.random.PRNGKey(3)[None]))
        # the training's market carries the scale as data (placement); without it, the
        # agent's constant
        market = p.market.replace(reward_scale=jnp.float32(agent.reward_scale))
        store = lambda s, m: iteration.store(agent, *iteration.act(agent, s, m), m)
        placed, bare = (jax.jit(store)(state, m) for m in (market, p.market))
        np.testing.assert_array_equal(placed.replay.storage.reward, bare.replay.storage.reward)
        return np.asarray(placed.replay.storage.reward), float(placed.dynamics.reward_std_ema)

    r1, s1 = stored(1.0)
    r100, s100 = stored(100.0)
    assert np.abs(r1).max() > 0
    np.testing.assert_allclose(r100, 100.0 * r1, rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(s100, 100.0 * s1, rtol=1e-5)


def test_l1_folds_differing_only_in_data_share_one_iteration_program():
    """Two walk-forward folds of the S&P 500 (train up to 2014 and up to 2015) resolve different
    reward scales (1 / σ of their train returns), which the iteration reads from the placed
    market, not as a constant: both lower to the same program, so the second fold reuses the
    first's compilation (a fold-specific constant would make every fold compile again)."""
    texts, scales = [], []
    for train_end, val_end in (("2014-12-31", "2015-12-31"), ("2015-12-31", "2016-12-31")):
        cfg = config.load(
            CONFIGS / "smoke.yaml", [f"data.train_end={train_end}", f"data.val_end={val_end}"]
        )
        _, placed, keys = _training_program(cfg)
        state = jax.eval_shape(placed.init, placed.market, keys)
        scales.append(float(placed.market.reward_scale))
        assert scales[-1] == np.float32(placed.agent.reward_scale)
        texts.append(placed.iterate.lower(state, placed.market).as_text())
    assert scales[0] != scales[1]
    assert texts[0] == texts[1]


def test_o1_learner_scan_unroll_reaches_the_scan(smoke):
    """``optim.unroll`` is the learner scan's unroll: at U the program has no loop for the
    learner's updates (one while fewer: the scan's).
    (That unrolling keeps the arithmetic is ``lax.scan``'s contract; on the CPU the state after
    two updates differed by 1e-5 relative at most, XLA fusing the unrolled bodies otherwise.)"""
    agent = smoke["agent"]
    state = _one(smoke["state"])
    updates = smoke["cfg"].optim.updates
    assert agent.unroll == 1 and updates >= 2
    lowered = lambda a: jax.jit(lambda s: iteration.learn(a, s)).lower(state).as_text()
    loop, unrolled = lowered(agent), lowered(dataclasses.replace(agent, unroll=updates))
    assert unrolled.count("stablehlo.while") == loop.count("stablehlo.while") - 1


def test_l8_training_compiles_the_iteration_with_its_own_xla_options(smoke, monkeypatch):
    """The training's placement compiles the iteration with
    ``runtime.iteration_compiler_options()`` (only there: the evaluation walks' long loops must
    not be recorded into graphs whole): an option XLA does not know, given that way, fails the
    iteration's compile and nothing else."""
    from jaxdqn.program.launch import runtime

    cfg = smoke["cfg"]
    p = market_setup.prepare(cfg)
    monkeypatch.setattr(runtime, "iteration_compiler_options", lambda: {"xla_no_such_option": 1})
    placed = place(cfg, p, build_agent(cfg, p))
    keys = jax.random.split(jax.random.PRNGKey(cfg.seed), cfg.train.num_seeds)
    state = placed.init(placed.market, keys)  # the initialiser: compiled without them
    with pytest.raises(Exception, match="No such compile option"):
        placed.iterate.lower(state, placed.market).compile()


@pytest.mark.slow
def test_l8_learner_activations_bf16_update_is_the_float32_update_to_bfloat16_rounding(
    smoke, one_update
):
    """kernels.learner_activations=bf16 reaches the learner's update (its program holds
    bfloat16 products) and one update from the smoke state gives the float32 update's
    (``one_update``'s reference: the same overrides but this one) loss to 0.5 % and parameter
    steps pointing the same way (cosine ≥ 0.99; measured on the CPU: losses 13.62816 vs
    13.62807, cosine 0.99997)."""
    state, (n32, m32), _ = one_update
    _, bf16 = _agent_with(
        smoke, *POLYAK, "kernels.fused=reference", "kernels.learner_activations=bf16"
    )
    assert "bf16[" in str(jax.make_jaxpr(bf16.learner.update)(state))
    n16, m16 = jax.jit(bf16.learner.update)(state)
    np.testing.assert_allclose(m16["loss"], m32["loss"], rtol=5e-3)
    assert not np.array_equal(m16["loss"], m32["loss"])
    step = lambda new: jnp.concatenate(
        [
            (a - b).ravel()
            for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(state.params), strict=True)
        ]
    )
    s16, s32 = step(n16), step(n32)
    assert bool(jnp.all(jnp.isfinite(s16)))
    cosine = float(jnp.vdot(s16, s32) / (jnp.linalg.norm(s16) * jnp.linalg.norm(s32)))
    assert cosine > 0.99, cosine


def _differs(a, b):
    return any(
        not np.allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-9)
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


@pytest.mark.slow
def test_l2_pipelined_learner_learns_from_the_batch_and_target_of_one_update_earlier(smoke):
    """``optim.pipeline``: two scanned updates equal, by hand, (1) the first batch sampled and
    its target built at the scan's start state, (2) the second batch sampled and targeted at
    that same state (before update 1 moved the target network), each learnt from by
    ``learner.learn`` on the current state. The staleness is real: the second target differs
    from the one the state after update 1 gives for the same draw."""
    cfg, agent = _agent_with(smoke, *POLYAK, *MODEL_OFF, "optim.pipeline=true")
    assert agent.pipeline
    lrn = agent.learner
    # A fresh all-off agent's state learning from the smoke run's warm replay: the subject is
    # the learner's order, and the all-off programs compile in a fraction of the time.
    fresh_state = make_init(agent)(market_setup.prepare(cfg).market, jax.random.PRNGKey(5))
    start = fresh_state.replace(replay=_one(smoke["state"]).replay)

    @jax.jit
    def both(s0):
        piped, metrics = iteration.scan_updates(agent, s0, 2)
        key, k_first = jax.random.split(s0.key)
        s = s0.replace(key=key)
        first = pipeline.prefetch(lrn, s, k_first)
        key, k_next = jax.random.split(s.key)
        second = pipeline.prefetch(lrn, s, k_next)
        s1, _ = lrn.learn(s.replace(key=key), first)
        key, _ = jax.random.split(s1.key)
        s2, _ = lrn.learn(s1.replace(key=key), second)
        fresh = pipeline.prefetch(lrn, s1, k_next)  # the same draw, at the state after update 1
        return piped, metrics, s2, second, fresh

    piped, metrics, s2, second, fresh = both(start)
    assert metrics["loss"].shape == (2,)
    chex.assert_trees_all_close(piped, s2, rtol=1e-5, atol=1e-7)
    assert _differs(second.target.probs, fresh.target.probs)  # θ⁻ moved by τ = 0.25 meanwhile
