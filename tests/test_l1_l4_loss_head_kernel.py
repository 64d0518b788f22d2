"""L1 + L4 + the online E[Q] as two Pallas kernels (pallas_kernels/c51_loss.py,
``kernels.loss_head``).

The kernels run in interpret mode on the CPU; set JAXDQN_KERNEL_BACKEND=pallas on a GPU to run
the same checks against the compiled Triton kernels. Lowering for CUDA (Pallas → Triton IR) is
checked on the CPU at the learner's size.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdqn.agent import losses as L
from jaxdqn.config import LossConfig
from jaxdqn.model.network import make_model
from pallas_kernels import fallbacks
from pallas_kernels.c51_loss import _loss_head, c51_loss_head, c51_loss_head_reference
from tests.test_losses import _MODEL_CFG, _OBS_DIM, _UNIT, _loss_inputs

BACKEND = os.environ.get("JAXDQN_KERNEL_BACKEND", "interpret")


def _inputs(groups: int, n: int, seed: int, actions: int = 3):
    k = jax.random.split(jax.random.PRNGKey(seed), 5)
    return (
        3.0 * jax.random.normal(k[0], (groups, actions, n)),
        jax.random.randint(k[1], (groups,), 0, actions),
        jax.nn.softmax(2.0 * jax.random.normal(k[2], (groups, n))),
        jax.random.uniform(k[3], (groups,), minval=-2.0, maxval=-1.0),
        jax.random.uniform(k[4], (groups,), minval=0.05, maxval=0.2),
    )


def _by_hand(logits, actions, target, v_min, dz):
    """float64 numpy: log-softmax, the taken action's cross-entropy, entropies, E[Z]."""
    x = np.asarray(logits, np.float64)
    log_p = x - x.max(-1, keepdims=True)
    log_p -= np.log(np.exp(log_p).sum(-1, keepdims=True))
    p = np.exp(log_p)
    g = np.arange(x.shape[0])
    ce = -(np.asarray(target, np.float64) * log_p[g, np.asarray(actions)]).sum(-1)
    h = -(p * log_p).sum(-1)
    z = np.asarray(v_min, np.float64)[:, None, None] + np.asarray(dz, np.float64)[
        :, None, None
    ] * np.arange(x.shape[-1])
    return ce, h, (p * z).sum(-1)


@pytest.mark.parametrize("shape", [(67, 51), (16, 51), (40, 11), (33, 64)], ids=str)
def test_l1_loss_head_kernel_equals_float64_and_the_jnp_reference(shape):
    """Ragged group counts (67 = 4 programs of 16 + 3), padded atoms (51 → 64, 11 → 16) and
    none (64)."""
    args = _inputs(*shape, seed=sum(shape))
    got = c51_loss_head(*args, backend=BACKEND, groups=16)
    assert not fallbacks()
    for a, b in zip(got, _by_hand(*args), strict=True):
        assert a.shape == b.shape and a.dtype == jnp.float32
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)
    for a, b in zip(got, c51_loss_head_reference(*args), strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


def test_l4_loss_head_kernel_on_flat_and_peaked_rows():
    """Hand values: flat logits give H = log N, E[Z] = v_min + Δz (N − 1)/2 and, against a
    one-hot target, ce = log N; a row peaked far beyond float32's exp range gives H = 0 and
    E[Z] at the peak's atom, with no NaN from its zero probabilities."""
    g, n = 20, 51
    logits = jnp.zeros((g, 3, n)).at[10:, :, 7].set(1e4)
    actions = jnp.arange(g, dtype=jnp.int32) % 3
    target = jax.nn.one_hot(jnp.full((g,), 3), n)
    v_min, dz = jnp.full((g,), -1.0), jnp.full((g,), 0.1)
    ce, h, q = c51_loss_head(logits, actions, target, v_min, dz, backend=BACKEND, groups=16)
    np.testing.assert_allclose(ce[:10], np.log(n), rtol=1e-6)
    np.testing.assert_allclose(h[:10], np.log(n), rtol=1e-6)
    np.testing.assert_allclose(q[:10], -1.0 + 0.1 * (n - 1) / 2, rtol=1e-6)
    np.testing.assert_allclose(h[10:], 0.0, atol=1e-6)
    np.testing.assert_allclose(q[10:], -1.0 + 0.1 * 7, rtol=1e-6)
    np.testing.assert_allclose(ce[10:], 1e4, rtol=1e-6)  # −log p_3 = x_7 − x_3
    grad = jax.grad(
        lambda x: jnp.sum(sum(jnp.sum(o) for o in c51_loss_head(
            x, actions, target, v_min, dz, backend=BACKEND, groups=16)[:2]))
    )(logits)  # fmt: skip
    assert np.all(np.isfinite(grad))


def test_l1_l4_loss_head_kernel_gradients_equal_the_reference_autodiff_and_finite_differences():
    """The backward kernel against jax.grad of the jnp reference for random cotangents on ce
    and H (Q carries no gradient: its cotangent is ignored by both), and one coordinate against
    a central finite difference of the kernel's own forward."""
    logits, actions, target, v_min, dz = _inputs(37, 51, seed=3)
    k1, k2 = jax.random.split(jax.random.PRNGKey(9))
    w_ce, w_h = jax.random.normal(k1, (37,)), jax.random.normal(k2, (37, 3))

    def objective(x, backend):
        ce, h, q = c51_loss_head(x, actions, target, v_min, dz, backend=backend, groups=16)
        return jnp.sum(w_ce * ce) + jnp.sum(w_h * h) + 0.0 * jnp.sum(q)

    got = jax.grad(objective)(logits, BACKEND)
    ref = jax.grad(objective)(logits, "reference")
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=2e-6)
    assert float(jnp.max(jnp.abs(ref))) > 0.1
    # the taken action's rows carry the cross-entropy's gradient, the others only the entropy's
    i, eps = (5, int(actions[5]), 20), 1e-2
    bump = jnp.zeros_like(logits).at[i].set(eps)
    fd = (objective(logits + bump, BACKEND) - objective(logits - bump, BACKEND)) / (2 * eps)
    np.testing.assert_allclose(got[i], fd, rtol=2e-2, atol=2e-3)


