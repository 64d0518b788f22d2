"""M1–M7, M12: the branching dueling C51 network against an independent float64 numpy forward.

Small sizes keep the suite fast on CPU. Zero-initialised parameters (VSN last layer, KAN
coefficients) are perturbed where a test must see a non-trivial value.
"""

from __future__ import annotations

import dataclasses
import functools
import re

import chex
import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from absl.testing import parameterized

from jaxdqn.config import SWITCHES, ModelConfig
from jaxdqn.model import distribution as D
from jaxdqn.model import fused_branches as fused_branches_lib
from jaxdqn.model import gated as gated_lib
from jaxdqn.model import network as N
from pallas_kernels import kan_gate_reference

OBS_DIM = 24
CFG = ModelConfig(
    bottleneck_dim=16,
    sh1=32,
    sh2=16,
    ah=8,
    vsn_hidden=8,
    num_atoms=11,
    denoise_hidden=8,
    xlstm_hidden=4,
)
ALL_OFF = dataclasses.replace(CFG, **dict.fromkeys(SWITCHES["model"], False))
V_MIN, DZ = -1.0, 0.2


def _perturb(tree, key, scale=0.3):
    """Adds N(0, scale²) noise to every leaf (numpy RNG seeded by ``key``: no compilation)."""
    rng = np.random.default_rng(int(jax.random.randint(key, (), 0, 2**31 - 1)))
    return jax.tree_util.tree_map(
        lambda x: x + jnp.asarray(scale * rng.standard_normal(x.shape), x.dtype), tree
    )


B = 6  # the batch of the numeric tests (one compile of the jitted forward per configuration)


@functools.cache
def _fwd(model):
    """The model's jitted forward pass."""
    return jax.jit(model.apply)


def _obs(b, key=1):
    return jax.random.normal(jax.random.PRNGKey(key), (b, OBS_DIM), jnp.float32)


# --------------------------------------------------------------------------------------------
# An independent numpy (float64) forward pass of the main network, written from docs/DESIGN.md.
# --------------------------------------------------------------------------------------------


def _np(x):
    return np.asarray(x, np.float64)


def _dense(p, x):
    return x @ _np(p["kernel"]) + _np(p["bias"])


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def np_forward(params, obs, v_min, dz, cfg):
    """Returns dict with h (trunk), mask, h_m, a (branch hidden), logits, probs, sel."""
    m = params["main"]
    x = _np(obs)
    if "bottleneck" in m["trunk"]:
        x = _dense(m["trunk"]["bottleneck"], x)
    h = _silu(_dense(m["trunk"]["fc2"], _silu(_dense(m["trunk"]["fc1"], x))))
    if cfg.vsn:
        mask = _sigmoid(_dense(m["vsn"]["fc2"], _silu(_dense(m["vsn"]["fc1"], h))))
    else:
        mask = np.ones_like(h)
    h_m = mask * h
    z = v_min + dz * np.arange(cfg.num_atoms)

    def branch(bp, inp):
        u = _dense(bp["value"], inp)
        g = _dense(bp["gate"], inp)
        if cfg.kan:
            gate = _np(
                kan_gate_reference(
                    jnp.asarray(g, jnp.float32),
                    bp["kan"]["coeffs"],
                    bp["kan"]["w_res"],
                    grid_min=cfg.kan_grid_min,
                    grid_max=cfg.kan_grid_max,
                )
            )
        else:
            gate = _sigmoid(g)
        a = u * gate
        v = _dense(bp["head_value"], a)[:, None, :]
        adv = _dense(bp["head_advantage"], a).reshape(len(a), 3, -1)
        return v + adv - adv.mean(1, keepdims=True), a

    lg_dir, a_dir = branch(m["branch_direction"], h_m)
    mag_in = h_m
    if cfg.dir_conditioning:
        q_dir = (_softmax(lg_dir) * z).sum(-1)
        mag_in = np.concatenate([h_m, q_dir / dz], -1)
    lg_mag, _ = branch(m["branch_magnitude"], mag_in)
    lg_ord, _ = branch(m["branch_order"], h_m)
    lg_urg, _ = branch(m["branch_urgency"], h_m)
    logits = np.stack([lg_dir, lg_mag, lg_ord, lg_urg], 1)
    sel = (
        _sigmoid(_dense(params["aux"]["selectivity"]["dense"], h))[:, 0]
        if cfg.selectivity
        else np.ones(len(h))
    )
    return {"h": h, "mask": mask, "h_m": h_m, "a_dir": a_dir, "logits": logits, "sel": sel}


def _switch_off(params, cfg):
    """The default configuration's parameters with the switched-off components removed."""
    main = {k: dict(v) for k, v in params["main"].items() if cfg.vsn or k != "vsn"}
    for b in N.BRANCH_KEYS:
        if not cfg.kan:
            main[b].pop("kan")
    if not cfg.dir_conditioning:
        for path in ("value", "gate"):
            p = main["branch_magnitude"][path]
            main["branch_magnitude"][path] = dict(p, kernel=p["kernel"][: cfg.sh2])
    aux = {
        k: v
        for k, v in params["aux"].items()
        if getattr(cfg, {"attention": "q_attention"}.get(k, k))
    }
    return {"main": main, "aux": aux, "xlstm": params["xlstm"] if cfg.xlstm else {}}


@functools.cache
def _build(cfg=CFG, obs_dim=OBS_DIM, seed=0):
    """(params, model). The default is initialised once (jitted); other switch settings reuse
    its parameters minus the switched-off parts, after checking that their own ``init`` gives
    exactly that tree structure and those shapes (by ``eval_shape``, which compiles nothing)."""
    model = N.make_model(cfg, obs_dim)
    if cfg == CFG and obs_dim == OBS_DIM:
        return jax.jit(model.init)(jax.random.PRNGKey(seed)), model
    params = _switch_off(_build(CFG, OBS_DIM, seed)[0], cfg)
    shapes = jax.eval_shape(model.init, jax.random.PRNGKey(seed))
    chex.assert_trees_all_equal_shapes_and_dtypes(params, shapes)
    return params, model


@pytest.fixture(scope="module")
def model_params():
    params, model = _build()
    return model, params


