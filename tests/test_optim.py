"""O1–O4: partitioned optimiser, SGDR without recompilation, moment scaling and branch reset."""

from __future__ import annotations

import math

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdqn.agent.optim import (
    clip_by_joint_norm,
    get_learning_rate,
    is_restart,
    label_by_path,
    make_optimizer,
    reset_branch_moments,
    scale_adam_moments,
    set_learning_rate,
    sgdr_learning_rate,
)

LABELS = label_by_path([(r"^main/branch_", "branches"), (r"^aux/", "aux"), (r"^xlstm/", "xlstm")])
B1, B2, EPS = 0.9, 0.999, 1e-8


def _params() -> dict:
    return {
        "main": {
            "trunk": {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)},
            "branch_direction": {"w": jnp.ones((2, 3))},
            "branch_magnitude": {"w": jnp.ones(4)},
        },
        "aux": {"denoiser": {"w": jnp.ones(3)}},
        "xlstm": {"w": jnp.ones((2, 2))},
    }


def _grads(key, scale: float = 1.0) -> dict:
    leaves, treedef = jax.tree.flatten(_params())
    keys = jax.random.split(key, len(leaves))
    noise = [scale * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves, strict=True)]
    return jax.tree.unflatten(treedef, noise)


def _norm(tree) -> float:
    return math.sqrt(sum(float(jnp.sum(x**2)) for x in jax.tree.leaves(tree)))


def _main(tree) -> dict:
    return {k: v for k, v in tree["main"].items()}


@pytest.mark.slow
def test_o1_labels_route_each_partition_to_its_transformation():
    params = _params()
    labels = LABELS(params)
    assert labels["main"]["trunk"]["w"] == "trunk"
    assert labels["main"]["branch_direction"]["w"] == "branches"
    assert labels["aux"]["denoiser"]["w"] == "aux"
    assert labels["xlstm"]["w"] == "xlstm"

    lr, clip = 1e-2, 1.0
    opt = make_optimizer(LABELS, lr=lr, clip_norm=clip)
    state = opt.init(params)
    # Step 1: large main gradients (clipped jointly), large aux/xlstm gradients (never clipped).
    g1 = _grads(jax.random.PRNGKey(0), scale=5.0)
    g2 = _grads(jax.random.PRNGKey(1), scale=0.05)
    u1, state = opt.update(g1, state, params)
    u2, state = opt.update(g2, state, params)

    # xlstm: SGD 1e-4 on the raw gradient.
    np.testing.assert_allclose(u1["xlstm"]["w"], -1e-4 * g1["xlstm"]["w"], rtol=1e-6)
    np.testing.assert_allclose(u2["xlstm"]["w"], -1e-4 * g2["xlstm"]["w"], rtol=1e-6)

    def adam(gs, rate):
        m = v = 0.0
        out = []
        for t, g in enumerate(gs, start=1):
            m = B1 * m + (1 - B1) * g
            v = B2 * v + (1 - B2) * g**2
            out.append(-rate * (m / (1 - B1**t)) / (np.sqrt(v / (1 - B2**t)) + EPS))
        return out

    # aux: Adam 1e-4 on the unclipped gradients.
    a1, a2 = adam(
        [np.asarray(g1["aux"]["denoiser"]["w"]), np.asarray(g2["aux"]["denoiser"]["w"])], 1e-4
    )
    np.testing.assert_allclose(u1["aux"]["denoiser"]["w"], a1, rtol=1e-5)
    np.testing.assert_allclose(u2["aux"]["denoiser"]["w"], a2, rtol=1e-4)

    # main: Adam lr on gradients clipped by ONE global norm over trunk + branches.
    c1 = min(1.0, clip / _norm(_main(g1)))
    c2 = min(1.0, clip / _norm(_main(g2)))
    assert c1 < 0.2 and c2 == 1.0
    for u1_leaf, u2_leaf, g1_leaf, g2_leaf in zip(
        jax.tree.leaves(_main(u1)),
        jax.tree.leaves(_main(u2)),
        jax.tree.leaves(_main(g1)),
        jax.tree.leaves(_main(g2)),
        strict=True,
    ):
        m1, m2 = adam([c1 * np.asarray(g1_leaf), c2 * np.asarray(g2_leaf)], lr)
        np.testing.assert_allclose(u1_leaf, m1, rtol=1e-5)
        np.testing.assert_allclose(u2_leaf, m2, rtol=1e-4)


