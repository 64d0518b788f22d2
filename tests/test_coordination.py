"""M8–M11: Q-coordination steps — centering, Q-attention, graph messages, denoiser."""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np

from jaxdqn.config import ModelConfig
from jaxdqn.model import coordination as C

CFG = ModelConfig(denoise_hidden=8)
B = 5


def _q(key=0, offset=0.7):
    return offset + jax.random.normal(jax.random.PRNGKey(key), (B, 4, 3), jnp.float32)


def _perturb(tree, seed, scale=0.5):
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map(
        lambda x: x + jnp.asarray(scale * rng.standard_normal(x.shape), x.dtype), tree
    )


def _init(module, seed=0):
    return module.init(jax.random.PRNGKey(seed), _q())["params"]


def _dense(p, x):
    return x @ np.asarray(p["kernel"], np.float64) + np.asarray(p["bias"], np.float64)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _silu(x):
    return x * _sigmoid(x)


# --------------------------------------------------------------------------------------------
# M8
# --------------------------------------------------------------------------------------------


class CenteringTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_m8_centering_gives_zero_global_mean(self):
        q = _q(1, offset=3.0)
        centred, mean = self.variant(C.center)(q)
        np.testing.assert_allclose(mean, np.asarray(q, np.float64).mean(), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(centred).mean(), 0.0, atol=1e-6)
        np.testing.assert_allclose(centred, np.asarray(q) - np.asarray(q).mean(), atol=1e-6)
        # Not per row: each sample keeps its own offset relative to the batch.
        assert np.abs(np.asarray(centred).mean(axis=(1, 2))).max() > 1e-2


def test_m8_in_the_coordinator_and_off():
    coord = C.make_coordination(CFG)
    params = coord.init(jax.random.PRNGKey(0))
    q = _q(2, offset=-4.0)
    out = jax.jit(coord.apply)(params, q)
    # At init M9–M11 are the identity, so the coordinated values are exactly the centred ones.
    np.testing.assert_allclose(out.q, np.asarray(q) - np.asarray(q).mean(), atol=1e-5)
    np.testing.assert_allclose(out.mean, np.asarray(q).mean(), rtol=1e-6)
    off = C.make_coordination(dataclasses.replace(CFG, q_centering=False))
    out_off = off.apply(params, q)
    np.testing.assert_allclose(out_off.q, q, atol=1e-6)
    assert float(out_off.mean) == 0.0


# --------------------------------------------------------------------------------------------
# M9
# --------------------------------------------------------------------------------------------


def test_m9_attention_identity_at_init_and_gated_after_perturbation():
    att = C.QAttention(heads=2)
    params = _init(att)
    q = _q(3)
    np.testing.assert_array_equal(att.apply({"params": params}, q), q)
    assert np.all(np.asarray(params["out"]["kernel"]) == 0)
    p2 = _perturb(params, 4)
    out = np.asarray(att.apply({"params": p2}, q))
    assert np.abs(out - np.asarray(q)).max() > 1e-2
    # Against the formula: x + W_o concat_h(sigmoid(q_h·k_h/√d) v_h) + b_o, d = 6.
    x = np.asarray(q, np.float64).reshape(B, 12)
    qh = _dense(p2["query"], x).reshape(B, 2, 6)
    kh = _dense(p2["key"], x).reshape(B, 2, 6)
    vh = _dense(p2["value"], x).reshape(B, 2, 6)
    gate = _sigmoid((qh * kh).sum(-1) / np.sqrt(6.0))
    expect = x + _dense(p2["out"], (gate[..., None] * vh).reshape(B, 12))
    np.testing.assert_allclose(out.reshape(B, 12), expect, rtol=1e-4, atol=1e-5)
    assert params["query"]["kernel"].shape == (12, 12)  # 2 heads × 6


# --------------------------------------------------------------------------------------------
# M10
# --------------------------------------------------------------------------------------------