# --------------------------------------------------------------------------------------------
# Shapes and dtypes (jit and no-jit), two batch sizes.
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
class ShapesTest(chex.TestCase, parameterized.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(1, 5)
    def test_m1_output_shapes_and_dtypes(self, b):
        for cfg in (CFG, ALL_OFF):
            params, model = _build(cfg)
            fn = self.variant(lambda p, o, v, d, model=model: model.apply(p, o, v, d))
            out = fn(params, _obs(b), jnp.float32(V_MIN), jnp.float32(DZ))
            n = cfg.num_atoms
            chex.assert_shape(out.logits, (b, 4, 3, n))
            chex.assert_shape(out.probs, (b, 4, 3, n))
            chex.assert_shape(out.q_mean, (b, 4, 3))
            chex.assert_shape(out.q_var, (b, 4, 3))
            chex.assert_shape(out.quantiles, (b, 4, 3, 3))
            chex.assert_shape(out.features, (b, cfg.sh2))
            chex.assert_shape(out.selectivity, (b,))
            assert out.heads is None  # only a model made with raw_heads returns them
            chex.assert_type(list(out[:-1]), jnp.float32)
            chex.assert_tree_all_finite(out)


# --------------------------------------------------------------------------------------------
# M1 trunk with bottleneck
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_m1_trunk_matches_numpy_and_bottleneck_only_when_wider(model_params):
    model, params = model_params
    params = _perturb(params, jax.random.PRNGKey(3))
    obs = _obs(B)
    out = _fwd(model)(params, obs, V_MIN, DZ)
    ref = np_forward(params, obs, V_MIN, DZ, CFG)
    np.testing.assert_allclose(out.features, ref["h_m"], rtol=1e-4, atol=1e-5)
    assert params["main"]["trunk"]["bottleneck"]["kernel"].shape == (OBS_DIM, CFG.bottleneck_dim)
    assert params["main"]["trunk"]["fc1"]["kernel"].shape == (CFG.bottleneck_dim, CFG.sh1)
    # Observation narrower than the bottleneck: no bottleneck layer at all.
    narrow = jax.eval_shape(N.make_model(CFG, 8).init, jax.random.PRNGKey(0))
    assert "bottleneck" not in narrow["main"]["trunk"]
    assert narrow["main"]["trunk"]["fc1"]["kernel"].shape == (8, CFG.sh1)


# --------------------------------------------------------------------------------------------
# M2 VSN
# --------------------------------------------------------------------------------------------


def test_m2_vsn_mask_is_half_at_init_and_learnable(model_params):
    model, params = model_params
    obs = _obs(B)
    ref = np_forward(params, obs, V_MIN, DZ, CFG)
    out = _fwd(model)(params, obs, V_MIN, DZ)
    np.testing.assert_array_equal(ref["mask"], 0.5)
    np.testing.assert_allclose(out.features, 0.5 * ref["h"], rtol=1e-5, atol=1e-6)
    assert np.abs(ref["h"]).max() > 1e-2  # 0.5·h is distinguishable from h
    # A non-zero last layer gives a per-feature mask in (0, 1), not a softmax (sum ≠ 1).
    p2 = dict(
        params,
        main=dict(params["main"], vsn=_perturb(params["main"]["vsn"], jax.random.PRNGKey(4), 1.0)),
    )
    ref2 = np_forward(p2, obs, V_MIN, DZ, CFG)
    out2 = _fwd(model)(p2, obs, V_MIN, DZ)
    np.testing.assert_allclose(out2.features, ref2["h_m"], rtol=1e-4, atol=1e-5)
    assert ref2["mask"].std() > 0.05 and np.all((ref2["mask"] > 0) & (ref2["mask"] < 1))
    assert not np.allclose(ref2["mask"].sum(-1), 1.0)
    # Off: features are the raw trunk output and no VSN parameters exist.
    p_off, m_off = _build(dataclasses.replace(CFG, vsn=False))
    assert "vsn" not in p_off["main"]
    ref_off = np_forward(p_off, obs, V_MIN, DZ, dataclasses.replace(CFG, vsn=False))
    np.testing.assert_allclose(
        _fwd(m_off)(p_off, obs, V_MIN, DZ).features, ref_off["h"], rtol=1e-4, atol=1e-6
    )


# --------------------------------------------------------------------------------------------
# M3 branches (value ⊙ gate) and M6 dueling heads, against numpy
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kan", [True, False])
def test_m3_branches_value_times_gate_match_numpy(kan):
    cfg = dataclasses.replace(CFG, kan=kan)
    params, model = _build(cfg)
    params = _perturb(params, jax.random.PRNGKey(6))
    obs = _obs(B)
    out = _fwd(model)(params, obs, V_MIN, DZ)
    ref = np_forward(params, obs, V_MIN, DZ, cfg)
    np.testing.assert_allclose(out.logits, ref["logits"], rtol=1e-4, atol=1e-4)
    for name in N.BRANCH_KEYS:
        bp = params["main"][name]
        assert set(bp) >= {"value", "gate", "head_value", "head_advantage"}
        assert bp["value"]["kernel"].shape[-1] == cfg.ah == bp["gate"]["kernel"].shape[-1]
    # The gate path matters: changing only the gate weights changes the output.
    p2 = jax.tree_util.tree_map(lambda x: x, params)
    p2["main"]["branch_order"]["gate"]["kernel"] = (
        p2["main"]["branch_order"]["gate"]["kernel"] + 0.5
    )
    assert not np.allclose(_fwd(model)(p2, obs, V_MIN, DZ).logits[:, 2], out.logits[:, 2])


def test_m6_dueling_logits_and_probabilities(model_params):
    model, params = model_params
    params = _perturb(params, jax.random.PRNGKey(7))
    obs = _obs(B)
    out = _fwd(model)(params, obs, V_MIN, DZ)
    ref = np_forward(params, obs, V_MIN, DZ, CFG)
    np.testing.assert_allclose(out.logits, ref["logits"], rtol=1e-4, atol=1e-4)
    # Dueling identity: the action-mean of the logits is the value stream V(a).
    v_dir = _dense(params["main"]["branch_direction"]["head_value"], ref["a_dir"])
    np.testing.assert_allclose(np.asarray(out.logits[:, 0]).mean(1), v_dir, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out.probs, _softmax(ref["logits"]), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(out.probs).sum(-1), 1.0, atol=1e-6)
    assert np.asarray(out.q_mean).std() > 0  # actions differ: the advantage stream is present


# --------------------------------------------------------------------------------------------
# M4 KAN gate
# --------------------------------------------------------------------------------------------


def test_m4_kan_gate_flat_half_at_init_and_param_count():
    gate = N.KANGate(-3.0, 3.0, "reference")
    x = jnp.linspace(-5.0, 5.0, 4 * 41).reshape(4, 41)  # inside and outside the grid
    p = gate.init(jax.random.PRNGKey(0), x)
    np.testing.assert_array_equal(gate.apply(p, x), 0.5)
    # In the network: with the KAN on, branch hidden = 0.5 · value path exactly at init.
    params, model = _build()
    obs = _obs(B)
    ref = np_forward(params, obs, V_MIN, DZ, CFG)
    h_m = ref["h_m"]
    u = _dense(params["main"]["branch_direction"]["value"], h_m)
    np.testing.assert_allclose(ref["a_dir"], 0.5 * u, rtol=1e-12)
    np.testing.assert_allclose(
        _fwd(model)(params, obs, V_MIN, DZ).logits, ref["logits"], rtol=1e-4, atol=1e-5
    )
    # 9 parameters per gate neuron, 4 · AH · 9 = 9,216 at AH = 256.
    big = N.make_model(dataclasses.replace(CFG, ah=256), OBS_DIM)
    shapes = jax.eval_shape(big.init, jax.random.PRNGKey(0))
    kan_count = sum(
        int(np.prod(shapes["main"][b]["kan"][k].shape))
        for b in N.BRANCH_KEYS
        for k in ("coeffs", "w_res")
    )
    assert kan_count == 4 * 256 * 9 == 9216
    # Off: a GLU sigmoid gate and no spline parameters.
    off, _ = _build(dataclasses.replace(CFG, kan=False))
    assert all("kan" not in off["main"][b] for b in N.BRANCH_KEYS)
    on_count = N.param_count(params)
    assert on_count - N.param_count(off) == 4 * CFG.ah * 9


# --------------------------------------------------------------------------------------------
# M5 direction-conditioned magnitude
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_m5_magnitude_sees_direction_q_with_exactly_zero_gradient(model_params):
    model, params = model_params
    params = _perturb(params, jax.random.PRNGKey(8))
    obs = _obs(B)
    w = jax.random.normal(jax.random.PRNGKey(9), (B, 3, CFG.num_atoms))
    assert params["main"]["branch_magnitude"]["value"]["kernel"].shape[0] == CFG.sh2 + 3

    def mag_loss(p):
        return jnp.sum(model.apply(p, obs, V_MIN, DZ).logits[:, 1] * w)

    grads = jax.jit(jax.grad(mag_loss))(params)
    for leaf in jax.tree_util.tree_leaves(grads["main"]["branch_direction"]):
        np.testing.assert_array_equal(leaf, 0.0)
    assert np.abs(np.asarray(grads["main"]["branch_magnitude"]["value"]["kernel"])).max() > 0
    # ... but the magnitude output does depend on the direction branch (through the forward).
    p2 = jax.tree_util.tree_map(lambda x: x, params)
    hv = p2["main"]["branch_direction"]["head_advantage"]
    # (a random shift: a per-action constant over atoms would leave the softmax unchanged)
    hv["bias"] = hv["bias"] + 2.0 * jax.random.normal(jax.random.PRNGKey(10), hv["bias"].shape)
    out, out2 = _fwd(model)(params, obs, V_MIN, DZ), _fwd(model)(p2, obs, V_MIN, DZ)
    assert np.abs(np.asarray(out2.logits[:, 1] - out.logits[:, 1])).max() > 1e-4
    np.testing.assert_allclose(out2.logits[:, 2:], out.logits[:, 2:], rtol=1e-6)
    # The extra inputs are exactly E[Q_direction] / Δz (per-row support).
    v_min = jnp.array([-1.0, -0.5, 0.0, 0.3, -2.0, 1.0])
    dz = jnp.array([0.2, 0.1, 0.05, 0.3, 0.4, 0.02])
    out = _fwd(model)(params, obs, v_min, dz)
    mag_in = jnp.concatenate([out.features, out.q_mean[:, 0] / dz[:, None]], -1)
    branch = N.Branch(CFG.ah, CFG.num_atoms, True, CFG.kan_grid_min, CFG.kan_grid_max)
    expected = branch.apply({"params": params["main"]["branch_magnitude"]}, mag_in)
    np.testing.assert_allclose(out.logits[:, 1], expected, rtol=1e-5, atol=1e-5)
    # Off: the magnitude branch reads the masked features only.
    p_off = jax.eval_shape(
        N.make_model(dataclasses.replace(CFG, dir_conditioning=False), OBS_DIM).init,
        jax.random.PRNGKey(0),
    )
    assert p_off["main"]["branch_magnitude"]["value"]["kernel"].shape[0] == CFG.sh2


# --------------------------------------------------------------------------------------------
# M7 distribution statistics
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
class StatisticsTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_m7_statistics_hand_computed(self):
        probs = jnp.array([[0.2, 0.3, 0.5]])
        mean, var, q = self.variant(D.statistics)(probs, jnp.float32(-1.0), jnp.float32(1.0))
        np.testing.assert_allclose(mean, [0.3], atol=1e-6)  # −0.2 + 0.5
        np.testing.assert_allclose(var, [0.61], atol=1e-6)  # E[Z²] = 0.7, minus 0.09
        # CDF (0.2, 0.5, 1.0) at z (−1, 0, 1): Q10 = z_0, Q50 = 0, Q90 = 0 + 0.4/0.5.
        np.testing.assert_allclose(q, [[-1.0, 0.0, 0.8]], atol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_m7_statistics_match_numpy(self):
        key = jax.random.PRNGKey(11)
        probs = jax.nn.softmax(3.0 * jax.random.normal(key, (7, 4, 3, 13)), -1)
        v_min = jnp.linspace(-5.0, 2.0, 7)[:, None, None]
        dz = jnp.linspace(0.01, 0.5, 7)[:, None, None]
        mean, var, q = self.variant(D.statistics)(probs, v_min, dz)
        p = _np(probs)
        z = _np(v_min)[..., None] + _np(dz)[..., None] * np.arange(13)
        z = np.broadcast_to(z, p.shape)
        ez = (p * z).sum(-1)
        np.testing.assert_allclose(mean, ez, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(
            var, (p * (z - ez[..., None]) ** 2).sum(-1), rtol=1e-4, atol=1e-7
        )
        cdf = np.cumsum(p, -1)
        expect = np.empty((*p.shape[:-1], 3))
        for idx in np.ndindex(p.shape[:-1]):
            expect[idx] = np.interp([0.1, 0.5, 0.9], cdf[idx], z[idx])
        np.testing.assert_allclose(q, expect, rtol=1e-4, atol=1e-5)


def test_m7_network_statistics_use_the_given_support(model_params):
    model, params = model_params
    obs = _obs(B)
    v_min = jnp.array([-2.0, 0.0, 1.0, -0.5, 3.0, -7.0])
    dz = jnp.array([0.1, 0.3, 0.05, 0.01, 0.2, 0.5])
    out = _fwd(model)(params, obs, v_min, dz)
    z = _np(v_min)[:, None] + _np(dz)[:, None] * np.arange(CFG.num_atoms)
    p = _np(out.probs)
    ez = (p * z[:, None, None]).sum(-1)
    np.testing.assert_allclose(out.q_mean, ez, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        out.q_var, (p * (z[:, None, None] - ez[..., None]) ** 2).sum(-1), rtol=1e-3, atol=1e-7
    )
    assert np.all(np.diff(np.asarray(out.quantiles), axis=-1) >= 0)


@pytest.mark.parametrize(
    "statistics, marker, in_other, atol",
    [("interpret", "pallas_call", True, 1e-6), ("scan", "cumsum", False, 1e-5)],
)
def test_m7_statistics_implementations_in_the_model_equal_the_reference(
    model_params, statistics, marker, in_other, atol
):
    """kernels.statistics=interpret (the Pallas kernel) and =scan (the one-pass jnp scan):
    the model's E[Q], Var[Q] and quantiles equal the jnp reference's, and so do the gradients
    of a loss through all three. The program shows which ran: the kernel's holds a
    ``pallas_call`` (the reference's none), the scan's no cumulative sum (the reference's one)."""
    _, params = model_params
    ref = N.make_model(CFG, OBS_DIM, kan_backend="reference")
    other = N.make_model(CFG, OBS_DIM, kan_backend="reference", statistics=statistics)
    params = _perturb(params, jax.random.PRNGKey(21))
    obs, v_min, dz = _obs(B), jnp.linspace(-2.0, -0.5, B), jnp.linspace(0.05, 0.3, B)
    # (jitted: the interpreted kernel run op by op takes ~10 s on a 2-core CPU)
    out_r, out_o = (jax.jit(m.apply)(params, obs, v_min, dz) for m in (ref, other))
    program = lambda m: str(jax.make_jaxpr(lambda p: m.apply(p, obs, v_min, dz)[2:5])(params))
    assert (marker in program(other)) == in_other and (marker in program(ref)) != in_other
    for name in ("q_mean", "q_var", "quantiles", "probs", "logits"):
        np.testing.assert_allclose(getattr(out_o, name), getattr(out_r, name), rtol=1e-5, atol=atol)

    def loss(model):
        def f(p):
            out = model.apply(p, obs, v_min, dz)
            q = out.quantiles
            return jnp.sum(out.q_mean**2) + jnp.sum(out.q_var) + jnp.sum(q[..., 0] + q[..., 2])

        return f

    g_r, g_o = (jax.jit(jax.grad(loss(m)))(params) for m in (ref, other))
    for a, b in zip(jax.tree.leaves(g_o), jax.tree.leaves(g_r), strict=True):
        scale = float(jnp.max(jnp.abs(b))) + 1e-6
        np.testing.assert_allclose(np.asarray(a) / scale, np.asarray(b) / scale, atol=1e-5)


def test_m7_statistics_setting_must_be_resolved():
    with pytest.raises(ValueError, match=r"kernels\.statistics"):
        N.make_model(CFG, OBS_DIM, statistics="auto")


# --------------------------------------------------------------------------------------------
# M12 selectivity
# --------------------------------------------------------------------------------------------


def test_m12_selectivity_head(model_params):
    model, params = model_params
    aux = dict(
        params["aux"], selectivity=_perturb(params["aux"]["selectivity"], jax.random.PRNGKey(12))
    )
    params = dict(params, aux=aux)
    obs = _obs(B)
    out = _fwd(model)(params, obs, V_MIN, DZ)
    ref = np_forward(params, obs, V_MIN, DZ, CFG)
    np.testing.assert_allclose(out.selectivity, ref["sel"], rtol=1e-4)
    assert np.asarray(out.selectivity).std() > 1e-3
    assert set(params["aux"]["selectivity"]["dense"]) == {"kernel", "bias"}
    p_off, m_off = _build(dataclasses.replace(CFG, selectivity=False))
    assert "selectivity" not in p_off["aux"]
    np.testing.assert_array_equal(_fwd(m_off)(p_off, obs, V_MIN, DZ).selectivity, 1.0)


# --------------------------------------------------------------------------------------------
# Parameter tree, labels, seeds, the whole network's gradient
# --------------------------------------------------------------------------------------------


def test_param_tree_groups_and_labels(model_params):
    _, params = model_params
    assert set(params) == {"main", "aux", "xlstm"}
    assert set(params["main"]) == {"trunk", "vsn", *N.BRANCH_KEYS}
    assert set(params["aux"]) == {"selectivity", "attention", "graph", "denoiser"}
    assert params["xlstm"]
    labels = N.param_labels(params)
    assert set(jax.tree_util.tree_leaves(labels["main"]["trunk"])) == {"trunk"}
    assert set(jax.tree_util.tree_leaves(labels["main"]["vsn"])) == {"trunk"}
    for b in N.BRANCH_KEYS:
        assert set(jax.tree_util.tree_leaves(labels["main"][b])) == {"branches"}
    assert set(jax.tree_util.tree_leaves(labels["aux"])) == {"aux"}
    assert set(jax.tree_util.tree_leaves(labels["xlstm"])) == {"xlstm"}
    mask = N.branch_mask(params)
    assert sum(jax.tree_util.tree_leaves(mask)) == sum(
        len(jax.tree_util.tree_leaves(params["main"][b])) for b in N.BRANCH_KEYS
    )
    # The labels drive optax.multi_transform: only the "branches" group moves here.
    tx = optax.multi_transform(
        {
            "trunk": optax.set_to_zero(),
            "branches": optax.sgd(1.0),
            "aux": optax.set_to_zero(),
            "xlstm": optax.set_to_zero(),
        },
        labels,
    )
    ones = jax.tree_util.tree_map(jnp.ones_like, params)
    upd, _ = tx.update(ones, tx.init(params), params)
    np.testing.assert_array_equal(upd["main"]["trunk"]["fc1"]["kernel"], 0.0)
    np.testing.assert_array_equal(upd["main"]["branch_urgency"]["value"]["kernel"], -1.0)


def test_all_off_is_plain_branching_dueling_c51():
    params, model = _build(ALL_OFF)
    assert set(params["main"]) == {"trunk", *N.BRANCH_KEYS}
    assert params["aux"] == {} and params["xlstm"] == {}
    params = _perturb(params, jax.random.PRNGKey(13))
    obs = _obs(B)
    out = _fwd(model)(params, obs, V_MIN, DZ)
    np.testing.assert_allclose(
        out.logits, np_forward(params, obs, V_MIN, DZ, ALL_OFF)["logits"], rtol=1e-4, atol=1e-4
    )
    coord = model.coordinate(params, out.q_mean)
    np.testing.assert_array_equal(coord.q, out.q_mean)


@pytest.mark.slow
def test_model_vmaps_over_a_seed_axis():
    model = _build()[1]
    keys = jax.random.split(jax.random.PRNGKey(21), 3)
    shapes = jax.eval_shape(jax.vmap(model.init), keys)
    chex.assert_shape(shapes["main"]["trunk"]["fc1"]["kernel"], (3, CFG.bottleneck_dim, CFG.sh1))
    init = jax.jit(model.init)
    singles = [init(k) for k in keys]
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *singles)
    obs = _obs(B)
    outs = jax.jit(jax.vmap(model.apply, in_axes=(0, None, None, None)))(stacked, obs, V_MIN, DZ)
    chex.assert_shape(outs.logits, (3, B, 4, 3, CFG.num_atoms))
    single = _fwd(model)(singles[1], obs, V_MIN, DZ)
    np.testing.assert_allclose(outs.logits[1], single.logits, rtol=1e-5, atol=1e-6)
    assert not np.allclose(outs.logits[0], outs.logits[1])


@pytest.mark.slow
def test_network_jit_grad_of_whole_model_is_finite():
    params, model = N.init(jax.random.PRNGKey(0), ModelConfig(), 8 * 12 + 3)  # CPU default
    obs = jax.random.normal(jax.random.PRNGKey(1), (16, model.obs_dim)) * 3.0
    target = jax.nn.softmax(jax.random.normal(jax.random.PRNGKey(2), (16, 4, 3, 51)))
    state = model.xlstm.init_state()

    def loss(p):
        out = model.apply(p, obs, -2.0, 4.0 / 50)
        ce = -jnp.mean(jnp.sum(target * jax.nn.log_softmax(out.logits), -1))
        coord = model.coordinate(p, out.q_mean)
        from jaxdqn.model.xlstm import batch_statistics

        # the learner's xLSTM reads statistics of stop-gradient Q (agent/losses.py): the
        # gradient of max/min over recomputed values is not defined bit for bit (a tie test)
        stats = batch_statistics(jax.lax.stop_gradient(out.q_mean))
        xl, _ = model.xlstm.prediction_loss(p["xlstm"], state, stats, 0.1)
        return ce + jnp.mean(coord.q**2) + jnp.mean(out.selectivity) + xl + jnp.mean(out.quantiles)

    grads = jax.jit(jax.grad(loss))(params)
    chex.assert_tree_all_finite(grads)
    for group in ("main", "aux", "xlstm"):
        assert any(np.abs(np.asarray(g)).max() > 0 for g in jax.tree_util.tree_leaves(grads[group]))


# --------------------------------------------------------------------------------------------
# kernels.fused: the four branches computed together (issue 12)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "switches",
    [{}, {"dir_conditioning": False}, {"kan": False}, {"vsn": False, "selectivity": False}],
    ids=["all_on", "no_m5", "no_m4", "no_m2_m12"],
)
@pytest.mark.slow
def test_m3_m6_fused_branches_equal_the_per_branch_modules(switches):
    """The fused computation (one value/gate product, one gate call, one batched head product)
    has the per-branch modules' parameter tree and initial values exactly, and their outputs
    and gradients to float rounding."""
    _fused_equals_per_branch(dataclasses.replace(CFG, **switches), "blockdiag")


@pytest.mark.parametrize(
    ("heads", "m5"),
    [
        ("split", True),
        ("split", False),
        ("folded", True),
        ("interpret", True),
        ("interpret", False),
    ],
    ids=["split-m5", "split-no_m5", "folded-m5", "interpret-m5", "interpret-no_m5"],
)
@pytest.mark.slow
def test_m6_every_head_kernel_equals_the_per_branch_modules(heads, m5):
    """kernels.heads: one product per branch, the dueling combination folded into the weights
    and the Pallas head kernels (interpreted) give the per-branch modules' outputs and
    gradients, with M5 (three heads, then magnitude's alone) and without (all four heads at
    once; folded with M5 only: its two calls, m = 3 and m = 1, cover both forms)."""
    _fused_equals_per_branch(dataclasses.replace(CFG, dir_conditioning=m5), heads)
    with pytest.raises(ValueError, match=r"kernels\.heads"):
        N.make_model(CFG, OBS_DIM, heads="auto")


@pytest.mark.parametrize("gated", ["interpret", "gate_interpret"], ids=["gemm", "gate"])
@pytest.mark.parametrize(
    "switches", [{}, {"dir_conditioning": False}, {"kan": False}], ids=["all_on", "no_m5", "no_m4"]
)
@pytest.mark.slow
def test_m3_m4_gated_kernel_in_the_model_equals_the_per_branch_modules(switches, gated):
    """kernels.gated: the value/gate GEMM with the gate in its epilogue, and the gate and
    product reading XLA's product in place (both interpreted), give the per-branch modules'
    outputs and gradients, with M5 (two calls: three branches, then magnitude's), without (one
    call) and with the sigmoid gate (no M4); the undifferentiated forward runs the kernel, the
    gradient program does not (the reference's VJP)."""
    _fused_equals_per_branch(dataclasses.replace(CFG, **switches), "blockdiag", gated)
    with pytest.raises(ValueError, match=r"kernels\.gated"):
        N.make_model(CFG, OBS_DIM, gated="auto")


@pytest.mark.parametrize(
    "switches", [{}, {"dir_conditioning": False, "kan": False}], ids=["all_on", "no_m5_no_m4"]
)
@pytest.mark.slow
def test_m3_m4_gate_grad_kernels_in_the_model_equal_the_per_branch_modules(switches):
    """kernels.gated=gate_grad: the gate kernel forward everywhere, and in the differentiated
    pass its backward kernel (interpreted) give the per-branch modules' outputs and gradients:
    with M5 (the first call, three branches' columns of the product, through the kernels; M5's
    magnitude call with its rank-3 term through the reference's VJP) and without M5 and M4
    (one call over the whole product, the sigmoid gate)."""
    _fused_equals_per_branch(
        dataclasses.replace(CFG, **switches), "blockdiag", "gate_grad_interpret"
    )


@pytest.mark.parametrize(
    "switches",
    [{}, {"dir_conditioning": False}, {"kan": False, "selectivity": False}],
    ids=["all_on", "no_m5", "no_m4_no_m12"],
)
@pytest.mark.slow
def test_m6_m7_acting_kernel_in_the_model_equals_the_statistics_of_apply(switches):
    """kernels.acting: ``act`` with the heads' statistics kernel (interpreted) gives E[Q],
    Var[Q], the quantiles and M12 of the per-branch modules' ``apply`` to float rounding, with
    one kernel call per head call (two with M5: the magnitude branch is conditioned on the
    kernel's direction E[Q]) and no ``[B, 4, 3, N]`` logits in its program; the acting
    pipeline (A1–A3) decides the same on them. With ``reference``, ``act`` is ``apply``'s
    fields bit for bit. Products at float32 (``highest``): on a GPU the default TF32 rounds
    the fused and per-branch products apart by ~1e-3, which is not what this compares."""
    from jaxdqn.agent.acting import decide

    cfg = dataclasses.replace(CFG, **switches)
    kern = N.make_model(cfg, OBS_DIM, fused=True, acting="interpret")
    ref = N.make_model(cfg, OBS_DIM, fused=False)
    params = _perturb(ref.init(jax.random.PRNGKey(3)), jax.random.PRNGKey(4))
    obs = _obs(B, key=5)
    v_min, dz = jnp.linspace(-1.0, -0.5, B), jnp.linspace(0.1, 0.3, B)
    with jax.default_matmul_precision("highest"):
        got, want = kern.act(params, obs, v_min, dz), ref.apply(params, obs, v_min, dz)
        same = ref.act(params, obs, v_min, dz)
        args = (v_min, dz, jnp.float32(0.5), jnp.float32(1.0), jax.random.PRNGKey(7))
        decided = [
            (decide(kern, params, obs, *args, greedy=g), decide(ref, params, obs, *args, greedy=g))
            for g in (True, False)
        ]
    for name in ("q_mean", "q_var", "quantiles", "selectivity"):
        np.testing.assert_allclose(
            getattr(got, name), getattr(want, name), rtol=1e-4, atol=1e-5, err_msg=name
        )
    for name in ("q_mean", "q_var", "quantiles", "selectivity"):
        np.testing.assert_array_equal(getattr(same, name), getattr(want, name))
    program = jax.make_jaxpr(lambda p: kern.act(p, obs, v_min, dz))(params)
    # (counted by name: on a GPU the KAN's P2 kernel is in the program too)
    kernels = _pallas_call_names(program.jaxpr)
    assert kernels.count("head_statistics") == 1 + bool(cfg.dir_conditioning), kernels
    assert f"f32[{B},4,3,{cfg.num_atoms}]" not in str(program)
    for d_k, d_r in decided:
        np.testing.assert_array_equal(d_k.action.choice, d_r.action.choice)
        np.testing.assert_allclose(d_k.action.scale, d_r.action.scale, rtol=1e-5)
    with pytest.raises(ValueError, match=r"kernels\.acting"):
        N.make_model(cfg, OBS_DIM, acting="auto")
    with pytest.raises(ValueError, match="needs the fused branches"):
        N.make_model(cfg, OBS_DIM, fused=False, acting="interpret")


@pytest.mark.slow
def test_m3_m4_acting_product_bf16_rounds_only_acting_s_value_gate_product(monkeypatch):
    """kernels.acting_product=bf16: ``act`` computes the fused branches' value/gate product
    [B, 8·AH] with bfloat16 operands and result (the gate kernel widens it), and nothing else
    changes: ``apply`` (the learner's and the target's pass) is the f32 model's bit for bit.
    ``act``'s statistics differ from the f32 model's and equal, twenty times more closely,
    those of the f32 model whose product is the bfloat16 one written out in jnp (operands
    and result rounded)."""
    cfg = CFG
    make = lambda product: N.make_model(
        cfg, OBS_DIM, fused=True, gated="gate_interpret", acting="interpret", acting_product=product
    )
    m16, m32 = make("bf16"), make("f32")
    params = _perturb(m32.init(jax.random.PRNGKey(3)), jax.random.PRNGKey(4))
    obs = _obs(B, key=5)
    v_min, dz = jnp.linspace(-1.0, -0.5, B), jnp.linspace(0.1, 0.3, B)
    chex.assert_trees_all_equal(
        m16.apply(params, obs, v_min, dz), m32.apply(params, obs, v_min, dz)
    )
    act16 = lambda p: m16.act(p, obs, v_min, dz)
    text = str(jax.make_jaxpr(act16)(params))
    assert f"bf16[{B},{8 * cfg.ah}] = dot_general" in text, text
    assert "bf16" not in str(jax.make_jaxpr(lambda p: m32.act(p, obs, v_min, dz))(params))
    got, plain = act16(params), m32.act(params, obs, v_min, dz)
    # The f32 model with its product replaced by the bfloat16 one written out: operands
    # rounded, float32 products and sums, the result rounded; what acting reads must equal
    # it far more closely than it equals the unrounded model.
    bf = lambda x: x.astype(jnp.bfloat16).astype(jnp.float32)
    monkeypatch.setattr(fused_branches_lib, "linear", lambda x, w: bf(bf(x) @ bf(w)))
    want = make("f32").act(params, obs, v_min, dz)
    for name in ("q_mean", "q_var", "quantiles"):
        a, b, c = (np.asarray(getattr(o, name)) for o in (got, want, plain))
        rounding = np.abs(a - c).max()
        assert rounding > 1e-4, name  # the setting changed what acting reads
        assert np.abs(a - b).max() < 0.01 * rounding, (name, np.abs(a - b).max(), rounding)
    np.testing.assert_array_equal(got.selectivity, plain.selectivity)
    with pytest.raises(ValueError, match=r"kernels\.acting_product"):
        N.make_model(cfg, OBS_DIM, acting_product="f16")


@pytest.mark.slow
def test_m1_m2_acting_activations_bf16_runs_acting_s_layers_in_bfloat16():
    """kernels.acting_activations=bf16: ``act``'s trunk (M1), VSN (M2) and branch product take
    bfloat16 operands and give bfloat16 activations; ``apply`` (learner, target) is the f32
    model's bit for bit; M12 and the statistics stay float32. What ``act`` reads differs from
    the float32-activation model's by bfloat16's rounding through the layers and no more."""
    kw = dict(fused=True, gated="gate_interpret", acting="interpret", acting_product="bf16")
    m16 = N.make_model(CFG, OBS_DIM, acting_activations="bf16", **kw)
    m32 = N.make_model(CFG, OBS_DIM, **kw)
    params = _perturb(m32.init(jax.random.PRNGKey(3)), jax.random.PRNGKey(4))
    obs = _obs(B, key=5)
    v_min, dz = jnp.linspace(-1.0, -0.5, B), jnp.linspace(0.1, 0.3, B)
    args = (obs, v_min, dz)
    chex.assert_trees_all_equal(m16.apply(params, *args), m32.apply(params, *args))
    text = str(jax.make_jaxpr(lambda p: m16.act(p, *args))(params))
    for width in (CFG.sh1, CFG.sh2, CFG.vsn_hidden):  # trunk fc1, fc2 and VSN's products
        assert f"bf16[{B},{width}] = dot_general" in text, (width, text)
    assert f"bf16[{B},{CFG.sh1}]" not in str(jax.make_jaxpr(lambda p: m32.act(p, *args))(params))
    got, plain = m16.act(params, *args), m32.act(params, *args)
    assert got.selectivity.dtype == got.q_mean.dtype == jnp.float32
    # bfloat16's rounding (2^-9 relative) through five layers, and nothing larger; a quantile
    # moves by up to one atom spacing (Δz ≤ 0.3 here) where the CDF is flat
    for name, tol in (("q_mean", 3e-2), ("q_var", 3e-2), ("selectivity", 1e-2)):
        a, c = np.asarray(getattr(got, name)), np.asarray(getattr(plain, name))
        assert not np.array_equal(a, c), name
        np.testing.assert_allclose(a, c, rtol=tol, atol=tol, err_msg=name)
    np.testing.assert_allclose(got.quantiles, plain.quantiles, atol=float(dz.max()))
    with pytest.raises(ValueError, match=r"kernels\.acting_activations=bf16 .* needs"):
        N.make_model(CFG, OBS_DIM, fused=True, acting_activations="bf16")
    with pytest.raises(ValueError, match=r"kernels\.acting_activations"):
        N.make_model(CFG, OBS_DIM, acting_activations="f16")


@pytest.mark.slow
def test_m6_m7_acting_gate_kernel_writes_a_in_bfloat16_for_bf16_head_products(monkeypatch):
    """Under kernels.matmul=bf16 the acting heads' kernel rounds ``a`` to bfloat16 in its
    products, so the gate kernel writes ``a`` so (``bf16[B, 3·AH]`` out of its call) in
    ``act`` only: the learner's ``apply`` and f32 products keep float32 ``a``. The statistics
    equal those with the gate kernel's float32 ``a`` to bfloat16 rounding (on the CPU, whose
    BF16_BF16_F32 products are float32; on a GPU bit for bit, the kernel tests)."""
    cfg = CFG
    make = lambda matmul: N.make_model(
        cfg, OBS_DIM, fused=True, gated="gate_interpret", acting="interpret", matmul=matmul
    )
    m16 = make("bf16")
    params = _perturb(m16.init(jax.random.PRNGKey(3)), jax.random.PRNGKey(4))
    obs = _obs(B, key=5)
    v_min, dz = jnp.linspace(-1.0, -0.5, B), jnp.linspace(0.1, 0.3, B)
    jaxpr = lambda model, fn: str(jax.make_jaxpr(lambda p: fn(model)(p, obs, v_min, dz))(params))
    a16 = f"bf16[{B},{3 * cfg.ah}]"
    assert a16 in jaxpr(m16, lambda m: m.act)
    assert a16 not in jaxpr(m16, lambda m: lambda *x: m.apply(*x).logits)
    assert a16 not in jaxpr(make("f32"), lambda m: m.act)
    got = m16.act(params, obs, v_min, dz)
    real = gated_lib.gate_product
    monkeypatch.setattr(
        gated_lib, "gate_product", lambda *x, **k: real(*x, **k | {"out_bf16": False})
    )
    m32a = make("bf16")
    assert a16 not in jaxpr(m32a, lambda m: m.act)
    want = m32a.act(params, obs, v_min, dz)
    for name in ("q_mean", "q_var"):
        np.testing.assert_allclose(
            getattr(got, name), getattr(want, name), rtol=2e-2, atol=2e-2, err_msg=name
        )
    # a quantile moves by up to one atom spacing (Δz ≤ 0.3 here) where the CDF is flat
    np.testing.assert_allclose(got.quantiles, want.quantiles, atol=float(dz.max()))


def _pallas_call_names(jaxpr) -> list[str]:
    """The kernel name of every ``pallas_call`` in ``jaxpr`` and the jaxprs inside it."""
    names = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            info = eqn.params.get("name") or eqn.params.get("name_and_src_info")
            names.append(str(getattr(info, "name", info)))
            continue  # (not into the kernel's own body)
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            names += _pallas_call_names(sub)
    return names


def _fused_equals_per_branch(cfg, heads: str, gated: str = "reference") -> None:
    fused = N.make_model(cfg, OBS_DIM, fused=True, heads=heads, gated=gated)
    ref = N.make_model(cfg, OBS_DIM, fused=False)
    key = jax.random.PRNGKey(3)
    p_fused, p_ref = fused.init(key), ref.init(key)
    chex.assert_trees_all_equal(p_fused, p_ref)
    params = _perturb(p_ref, jax.random.PRNGKey(4))
    obs = _obs(B, key=5)
    v_min = jnp.linspace(-1.0, -0.5, B)
    dz = jnp.linspace(0.1, 0.3, B)
    out_f, out_r = fused.apply(params, obs, v_min, dz), ref.apply(params, obs, v_min, dz)
    np.testing.assert_allclose(out_f.logits, out_r.logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out_f.q_mean, out_r.q_mean, rtol=1e-5, atol=1e-5)
    # The setting is the one that ran: the kernels are in the program; split has one product
    # of one head's width [B, 4N] per branch, blockdiag only magnitude's (M5) or none.
    text = str(jax.make_jaxpr(lambda p: fused.apply(p, obs, v_min, dz).logits)(params))
    names = {"interpret": "gated_value_fwd", "gate_interpret": "gate_product_fwd"}
    names["gate_grad_interpret"] = names["gate_interpret"]
    assert ("pallas_call" in text) == (heads == "interpret" or gated in names)
    if gated in names:  # one kernel call, two with M5; no other kernel in the program
        assert text.count("pallas_call[") == 1 + cfg.dir_conditioning, text
        assert {n for n in set(names.values()) if n in text} == {names[gated]}
    # The value/gate product [B, 8·AH] gets its bias from XLA, except under the gate kernel,
    # which adds it where it reads u and g (no pass of its own over the product).
    bias_pass = f"f32[{B},{8 * cfg.ah}] = add" in text
    assert bias_pass == (gated == "reference"), text
    widths = re.findall(r"f32\[\d+,(\d+)\] = dot_general", text)
    one_head = widths.count(str((1 + 3) * cfg.num_atoms))
    if heads == "folded":  # the heads' products have 3N columns a head, none 4N
        n3 = 3 * cfg.num_atoms
        assert one_head == 0 and str((3 if cfg.dir_conditioning else 4) * n3) in widths, widths
        assert (str(n3) in widths) == cfg.dir_conditioning, widths  # magnitude's, alone
    elif heads != "interpret":
        assert one_head == (4 if heads == "split" else int(cfg.dir_conditioning)), widths
    w = jax.random.normal(jax.random.PRNGKey(6), out_r.logits.shape)

    def loss(model):
        return lambda p: jnp.sum(jax.nn.log_softmax(model.apply(p, obs, v_min, dz).logits) * w)

    g_f, g_r = jax.grad(loss(fused))(params), jax.grad(loss(ref))(params)
    grad_kernels = _pallas_call_names(jax.make_jaxpr(jax.grad(loss(fused)))(params).jaxpr)
    if gated == "gate_grad_interpret":  # the first call's forward and backward kernels only
        assert sorted(grad_kernels) == ["gate_grad", "gate_product_fwd"], grad_kernels
    else:  # the gradient program differentiates the reference
        assert not {"gated_value_fwd", "gate_product_fwd"} & set(grad_kernels), grad_kernels
    for a, b in zip(jax.tree.leaves(g_f), jax.tree.leaves(g_r), strict=True):
        scale = float(jnp.max(jnp.abs(b))) + 1e-6
        np.testing.assert_allclose(np.asarray(a) / scale, np.asarray(b) / scale, atol=1e-5)
    # Every branch's parameters matter in the fused path (none silently dropped).
    for name in N.BRANCH_KEYS:
        leaf = g_f["main"][name]["head_advantage"]["kernel"]
        assert float(jnp.abs(leaf).max()) > 0, name


@pytest.mark.slow
def test_dense_is_flax_dense_on_the_cpu_and_its_gemm_bias_gradient_is_the_batch_sum():
    """jaxdqn.model.dense.Dense: nn.Dense's parameters and, on the CPU, its numbers bit for
    bit; the accelerator formulation (bias gradient 1ᵀ dy as a GEMM) gives the same gradients
    to float rounding, also under vmap over a seed axis."""
    import flax.linen as nn

    from jaxdqn.model import dense

    x = jax.random.normal(jax.random.PRNGKey(0), (37, 12))
    ours, theirs = dense.Dense(7), nn.Dense(7)
    p = ours.init(jax.random.PRNGKey(1), x)
    chex.assert_trees_all_equal(p, theirs.init(jax.random.PRNGKey(1), x))
    p = _perturb(p, jax.random.PRNGKey(2))

    def loss(apply):
        return lambda p, x: jnp.sum(jnp.sin(apply(p, x)) * jnp.arange(7.0))

    ref = jax.grad(loss(theirs.apply), argnums=(0, 1))(p, x)
    chex.assert_trees_all_equal(jax.grad(loss(ours.apply), argnums=(0, 1))(p, x), ref)
    np.testing.assert_array_equal(ours.apply(p, x), theirs.apply(p, x))

    def gemm_apply(p, x):
        return dense._gemm_bias(x, p["params"]["kernel"], p["params"]["bias"], None)

    got = jax.grad(loss(gemm_apply), argnums=(0, 1))(p, x)
    chex.assert_trees_all_close(got, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dense.batch_sum(x), np.asarray(x).sum(0), rtol=1e-5, atol=1e-5)
    seeds = jax.tree.map(lambda a: jnp.stack([a, 2 * a]), p)
    per_seed = jax.vmap(jax.grad(loss(gemm_apply)), in_axes=(0, None))(seeds, x)
    second = jax.grad(loss(theirs.apply))(jax.tree.map(lambda a: a[1], seeds), x)
    chex.assert_trees_all_close(
        jax.tree.map(lambda a: a[1], per_seed), second, rtol=1e-5, atol=1e-5
    )


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["reference", "fused", "pallas_heads"])
@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_kernels_matmul_bf16_rounds_the_operands_of_every_model_product(
    model_params, layout, backend, monkeypatch
):
    """kernels.matmul=bf16: every matrix product of the forward pass, of M8–M11 and of their
    transposes (the gradient) carries the BF16_BF16_F32 algorithm; f32 carries none. ``gpu``
    traces the accelerators' Dense formulation (its custom VJP's backward products too), with
    only ``jax.default_backend`` faked: lowering and compilation stay on the CPU.
    ``pallas_heads``: the fused branches with the Pallas head kernels (interpreted, so their
    products appear in the lowered program), forward and backward kernels."""
    _, params = model_params
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    fused = layout != "reference"
    heads = "interpret" if layout == "pallas_heads" else "blockdiag"

    def products(matmul: str) -> tuple[int, int]:
        model = N.make_model(
            CFG, OBS_DIM, kan_backend="reference", fused=fused, heads=heads, matmul=matmul
        )

        def loss(p):
            out = model.apply(p, _obs(4), V_MIN, DZ)
            return jnp.sum(out.q_mean**2) + jnp.sum(model.coordinate(p, out.q_mean).q ** 2)

        text = jax.jit(jax.grad(loss)).lower(params).as_text()
        count = lambda pattern: len(re.findall(pattern, text))
        # (the accelerators' bias gradients, batch sums as products, keep HIGHEST)
        return (
            count(r"stablehlo\.dot_general"),
            count(r"lhs_precision_type = bf16"),
            count(r"precision = \[HIGHEST, HIGHEST\]"),
        )

    dots, bf16, highest = products("bf16")
    assert dots > 20 and bf16 + highest == dots
    assert (highest > 0) == (backend == "gpu")
    assert products("f32") == (dots, 0, highest)
    with pytest.raises(ValueError, match=r"kernels\.matmul"):
        N.make_model(CFG, OBS_DIM, matmul="fp8")