def test_o2_sgdr_schedule_values():
    base = 1e-3
    expected = {
        0: base,
        10: base * (0.1 + 0.9 * 0.5),
        19: base * (0.1 + 0.45 * (1 + math.cos(math.pi * 19 / 20))),
        20: base,
        40: base,
    }
    for epoch, value in expected.items():
        assert sgdr_learning_rate(epoch, base) == pytest.approx(value, rel=1e-12)
    assert sgdr_learning_rate(5, 2.0, period=10, floor=0.5) == pytest.approx(1.5)
    assert sgdr_learning_rate(19, base) > 0.1 * base
    assert [is_restart(e) for e in (0, 1, 19, 20, 21, 40)] == [
        False,
        False,
        False,
        True,
        False,
        True,
    ]
    assert is_restart(10, period=10)


def test_o2_set_learning_rate_changes_the_next_update_without_recompiling():
    params = _params()
    opt = make_optimizer(LABELS, lr=1e-3, clip_norm=1.0)
    traces = []

    @jax.jit
    def update(grads, state):
        traces.append(1)
        return opt.update(grads, state, params)

    state = opt.init(params)
    lr0 = get_learning_rate(state)
    assert lr0.dtype == jnp.float32 and not lr0.weak_type and float(lr0) == pytest.approx(1e-3)
    grads = _grads(jax.random.PRNGKey(0))
    _, state = update(grads, state)
    base_update, _ = update(grads, state)
    for lr in (sgdr_learning_rate(e, 1e-3) for e in (1, 7, 13)):
        changed = set_learning_rate(state, lr)
        assert float(get_learning_rate(changed)) == pytest.approx(lr, rel=1e-6)
        new_update, _ = update(grads, changed)
        # Adam's update is linear in the learning rate: main scales, aux and xlstm do not.
        for new, old in zip(
            jax.tree.leaves(_main(new_update)), jax.tree.leaves(_main(base_update)), strict=True
        ):
            np.testing.assert_allclose(new, old * lr / 1e-3, rtol=1e-5)
        np.testing.assert_array_equal(
            new_update["aux"]["denoiser"]["w"], base_update["aux"]["denoiser"]["w"]
        )
        np.testing.assert_array_equal(new_update["xlstm"]["w"], base_update["xlstm"]["w"])
    state = scale_adam_moments(set_learning_rate(state, jnp.float32(2e-4)), 0.5)
    _, state = update(grads, state)
    _, state = update(grads, reset_branch_moments(state))
    # A jitted host-side write of the lr is also trace-stable.
    state = jax.jit(set_learning_rate)(state, jnp.float32(3e-4))
    update(grads, state)
    assert len(traces) == 1
    # The branches' lr is kept equal to the trunk's.
    rates = []
    leaves = jax.tree.leaves(
        state, is_leaf=lambda x: isinstance(x, optax.InjectStatefulHyperparamsState)
    )
    for leaf in leaves:
        if isinstance(leaf, optax.InjectStatefulHyperparamsState):
            rates.append(float(leaf.hyperparams["learning_rate"]))
    assert rates == pytest.approx([3e-4, 3e-4])