def test_m6_l1_dueling_loss_head_kernel_equals_the_reference_on_the_heads_outputs():
    """``dueling=True`` reads ``[v | A_0 | A_1 | A_2]`` and combines them in the kernels: the
    values are the logits kernel's on ``v + A_j − mean A`` (by hand, float64), and the heads'
    cotangent is the reference's autodiff through M6's combination (dv = Σ_j dx_j, dA_j = dx_j
    − mean_k dx_k); without the combination's mean (a plain v + A_j) the values would differ."""
    _, actions, target, v_min, dz = _inputs(37, 51, seed=5)
    heads = 2.0 * jax.random.normal(jax.random.PRNGKey(11), (37, 4, 51))
    x = np.asarray(heads, np.float64)
    by_hand = x[:, :1] + x[:, 1:] - x[:, 1:].mean(1, keepdims=True)
    got = c51_loss_head(heads, actions, target, v_min, dz, dueling=True, backend=BACKEND, groups=16)
    for a, b in zip(got, _by_hand(by_hand, actions, target, v_min, dz), strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)
    plain = c51_loss_head(heads[:, :1] + heads[:, 1:], actions, target, v_min, dz, backend=BACKEND)
    assert float(jnp.max(jnp.abs(plain[0] - got[0]))) > 1e-2
    k1, k2 = jax.random.split(jax.random.PRNGKey(2))
    w_ce, w_h = jax.random.normal(k1, (37,)), jax.random.normal(k2, (37, 3))

    def objective(y, backend):
        ce, h, _ = c51_loss_head(
            y, actions, target, v_min, dz, dueling=True, backend=backend, groups=16
        )
        return jnp.sum(w_ce * ce) + jnp.sum(w_h * h)

    grad = jax.grad(objective)(heads, BACKEND)
    ref = jax.grad(objective)(heads, "reference")
    np.testing.assert_allclose(grad, ref, rtol=1e-4, atol=2e-6)
    # the advantages' cotangents sum to 0 over the actions (the mean is subtracted)
    np.testing.assert_allclose(jnp.sum(grad[:, 1:], axis=1), 0.0, atol=1e-5)