def test_m3_fused_offset_table_places_every_path_once_and_restores_the_branch_order():
    """The fused branches' one offset table: 8 blocks of AH columns (the value paths in the
    computed order, then the gate paths), disjoint and covering [0, 8·AH). With M5 the order is
    FUSED_ORDER (magnitude last) and FROM_FUSED maps it back to BRANCH_KEYS (direction,
    magnitude, order, urgency); without M5 it is BRANCH_KEYS itself (no reordering)."""
    from jaxdqn.model.fused_layout import FROM_FUSED, FUSED_ORDER, fused_columns, fused_order

    ah = 5
    assert fused_order(True) == FUSED_ORDER and fused_order(False) == N.BRANCH_KEYS
    for order in (FUSED_ORDER, N.BRANCH_KEYS):
        cols = fused_columns(ah, order)
        assert list(cols) == [(p, k) for p in ("value", "gate") for k in order]
        starts = sorted(c.start for c in cols.values())
        assert starts == [i * ah for i in range(8)]
        assert all(c.stop - c.start == ah for c in cols.values())
    assert fused_columns(ah) == fused_columns(ah, FUSED_ORDER)
    assert fused_columns(ah)["gate", "branch_magnitude"] == slice(7 * ah, 8 * ah)
    assert FUSED_ORDER[-1] == "branch_magnitude"  # M5 conditions it on the others' pass
    assert FROM_FUSED == (0, 3, 1, 2)
    assert tuple(FUSED_ORDER[i] for i in FROM_FUSED) == N.BRANCH_KEYS