def _adam_states(opt_state, partition):
    inner = next(
        s
        for s in jax.tree.leaves(
            opt_state, is_leaf=lambda x: isinstance(x, optax.MultiTransformState)
        )
        if isinstance(s, optax.MultiTransformState)
    ).inner_states[partition]
    return [
        s
        for s in jax.tree.leaves(inner, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
        if isinstance(s, optax.ScaleByAdamState)
    ]


def _trained_state(opt, params, steps=3):
    state = opt.init(params)
    for i in range(steps):
        _, state = opt.update(_grads(jax.random.PRNGKey(10 + i)), state, params)
    return state


def test_o3_scale_adam_moments_halves_main_mu_and_nu_exactly():
    params = _params()
    opt = make_optimizer(LABELS, lr=1e-3, clip_norm=10.0)
    state = _trained_state(opt, params)
    scaled = scale_adam_moments(state, 0.5)
    for part in ("trunk", "branches"):
        (old,), (new,) = _adam_states(state, part), _adam_states(scaled, part)
        assert int(new.count) == int(old.count) == 3
        for field in ("mu", "nu"):
            old_leaves = jax.tree.leaves(getattr(old, field))
            new_leaves = jax.tree.leaves(getattr(new, field))
            assert old_leaves and all(np.any(np.asarray(x) != 0) for x in old_leaves)
            for o, n in zip(old_leaves, new_leaves, strict=True):
                np.testing.assert_array_equal(np.asarray(n), np.asarray(o) * 0.5)
    (old,), (new,) = _adam_states(state, "aux"), _adam_states(scaled, "aux")
    for o, n in zip(jax.tree.leaves(old), jax.tree.leaves(new), strict=True):
        np.testing.assert_array_equal(np.asarray(n), np.asarray(o))


def test_o4_reset_branch_moments_gives_a_fresh_adam_step_for_branches_only():
    params = _params()
    opt = make_optimizer(LABELS, lr=1e-3, clip_norm=10.0)
    state = _trained_state(opt, params)
    reset = reset_branch_moments(state)
    (branch,) = _adam_states(reset, "branches")
    assert int(branch.count) == 0
    assert all(not np.any(np.asarray(x)) for x in jax.tree.leaves((branch.mu, branch.nu)))
    assert int(_adam_states(reset, "trunk")[0].count) == 3

    grads = _grads(jax.random.PRNGKey(99))
    after_reset, _ = opt.update(grads, reset, params)
    without_reset, _ = opt.update(grads, state, params)
    fresh, _ = opt.update(grads, opt.init(params), params)
    for name in ("branch_direction", "branch_magnitude"):
        np.testing.assert_allclose(
            after_reset["main"][name]["w"], fresh["main"][name]["w"], rtol=1e-6
        )
        assert not np.allclose(without_reset["main"][name]["w"], fresh["main"][name]["w"])
    for tree in ("trunk",):
        for a, b in zip(
            jax.tree.leaves(after_reset["main"][tree]),
            jax.tree.leaves(without_reset["main"][tree]),
            strict=True,
        ):
            np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(
        after_reset["aux"]["denoiser"]["w"], without_reset["aux"]["denoiser"]["w"]
    )
    np.testing.assert_array_equal(after_reset["xlstm"]["w"], without_reset["xlstm"]["w"])
    # The learning rate survives the reset.
    assert float(get_learning_rate(reset)) == pytest.approx(1e-3)


def test_o1_flat_partitions_give_the_same_updates_through_o2_o3_o4():
    """optim.flat: each partition over one raveled vector (and the clip's norm over one) gives
    the per-leaf updates to float rounding (Adam and SGD are elementwise; XLA's CPU vector code
    differs by an ulp), and the O2–O4 helpers act on its state as on the per-leaf one."""
    params = _params()
    per_leaf = make_optimizer(LABELS, lr=1e-3, clip_norm=1.0)
    flat = make_optimizer(LABELS, lr=1e-3, clip_norm=1.0, flat=True)
    s_leaf, s_flat = per_leaf.init(params), flat.init(params)
    (adam,) = _adam_states(s_flat, "trunk")
    assert [x.ndim for x in jax.tree.leaves(adam.mu)] == [1]  # one vector, not one per leaf

    steps = [
        lambda s: s,
        lambda s: set_learning_rate(s, jnp.float32(2e-4)),  # O2
        lambda s: scale_adam_moments(s, 0.5),  # O3
        reset_branch_moments,  # O4
        lambda s: s,
    ]
    for i, step in enumerate(steps):
        s_leaf, s_flat = step(s_leaf), step(s_flat)
        grads = _grads(jax.random.PRNGKey(20 + i), scale=3.0 if i == 0 else 0.1)
        u_leaf, s_leaf = per_leaf.update(grads, s_leaf, params)
        u_flat, s_flat = flat.update(grads, s_flat, params)
        for a, b in zip(jax.tree.leaves(u_leaf), jax.tree.leaves(u_flat), strict=True):
            # atol 1e-10 (1e-7 of the learning rate): the flat clip's norm differs from the
            # per-leaf one by an ulp, which Adam's moment arithmetic can carry into the
            # smallest updates (one of 6 elements at 1.3e-11 on the CPU)
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=4e-7, atol=1e-10)
    assert float(get_learning_rate(s_flat)) == pytest.approx(2e-4)
    (branch,) = _adam_states(s_flat, "branches")
    assert int(branch.count) == 2  # reset before the 4th of 5 updates


