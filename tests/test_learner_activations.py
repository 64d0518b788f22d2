"""kernels.learner_activations=bf16: the learner's network passes with bfloat16 operands and
activations (:func:`jaxdqn.model.dense.bf16_affine`), float32 logits and float32 parameter
gradients; checked against hand-computed bfloat16 products and against the float32 model."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_network import ALL_OFF, CFG, OBS_DIM

from jaxdqn.model import dense
from jaxdqn.model import network as N

BF = jnp.bfloat16
B = 32


def _f64(x):
    return np.asarray(jnp.asarray(x, jnp.float32), np.float64)


def _rounded(x):
    """``x`` rounded to bfloat16, as float64."""
    return _f64(jnp.asarray(x).astype(BF))


def _layer_inputs():
    ks = jax.random.split(jax.random.PRNGKey(0), 4)
    x = jax.random.normal(ks[0], (B, 40), jnp.float32)
    w = 0.2 * jax.random.normal(ks[1], (40, 24), jnp.float32)
    b = jax.random.normal(ks[2], (24,), jnp.float32)
    return x, w, b, ks[3]


@pytest.mark.parametrize("gemm_bias", [False, True])
def test_m1_bf16_affine_is_bfloat16_products_with_float32_parameter_gradients(gemm_bias):
    """Forward ``bf16(bf16(x) bf16(W)) + bf16(b)`` in bfloat16; backward ``dx = bf16(dy)
    bf16(W)ᵀ`` rounded to bfloat16 (x's dtype: float32 here), ``dW = bf16(x)ᵀ bf16(dy)`` and
    ``db = Σ dy`` as float32 sums (not rounded to bfloat16: checked to 1e-5, 100× finer than a
    bfloat16 ulp). Both bias-gradient formulations (the ones-product the accelerators use and
    the column sum)."""
    x, w, b, k = _layer_inputs()
    fn = lambda x, w, b: dense._bf16_layer(x, w, b, False, gemm_bias)
    y, vjp = jax.vjp(fn, x, w, b)
    assert y.dtype == BF
    want = _rounded(_rounded(x) @ _rounded(w)) + _rounded(b)
    np.testing.assert_allclose(_f64(y), want, rtol=2**-7, atol=2**-7)
    dy = jax.random.normal(k, y.shape, jnp.float32).astype(BF)
    dx, dw, db = vjp(dy)
    assert (dx.dtype, dw.dtype, db.dtype) == (jnp.float32, jnp.float32, jnp.float32)
    np.testing.assert_allclose(_f64(dx), _rounded(_f64(dy) @ _rounded(w).T), rtol=2**-7, atol=1e-6)
    np.testing.assert_allclose(_f64(dw), _rounded(x).T @ _f64(dy), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_f64(db), _f64(dy).sum(0), rtol=1e-5, atol=1e-5)
    # a bfloat16 input gets a bfloat16 cotangent (the activations' gradients stay bfloat16)
    assert jax.vjp(fn, x.astype(BF), w, b)[1](dy)[0].dtype == BF


def test_m1_bf16_affine_wide_gives_float32_and_linear_has_no_bias():
    """``wide``: the float32 product of the bfloat16 operands plus the float32 bias (the heads'
    logits); its float32 cotangent's bias sum is exact to float32. Inside
    ``activations("bf16")``, :func:`affine` and :func:`linear` are :func:`bf16_affine` (outside,
    the float32 layers, at full float32 precision here: a bfloat16 product would fail the 1e-6
    check, and a GPU's default float32 precision (TF32) would too)."""
    x, w, b, k = _layer_inputs()
    with dense.activations("bf16", "kernels.learner_activations"):
        y, vjp = jax.vjp(lambda x, w, b: dense.affine(x, w, b, wide=True), x, w, b)
        bare = dense.linear(x, w)
    assert y.dtype == jnp.float32 and bare.dtype == BF
    np.testing.assert_allclose(_f64(y), _rounded(x) @ _rounded(w) + _f64(b), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_f64(bare), _f64(y) - _f64(b), rtol=2**-7, atol=2**-7)
    dy = jax.random.normal(k, y.shape, jnp.float32)
    _, dw, db = vjp(dy)
    np.testing.assert_allclose(_f64(dw), _rounded(x).T @ _rounded(dy), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_f64(db), _f64(dy).sum(0), rtol=1e-5, atol=1e-5)
    with jax.default_matmul_precision("highest"):
        f32 = dense.affine(x, w, b)
    assert f32.dtype == jnp.float32
    np.testing.assert_allclose(_f64(f32), _f64(x) @ _f64(w) + _f64(b), rtol=1e-6, atol=1e-5)
    with pytest.raises(ValueError, match=r"kernels\.learner_activations: 'f16'"):
        dense.activations("f16", "kernels.learner_activations")


def _loss(model, params, obs, target):
    """A C51 cross-entropy against fixed target distributions (the learner's loss form)."""
    out = model.apply(params, obs, -1.0, 0.2)
    return -jnp.mean(jnp.sum(target * jax.nn.log_softmax(out.logits, axis=-1), axis=-1))


@functools.cache
def _params(cfg):
    """Perturbed parameters of ``cfg``'s model: one tree for every path (the fused branches and
    the per-branch modules share it), initialised by the per-branch modules (no kernels)."""
    params = N.make_model(cfg, OBS_DIM, fused=False).init(jax.random.PRNGKey(3))
    rng = np.random.default_rng(4)
    return jax.tree.map(
        lambda p: p + jnp.asarray(0.3 * rng.standard_normal(p.shape), p.dtype), params
    )


# Every path a bfloat16 `h_m` takes through the branches (the gate kernel, the reference gate,
# the GEMM kernel, the per-branch modules); all off adds nothing to the fused paths but time.
MODELS = {
    "all_on_fused_gate_kernel": (CFG, dict(fused=True, gated="gate_interpret")),
    "all_on_fused_reference": (CFG, dict(fused=True, gated="reference")),
    "all_on_fused_gemm_kernel": (CFG, dict(fused=True, gated="interpret")),
    "all_on_per_branch": (CFG, dict(fused=False)),
    "all_off_per_branch": (ALL_OFF, dict(fused=False)),
}


@functools.cache
def _float32_model(cfg):
    """``(model, outputs, target, gradients)`` of the float32 per-branch model on the test batch
    (the float32 fused paths equal it to float rounding: tests/test_network.py), computed once a
    configuration."""
    m32 = N.make_model(cfg, OBS_DIM, fused=False)
    params, obs = _params(cfg), _batch()
    assert "bf16[" not in str(jax.make_jaxpr(lambda p: m32.apply(p, obs, -1.0, 0.2))(params))
    want = jax.jit(m32.apply)(params, obs, -1.0, 0.2)
    target = jax.nn.softmax(jax.random.normal(jax.random.PRNGKey(6), want.logits.shape), -1)
    grads = jax.jit(jax.grad(lambda p: _loss(m32, p, obs, target)))(params)
    return m32, want, target, grads


def _batch():
    return jax.random.normal(jax.random.PRNGKey(5), (B, OBS_DIM), jnp.float32)


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=() if n == "all_off_per_branch" else pytest.mark.slow) for n in MODELS],
)
def test_m1_m6_learner_activations_bf16_runs_apply_in_bfloat16_near_the_float32_model(name):
    """kernels.learner_activations=bf16: ``apply``'s trunk (M1), VSN (M2) and branch (M3) products
    are bfloat16 ``dot_general``s; the logits, M7's statistics and the returned features stay
    float32 and are within bfloat16's rounding through the layers of the float32 model's; the
    loss's parameter gradients are float32 and point where the float32 model's do (cosine
    ≥ 0.99 a tensor, norms within 10 %). ``act`` (acting_activations f32) is the float32
    model's bit for bit."""
    cfg, kw = MODELS[name]
    m16 = N.make_model(cfg, OBS_DIM, learner_activations="bf16", **kw)
    m32, want, target, g32 = _float32_model(cfg)
    params, obs = _params(cfg), _batch()
    text = str(jax.make_jaxpr(lambda p: m16.apply(p, obs, -1.0, 0.2))(params))
    for width in (cfg.sh1, cfg.sh2):  # the trunk's fc1 and fc2
        assert f"bf16[{B},{width}] = dot_general" in text, (width, text)
    got = jax.jit(m16.apply)(params, obs, -1.0, 0.2)  # compiled: interpreted kernels run faster
    # bfloat16 rounds each layer's output by up to 2^-9 relative: ~1–2 % of the logits' and
    # features' scale after five layers; the probabilities (peaked: logits up to ~50 with these
    # perturbed parameters) and E[Q] move by less than half an atom spacing (Δz = 0.2)
    for field, tol, relative in (
        ("logits", 2.5e-2, True),
        ("features", 2.5e-2, True),
        ("selectivity", 1e-2, False),
        ("probs", 0.1, False),
        ("q_mean", 0.1, False),
    ):
        a, c = getattr(got, field), getattr(want, field)
        assert a.dtype == jnp.float32, field
        err = float(jnp.max(jnp.abs(a - c))) / (float(jnp.max(jnp.abs(c))) if relative else 1.0)
        assert err < tol, (field, err)
    assert not np.array_equal(got.logits, want.logits)  # the setting changed the numbers
    g16 = jax.jit(jax.grad(lambda p: _loss(m16, p, obs, target)))(params)
    for (path, a), c in zip(
        jax.tree_util.tree_leaves_with_path(g16), jax.tree.leaves(g32), strict=True
    ):
        assert a.dtype == jnp.float32, path
        na, nc = float(jnp.linalg.norm(a)), float(jnp.linalg.norm(c))
        if nc < 1e-6:  # a parameter the loss does not reach (M12, M8–M13 here)
            assert na < 1e-6, path
            continue
        cosine = float(jnp.vdot(a.ravel(), c.ravel())) / (na * nc)
        assert cosine > 0.99 and abs(na / nc - 1) < 0.1, (
            jax.tree_util.keystr(path),
            cosine,
            na / nc,
        )
    if kw["fused"]:  # `act`'s context is the model's, whichever path: checked per branch
        return
    obs_a = (obs, -1.0, 0.2)
    for a, c in zip(*(jax.jit(m.act)(params, *obs_a) for m in (m16, m32)), strict=True):
        np.testing.assert_array_equal(a, c)