def test_m3_fused_branches_without_m5_return_the_heads_output_without_a_reordering_copy():
    """Without M5 the fused branches are computed in the output order: the program stacks no
    per-branch slices back together (with M5 it must: magnitude's head is a pass of its own)."""
    obs, v_min, dz = _obs(B), jnp.linspace(-1.0, -0.5, B), jnp.linspace(0.1, 0.3, B)
    for m5 in (False, True):
        model = N.make_model(dataclasses.replace(CFG, dir_conditioning=m5), OBS_DIM, fused=True)
        params = model.init(jax.random.PRNGKey(3))
        logits = lambda p, model=model: model.apply(p, obs, v_min, dz).logits
        text = str(jax.make_jaxpr(logits)(params))
        # (jnp.stack is a `stack` primitive on jax 0.10, a concatenate elsewhere)
        stacked = re.search(rf"f32\[{B},4,3,{CFG.num_atoms}\] = (stack|concatenate)", text)
        assert bool(stacked) == m5, text


def _highest_dots(jaxpr) -> int:
    """dot_generals at Precision.HIGHEST (dense.batch_sum's ones-products) in a jaxpr and the
    jaxprs inside it."""
    n = 0
    for eqn in jaxpr.eqns:
        p = eqn.params.get("precision")
        if eqn.primitive.name == "dot_general" and p and jax.lax.Precision.HIGHEST in tuple(p):
            n += 1
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            n += _highest_dots(sub)
    return n