def test_m10_graph_identity_at_init_and_not_after_perturbation():
    graph = C.GraphMessages()
    params = _init(graph)
    q = _q(5)
    np.testing.assert_array_equal(graph.apply({"params": params}, q), q)
    p2 = _perturb(params, 6)
    out = np.asarray(graph.apply({"params": p2}, q))
    d = out - np.asarray(q)
    np.testing.assert_array_equal(d[:, 0], 0.0)  # direction receives no edge
    assert np.abs(d[:, 1:]).min(axis=(0, 2)).min() > 0  # every other branch receives one
    # Against the formula for the urgency receiver: messages from magnitude and order.
    qn = np.asarray(q, np.float64)
    expect = qn[:, 3].copy()
    for src, name in ((1, "mag_to_urg"), (2, "ord_to_urg")):
        g = _sigmoid(_dense(p2[f"{name}_gate"], np.concatenate([qn[:, src], qn[:, 3]], -1)))
        expect += g * _dense(p2[f"{name}_message"], qn[:, src])
    np.testing.assert_allclose(out[:, 3], expect, rtol=1e-5, atol=1e-6)


def test_m10_messages_flow_only_along_the_four_edges():
    graph = C.GraphMessages()
    p2 = _perturb(_init(graph), 7)
    apply = jax.jit(lambda q: graph.apply({"params": p2}, q))
    q = _q(8)
    base = np.asarray(apply(q))

    def changed_when_perturbing(branch):
        out = np.asarray(apply(q.at[:, branch].add(1.5)))
        return [bool(np.abs(out[:, b] - base[:, b]).max() > 1e-6) for b in range(4)]

    # Perturbing urgency leaves direction (and magnitude, order) unchanged.
    assert changed_when_perturbing(3) == [False, False, False, True]
    assert changed_when_perturbing(0) == [True, True, True, False]  # dir→mag, dir→ord
    assert changed_when_perturbing(1) == [False, True, False, True]  # mag→urg
    assert changed_when_perturbing(2) == [False, False, True, True]  # ord→urg
    assert {n.rsplit("_", 1)[0] for n in p2} == {
        "dir_to_mag",
        "dir_to_ord",
        "mag_to_urg",
        "ord_to_urg",
    }


# --------------------------------------------------------------------------------------------
# M11
# --------------------------------------------------------------------------------------------


def test_m11_denoiser_identity_at_init_and_residual_steps_after_perturbation():
    den = C.Denoiser(steps=2, hidden=8)
    params = _init(den)
    q = _q(9)
    np.testing.assert_array_equal(den.apply({"params": params}, q), q)
    assert set(params) == {"step0_fc1", "step0_fc2", "step1_fc1", "step1_fc2"}
    p2 = _perturb(params, 10)
    out = np.asarray(den.apply({"params": p2}, q)).reshape(B, 12)
    x = np.asarray(q, np.float64).reshape(B, 12)
    for k in range(2):
        x = x + _dense(p2[f"step{k}_fc2"], _silu(_dense(p2[f"step{k}_fc1"], x)))
    np.testing.assert_allclose(out, x, rtol=1e-4, atol=1e-5)
    assert np.abs(out - np.asarray(q).reshape(B, 12)).max() > 1e-2


# --------------------------------------------------------------------------------------------
# The composed coordinator
# --------------------------------------------------------------------------------------------


def test_m8_m11_coordinator_switches_and_parameter_tree():
    coord = C.make_coordination(CFG)
    params = coord.init(jax.random.PRNGKey(0))
    assert set(params) == {"attention", "graph", "denoiser"}
    p2 = _perturb(params, 11, 0.3)
    q = _q(12)
    full = np.asarray(coord.apply(p2, q).q)
    # The composition is M11 ∘ M10 ∘ M9 ∘ M8.
    x, _ = C.center(q)
    x = C.QAttention(CFG.attention_heads).apply({"params": p2["attention"]}, x)
    x = C.GraphMessages().apply({"params": p2["graph"]}, x)
    x = C.Denoiser(CFG.denoise_steps, CFG.denoise_hidden).apply({"params": p2["denoiser"]}, x)
    np.testing.assert_allclose(full, x, rtol=1e-5, atol=1e-6)
    none = dataclasses.replace(
        CFG, q_centering=False, q_attention=False, graph=False, denoiser=False
    )
    coord_off = C.make_coordination(none)
    assert coord_off.init(jax.random.PRNGKey(0)) == {}
    np.testing.assert_array_equal(coord_off.apply({}, q).q, q)