@pytest.mark.parametrize("dueling", [False, True], ids=["logits", "dueling"])
def test_l1_loss_head_kernel_reads_padded_segments_and_ignores_the_padding(dueling):
    """Segments padded from 51 to 64 lanes (``dueling_padded``'s heads) with garbage past the
    atoms: the same values and cotangents as the packed segments, a zero cotangent on the
    padding."""
    _, actions, target, v_min, dz = _inputs(37, 51, seed=8)
    x = 2.0 * jax.random.normal(jax.random.PRNGKey(4), (37, 4 if dueling else 3, 51))
    padded = jnp.pad(x, ((0, 0), (0, 0), (0, 13)), constant_values=1e3)
    run = lambda y: c51_loss_head(
        y, actions, target, v_min, dz, dueling=dueling, backend=BACKEND, groups=16
    )
    for a, b in zip(run(padded), run(x), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    loss = lambda y: jnp.sum(run(y)[0]) + jnp.sum(run(y)[1])
    g_pad, g = jax.grad(loss)(padded), jax.grad(loss)(x)
    np.testing.assert_allclose(g_pad[..., :51], g, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(g_pad[..., 51:], 0.0)
    with pytest.raises(ValueError, match="disagree"):
        run(padded[..., :60])


@pytest.mark.parametrize(("groups", "warps"), [(64, 4), (16, 8)], ids=["64x4", "16x8"])
def test_l1_loss_head_kernels_under_vmap_are_each_member_s_own_calls(groups, warps):
    """The learning runs vmap the learner over a seed population: the batched forward and
    backward kernels give each member its own call's values and heads' cotangents (padded
    dueling segments, as ``dueling_padded``), at the default tiling and the learning runs'
    16 × 8. Members hold different inputs; Δz is shared (not batched)."""
    members = []
    for m in range(3):
        _, actions, target, v_min, dz = _inputs(70, 51, seed=20 + m)
        heads = jax.random.normal(jax.random.PRNGKey(30 + m), (70, 4, 51))
        members.append((jnp.pad(heads, ((0, 0), (0, 0), (0, 13))), actions, target, v_min))
    x, actions, target, v_min = (jnp.stack(parts) for parts in zip(*members, strict=True))
    w = jax.random.normal(jax.random.PRNGKey(1), (70, 3))

    def objective(y, a, t, lo, step):
        ce, h, q = c51_loss_head(
            y, a, t, lo, step, dueling=True, backend=BACKEND, groups=groups, num_warps=warps
        )
        return jnp.sum(ce) + jnp.sum(w * h), (ce, h, q)

    both = jax.value_and_grad(objective, has_aux=True)
    (_, got), grads = jax.jit(jax.vmap(both, in_axes=(0, 0, 0, 0, None)))(
        x, actions, target, v_min, dz
    )
    for m in range(3):
        (_, own), own_grad = both(x[m], actions[m], target[m], v_min[m], dz)
        for a, b in zip(got, own, strict=True):
            np.testing.assert_allclose(a[m], b, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(grads[m], own_grad, rtol=1e-6, atol=1e-7)
    assert float(jnp.max(jnp.abs(got[0][0] - got[0][1]))) > 1e-2  # the members differ


def test_l1_loss_head_kernel_takes_no_gradient_to_the_target_and_refuses_bad_shapes():
    logits, actions, target, v_min, dz = _inputs(16, 11, seed=1)
    gt = jax.grad(
        lambda m: jnp.sum(c51_loss_head(logits, actions, m, v_min, dz, backend=BACKEND)[0])
    )(target)
    np.testing.assert_array_equal(gt, 0.0)
    with pytest.raises(ValueError, match="disagree"):
        c51_loss_head(logits, actions[:5], target, v_min, dz, backend=BACKEND)
    with pytest.raises(ValueError, match="backend"):
        c51_loss_head(logits, actions, target, v_min, dz, backend="cuda")


@pytest.mark.parametrize("dueling", [False, True], ids=["logits", "dueling"])
def test_l1_loss_head_kernels_lower_to_triton_at_the_learner_s_size(dueling):
    """Pallas → Triton IR for CUDA on the CPU at B = 4,096 × 4 branches: one forward and one
    backward kernel in the differentiated program."""
    g = 4096 * 4
    f32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    acts = jax.ShapeDtypeStruct((g,), jnp.int32)

    def loss(x, a, m, v, d):
        ce, h, _ = _loss_head(x, a, m, v, d, dueling, False, 64, 4)
        return jnp.sum(ce) + jnp.sum(h)

    fn = jax.jit(jax.grad(loss))
    text = fn.trace(f32(g, 4 if dueling else 3, 51), acts, f32(g, 51), f32(g), f32(g)).lower(
        lowering_platforms=("cuda",)
    )
    assert text.as_text().count("__gpu$xla.gpu.triton") == 2


@pytest.mark.parametrize("spread", [False, True], ids=["l3_off", "l3_on"])
def test_l1_make_loss_with_the_loss_head_kernel_equals_the_reference(spread):
    """The whole loss (every term on, L3 as given) with ``kernels.loss_head`` interpreted
    against the reference: total, every part and the parameters' gradients to float
    rounding; the utilisation (mean exp H / N of the kernel's entropies against the
    reference's clipped-probability entropies) too."""
    model = make_model(_MODEL_CFG, _OBS_DIM, kan_backend="reference")
    lc = LossConfig(spread=spread)
    params, inputs = _loss_inputs(model)
    results = {}
    for head in ("reference", BACKEND):
        loss = L.make_loss(lc, _MODEL_CFG, model, max_gap=lc.spread_max_gap * _UNIT, head=head)
        fn = jax.value_and_grad(loss.loss, has_aux=True)
        jaxpr = str(jax.make_jaxpr(fn)(params, inputs, loss.coefficients))
        assert ("pallas_call" in jaxpr) == (head != "reference"), head
        results[head] = jax.jit(fn)(params, inputs, loss.coefficients)
    (t_ref, p_ref), g_ref = results["reference"]
    (t_got, p_got), g_got = results[BACKEND]
    np.testing.assert_allclose(t_got, t_ref, rtol=1e-5)
    for name in ("c51", "spread", "entropy", "denoise", "coord", "select", "xlstm",
                 "per_sample", "q_mean", "utilisation", "mean_entropy"):  # fmt: skip
        np.testing.assert_allclose(
            getattr(p_got, name), getattr(p_ref, name), rtol=1e-5, atol=1e-6, err_msg=name
        )
    assert float(p_ref.entropy) != 0.0 and float(p_ref.c51) > 0.0
    for a, b in zip(jax.tree.leaves(g_got), jax.tree.leaves(g_ref), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    ("m5", "width"), [(True, 0), (False, 0), (True, 16)], ids=["m5_on", "m5_off", "m5_on_padded"]
)
def test_m6_l1_make_loss_with_the_dueling_loss_head_equals_the_reference(m5, width):
    """The fused branches' model made with ``raw_heads`` gives the heads' ``[v | A]`` (the
    per-branch modules' parameters: the same model), and the whole loss with
    ``kernels.loss_head=dueling`` interpreted — the logits never formed for L1, L4 and E[Q] —
    equals the reference loss of the logits in value, parts and every parameter's gradient, with
    M5's conditioned magnitude branch (heads stacked from two calls) and without it; and with
    each of ``[v | A]`` padded to 16 columns (``dueling_padded`` at these 11 atoms: zero
    weights there, no gradient reaches them)."""
    import dataclasses

    cfg = dataclasses.replace(_MODEL_CFG, dir_conditioning=m5)
    n = _MODEL_CFG.num_atoms
    raw = make_model(cfg, _OBS_DIM, kan_backend="reference", fused=True, raw_heads=width or n)
    plain = make_model(cfg, _OBS_DIM, kan_backend="reference", fused=True)
    lc = LossConfig(spread=True)
    params, inputs = _loss_inputs(plain)
    out = raw.apply(params, inputs.obs, inputs.v_min, inputs.delta_z)
    assert out.heads is not None and out.heads.shape == (*out.logits.shape[:2], 4, width or n)
    if width:  # zero weights and biases past the atoms
        np.testing.assert_array_equal(out.heads[..., n:], 0.0)
    v, adv = out.heads[:, :, :1, :n], out.heads[:, :, 1:, :n]
    np.testing.assert_allclose(v + adv - adv.mean(2, keepdims=True), out.logits, atol=1e-5)
    assert plain.apply(params, inputs.obs, inputs.v_min, inputs.delta_z).heads is None
    results = {}
    mode = "dueling_padded_interpret" if width else "dueling_interpret"
    for model, head in ((plain, "reference"), (raw, mode)):
        loss = L.make_loss(lc, cfg, model, max_gap=lc.spread_max_gap * _UNIT, head=head)
        fn = jax.value_and_grad(loss.loss, has_aux=True)
        results[head] = jax.jit(fn)(params, inputs, loss.coefficients)
    (t_ref, p_ref), g_ref = results["reference"]
    (t_got, p_got), g_got = results[mode]
    np.testing.assert_allclose(t_got, t_ref, rtol=1e-5)
    for name in ("c51", "spread", "entropy", "per_sample", "q_mean", "utilisation"):
        np.testing.assert_allclose(
            getattr(p_got, name), getattr(p_ref, name), rtol=1e-5, atol=1e-6, err_msg=name
        )
    for a, b in zip(jax.tree.leaves(g_got), jax.tree.leaves(g_ref), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_l1_loss_head_setting_resolves_and_refuses_unknown_backends():
    from jaxdqn.agent.resolve import loss_head_kernels

    assert loss_head_kernels("auto") == "reference"
    assert loss_head_kernels("pallas") == "pallas"
    with pytest.raises(ValueError, match=r"kernels\.loss_head"):
        L.loss_head(None, None, "triton")