def test_m1_kernels_bias_grad_picks_the_layers_whose_bias_gradient_is_a_ones_gemm():
    """kernels.bias_grad (dense.py): gemm = every layer's bias gradient is 1ᵀ dy, narrow = only
    layers under WIDE outputs, sum = none; every choice gives flax's gradients to float
    rounding. The accelerator formulation is traced here on the CPU directly."""
    from jaxdqn.model import dense

    assert [dense.gemm_bias_gradient(f, "gemm") for f in (1, 127, 128, 2048)] == [True] * 4
    assert [dense.gemm_bias_gradient(f, "narrow") for f in (1, 127, 128, 2048)] == [
        True,
        True,
        False,
        False,
    ]
    assert not any(dense.gemm_bias_gradient(f, "sum") for f in (1, 127, 128, 2048))
    key = jax.random.PRNGKey(0)
    x = jax.random.normal(key, (33, 10))
    ws = [0.3 * jax.random.normal(jax.random.fold_in(key, f), (10, f)) for f in (12, 256)]
    bs = [jnp.linspace(-1.0, 1.0, f) for f in (12, 256)]

    def loss(ws, bs, formulation):
        y = [formulation(x, w, b) for w, b in zip(ws, bs, strict=True)]
        return jnp.sum(jnp.sin(y[0])) + jnp.sum(jnp.cos(y[1]) * jnp.arange(256.0))

    ref = jax.grad(loss, argnums=(0, 1))(ws, bs, dense._plain)
    for mode, expected in (("gemm", 2), ("narrow", 1), ("sum", 0)):

        def accelerator(x, w, b, mode=mode):
            return dense._accelerator_affine(x, w, b, mode)

        graph = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)), static_argnums=2)
        assert _highest_dots(graph(ws, bs, accelerator).jaxpr) == expected, mode
        got = jax.grad(loss, argnums=(0, 1))(ws, bs, accelerator)
        chex.assert_trees_all_close(got, ref, rtol=1e-5, atol=1e-4)
    # The context sets what affine reads; the CPU keeps flax's form whatever it says.
    with dense.bias_gradients("narrow"):
        assert dense._BIAS_GRAD.get() == "narrow"
        with dense.products("f32", "sum"):
            assert dense._BIAS_GRAD.get() == "sum"
        assert dense._BIAS_GRAD.get() == "narrow"
        cpu = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)), static_argnums=2)
        assert _highest_dots(cpu(ws, bs, dense.affine).jaxpr) == 0
    assert dense._BIAS_GRAD.get() == "gemm"
    with pytest.raises(ValueError, match=r"kernels\.bias_grad: 'wide'"):
        dense.bias_gradients("wide")
    with pytest.raises(ValueError, match=r"kernels\.bias_grad"):
        N.make_model(CFG, OBS_DIM, bias_grad="wide")