def _reduce_sums(fn, *args) -> list[tuple[int, ...]]:
    """The input shapes of every ``reduce_sum`` in ``fn``'s jaxpr (nested jaxprs included)."""
    shapes = []

    def visit(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "reduce_sum":
                shapes.append(tuple(eqn.invars[0].aval.shape))
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                visit(sub)

    visit(jax.make_jaxpr(fn)(*args).jaxpr)
    return shapes


def test_o1_flat_clip_is_one_reduction_over_the_joint_vector_and_equals_optax_s_clip():
    """clip_by_joint_norm (optim.flat's clip): ‖g‖ as one sum over the raveled main gradients
    (one reduce_sum of the leaves' total size, where optax's clip sums leaf by leaf), and the
    same clipped updates as optax.clip_by_global_norm, clipped (norm 3× the limit) or not."""
    grads = _main(_grads(jax.random.PRNGKey(3), scale=3.0))
    total = sum(x.size for x in jax.tree.leaves(grads))
    joint, optax_clip = clip_by_joint_norm(1.0), optax.clip_by_global_norm(1.0)
    assert _reduce_sums(lambda g: joint.update(g, ())[0], grads) == [(total,)]
    per_leaf = _reduce_sums(lambda g: optax_clip.update(g, ())[0], grads)
    assert len(per_leaf) == len(jax.tree.leaves(grads)) and (total,) not in per_leaf
    for limit in (1.0, 10 * _norm(grads)):
        got, _ = clip_by_joint_norm(limit).update(grads, ())
        want, _ = optax.clip_by_global_norm(limit).update(grads, ())
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
    assert _norm(clip_by_joint_norm(1.0).update(grads, ())[0]) == pytest.approx(1.0, rel=1e-6)
    assert clip_by_joint_norm(1.0).update({}, ())[0] == {}


def test_o1_flat_optimiser_takes_empty_partitions():
    """optim.flat with partitions that hold no parameter (every component off: no aux, no
    xLSTM) initialises and updates like the per-leaf optimiser, and O2–O4 still find the main
    partitions (optax cannot ravel an empty tree: this was a crash at init)."""
    params = {"main": _params()["main"]}
    grads = {"main": _main(_grads(jax.random.PRNGKey(5), scale=3.0))}
    per_leaf = make_optimizer(LABELS, lr=1e-3, clip_norm=1.0)
    flat = make_optimizer(LABELS, lr=1e-3, clip_norm=1.0, flat=True)
    s_leaf, s_flat = per_leaf.init(params), flat.init(params)
    s_leaf, s_flat = (reset_branch_moments(scale_adam_moments(s, 0.5)) for s in (s_leaf, s_flat))
    s_flat = set_learning_rate(s_flat, jnp.float32(1e-3))
    u_leaf, _ = per_leaf.update(grads, s_leaf, params)
    u_flat, _ = jax.jit(flat.update)(grads, s_flat, params)
    for a, b in zip(jax.tree.leaves(u_leaf), jax.tree.leaves(u_flat), strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=4e-7, atol=1e-10)
    (adam,) = _adam_states(s_flat, "trunk")
    assert [x.ndim for x in jax.tree.leaves(adam.mu)] == [1]