def test_m3_bf16_linear_accumulates_in_float32_and_rounds_once():
    """``dense.bf16_linear`` (acting's bfloat16 products): bfloat16 operands and result with a
    float32 accumulator, on whatever backend runs the test (the GPU too, where XLA emits the
    product as cuBLAS's or its own Triton GEMM). ``1 + 255 · 2⁻¹⁰`` summed in float32 is
    1.249…, rounded once to bfloat16 1.25; a bfloat16 accumulator loses every 2⁻¹⁰ against the
    1 (bfloat16's spacing there is 2⁻⁷) and returns 1.0. Also on a wide product at acting's K:
    the float32 dot of the rounded operands, rounded once."""
    from jaxdqn.model.dense import bf16_linear

    k = 256
    x = jnp.full((4, k), 2.0**-10, jnp.float32).at[:, 0].set(1.0)
    out = bf16_linear(x, jnp.ones((k, 8), jnp.float32))
    assert out.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(out, np.float32), 1.25)
    kx, kw = jax.random.split(jax.random.PRNGKey(3))
    x = jax.random.normal(kx, (64, k)).astype(jnp.bfloat16)
    w = (jax.random.normal(kw, (k, 96)) / 16.0).astype(jnp.bfloat16)
    want = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
    got = np.asarray(bf16_linear(x, w), np.float64)
    # one rounding to bfloat16 (relative 2^-9) plus float32 summation (far below it)
    np.testing.assert_allclose(got, want, rtol=2.0**-8, atol=1e-6)
