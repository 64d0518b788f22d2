"""The backward kernel of M3 + M4's gate and product (pallas_kernels/gate_grad.py,
``gate_grad_pallas``; ``kernels.gated=gate_grad``): the VJP of ``u ⊙ gate(g)`` read from one
source's columns, with the biases' and M4's parameter gradients summed in the kernel.

The kernel runs in interpret mode on the CPU; set JAXDQN_KERNEL_BACKEND=pallas on a GPU to run
the value checks against the compiled Triton kernel. Lowering for CUDA (Pallas → Triton IR) is
checked on the CPU too, at configs/gpu.yaml's learner sizes.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import fallbacks
from pallas_kernels.gate_grad import (
    GateGradBlocks,
    default_gate_grad_blocks,
    gate_grad_available,
    gate_grad_pallas,
)
from pallas_kernels.gate_product import gate_product_reference
from pallas_kernels.kan import kan_gate_init

BACKEND = os.environ.get("JAXDQN_KERNEL_BACKEND", "interpret")
NAMES = ("src", "u_bias", "g_bias", "coeffs", "w_res")


def kernel(*args, **kw):
    out = gate_grad_pallas(*args, **kw, interpret=BACKEND == "interpret")
    if BACKEND == "pallas":
        failed = {k: v for k, v in fallbacks().items() if k[0] == "gate_grad"}
        assert not failed, f"the Pallas kernel fell back: {failed}"
    return [None if v is None else np.asarray(v) for v in out]


def _problem(rows, columns, f, kan, bias, seed):
    rng = np.random.default_rng(seed)
    normal = lambda *shape: rng.normal(size=shape).astype(np.float32)
    src = 2.5 * normal(rows, columns)  # g past the KAN grid [-3, 3] too
    gate = (normal(f, 8), normal(f)) if kan else (None, None)
    biases = (normal(f), normal(f)) if bias else (None, None)
    return src, normal(rows, f), gate, biases


def _float64_vjp(src, da, gate, biases, u0, g0, f):
    """The reference's VJP (autodiff of the slices, the bias adds, the gate and the product)
    in float64, in the kernel's output order."""
    with jax.enable_x64(True):
        wide = lambda v: None if v is None else jnp.asarray(v, jnp.float64)
        src64, da64, (c, w), (bu, bg) = wide(src), wide(da), map(wide, gate), map(wide, biases)

        def forward(s, c, w, bu, bg):
            kw = dict(u0=u0, g0=g0, width=f, u_bias=bu, g_bias=bg)
            return gate_product_reference(s, s, c, w, **kw)

        _, vjp = jax.vjp(forward, src64, c, w, bu, bg)
        d_src, d_c, d_w, d_bu, d_bg = vjp(da64)
        return [None if v is None else np.asarray(v) for v in (d_src, d_bu, d_bg, d_c, d_w)]


@pytest.mark.parametrize(
    "rows,f,layout,kan,bias,blocks",
    [
        (37, 40, "u_then_g", True, True, GateGradBlocks(8, 16, 4, 4)),
        (70, 24, "g_then_u", False, False, GateGradBlocks(16, 16, 4, 3)),
        (45, 24, "spare_columns", True, True, GateGradBlocks(8, 32, 4, 1024)),
        (45, 24, "spare_columns", False, True, GateGradBlocks(8, 32, 4, 1024)),
        (45, 40, "u_then_g", True, True, GateGradBlocks(16, 16, 4, 2, row_sums=1)),
        (19, 24, "u_then_g", False, True, None),
        (21, 40, "spare_columns", True, True, None),
    ],
    ids=[
        "ragged_kan",
        "g_first",
        "m5_first_call_kan",
        "m5_first_call",
        "row_sums_kan",
        "default",
        "default_kan",
    ],
)
def test_m3_m4_gate_grad_kernel_equals_the_float64_vjp(rows, f, layout, kan, bias, blocks):
    """d src (du at u's columns, dg at g's, zero in every other column), the biases' column
    sums and M4's coefficient and residual-weight sums equal the float64 VJP of the reference
    for: [u | g] covering the source (the all-off learner's one call), [g | u], and u and g
    with columns between and after them (M5's first call: three branches' columns of the four);
    ragged rows and columns; row loops of several steps (few programs) and of one; the sums
    kept as tiles or summed over the rows every step (``row_sums``)."""
    layouts = {"u_then_g": (2 * f, 0, f), "g_then_u": (2 * f, f, 0)}
    columns, u0, g0 = layouts.get(layout, (2 * f + 13, 3, f + 7))
    src, da, gate, biases = _problem(rows, columns, f, kan, bias, seed=rows + f)
    got = kernel(src, da, *gate, u0=u0, g0=g0, width=f, u_bias=biases[0], g_bias=biases[1],
                 blocks=blocks)  # fmt: skip
    want = _float64_vjp(src, da, gate, biases, u0, g0, f)
    for name, g, w in zip(NAMES, got, want, strict=True):
        if w is None:
            assert g is None, name
            continue
        assert g.shape == w.shape and g.dtype == np.float32, name
        scale = np.abs(w).max()
        np.testing.assert_allclose(g / scale, w / scale, atol=2e-6, err_msg=name)
    owned = np.zeros(columns, bool)
    owned[u0 : u0 + f] = owned[g0 : g0 + f] = True
    assert not got[0][:, ~owned].any()  # untouched columns are exactly zero
    assert np.abs(got[0][:, owned]).min(axis=0).max() > 0  # and every owned column written


def test_m4_gate_grad_kernel_at_init_passes_half_the_cotangent_to_u_and_nothing_to_g():
    """With M4's initial parameters (coefficients ½, residual 0) the gate is flat ½: du = ½ da
    exactly, dg = 0 exactly (the spline's slope is zero, σ' is weighted by 0), and the
    coefficient gradients sum ``da ⊙ u`` against the basis, which sums to 1 inside the grid."""
    rows, f = 21, 40
    src, da, _, _ = _problem(rows, 2 * f, f, kan=False, bias=False, seed=5)
    src[:, f:] = np.clip(src[:, f:], -2.9, 2.9)  # inside the grid: the basis sums to 1
    coeffs, w_res = (np.asarray(v) for v in kan_gate_init(f))
    got = kernel(src, da, coeffs, w_res, u0=0, g0=f, width=f, blocks=GateGradBlocks(8, 16, 4, 2))
    np.testing.assert_array_equal(got[0][:, :f], 0.5 * da)
    np.testing.assert_array_equal(got[0][:, f:], 0.0)
    np.testing.assert_allclose(got[3].sum(axis=1), (da * src[:, :f]).sum(axis=0), rtol=1e-5)


def test_m3_m4_gate_grad_default_tiling_is_the_measured_fastest_per_gate_kind():
    """No tiling given, the kernel runs the one bench/gate_grad.py measured fastest for its gate
    kind (the sigmoid's sums per step, the KAN gate's 64 columns), and gives what that tiling
    given explicitly gives, bit for bit."""
    assert default_gate_grad_blocks(False) == GateGradBlocks(8, 128, 4, 1024, 1)
    assert default_gate_grad_blocks(True) == GateGradBlocks(8, 64, 4, 1024, 0)
    for kan in (False, True):
        src, da, gate, (bu, bg) = _problem(19, 2 * 40, 40, kan=kan, bias=True, seed=7)
        kw = dict(u0=0, g0=40, width=40, u_bias=bu, g_bias=bg)
        explicit = kernel(src, da, *gate, blocks=default_gate_grad_blocks(kan), **kw)
        for got, want in zip(kernel(src, da, *gate, **kw), explicit, strict=True):
            if want is None:
                assert got is None
            else:
                np.testing.assert_array_equal(got, want)


def test_m3_gate_grad_kernel_refuses_bad_inputs():
    src, da, (coeffs, w_res), _ = _problem(8, 32, 16, kan=True, bias=False, seed=1)
    kw = dict(g0=16, width=16, interpret=True)
    with pytest.raises(ValueError, match="overlap"):
        gate_grad_pallas(src, da, coeffs, w_res, u0=0, g0=8, width=16, interpret=True)
    with pytest.raises(ValueError, match="float32"):  # the cotangent's width is F
        gate_grad_pallas(src, da[:, :8], coeffs, w_res, u0=0, **kw)
    with pytest.raises(ValueError, match="float32"):
        gate_grad_pallas(src.astype(jnp.bfloat16), da, coeffs, w_res, u0=0, **kw)
    with pytest.raises(ValueError, match="disagree"):  # g's columns run past the source
        gate_grad_pallas(src, da, coeffs, w_res, u0=0, g0=20, width=16, interpret=True)
    with pytest.raises(ValueError, match="disagree"):  # one bias without the other
        gate_grad_pallas(src, da, coeffs, w_res, u0=0, u_bias=da[0], **kw)
    with pytest.raises(ValueError, match="powers of two"):
        GateGradBlocks(24, 128)
    with pytest.raises(ValueError, match="programs"):
        GateGradBlocks(8, 128, 4, 0)
    with pytest.raises(ValueError, match="row_sums"):
        GateGradBlocks(8, 128, 4, 1024, 2)
    if jax.default_backend() == "gpu":
        assert gate_grad_available(32, 16, True, u0=0, g0=16, bias=True)
    else:  # no Triton here: one warning, False, and the model differentiates its reference
        with pytest.warns(RuntimeWarning, match="gate_grad"):
            assert not gate_grad_available(32, 16, True, u0=0, g0=16, bias=True)


def test_m3_gate_grad_kernel_lowers_to_triton_at_learner_sizes():
    """Pallas → Triton IR for CUDA on the CPU (no GPU needed) at configs/gpu.yaml's learner
    sizes (B = 4,096 rows of the fused bias-free product [u | g], 2,048 columns): all four
    branches in one call (F = 1,024, the source covered: no zeros written first) and M5's
    first call (three branches, F = 768 at 0 and 1,024: XLA places ``[du | dg]`` among zero
    columns), with the
    KAN gate and the sigmoid, with the biases, the sums as tiles and as rows."""
    spec = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    for f, g0 in ((1024, 1024), (768, 1024)):
        for kan in (True, False):
            gate = (spec(f, 8), spec(f)) if kan else (None, None)

            for blocks in (
                None,
                GateGradBlocks(8, 128, 4, 1024, 0),
                GateGradBlocks(8, 64, 4, 1024, 1),
            ):

                def run(src, da, c, w, bu, bg, f=f, g0=g0, blocks=blocks):
                    kw = dict(u0=0, g0=g0, width=f, u_bias=bu, g_bias=bg, blocks=blocks)
                    return gate_grad_pallas(src, da, c, w, **kw)

                args = (spec(4096, 2048), spec(4096, f), *gate, spec(f), spec(f))
                text = jax.jit(run).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
                assert text.count("__gpu$xla.gpu.triton") == 1
                partials = text.count(f"x{f}xf32>")  # the [programs, F] bias (and w_res) partials
                assert partials >= 2 + kan, text


def test_m3_m4_gate_grad_kernel_under_vmap_equals_each_member_alone():
    """A population vmaps the learner over its members: the batched backward kernel gives each
    member what it gives that member alone (its own source, cotangent, biases and gate; another
    member's would be off by O(1))."""
    rows, f = 29, 24
    members = [_problem(rows, 2 * f + 5, f, kan=True, bias=True, seed=40 + i) for i in range(3)]
    flat = [(src, da, *gate, *biases) for src, da, gate, biases in members]
    batched = [jnp.stack(parts) for parts in zip(*flat, strict=True)]
    blocks = GateGradBlocks(8, 16, 4, 2)
    run = functools.partial(
        gate_grad_pallas, u0=5, g0=f + 5, width=f, blocks=blocks, interpret=BACKEND == "interpret"
    )

    def call(src, da, c, w, bu, bg):
        return run(src, da, c, w, u_bias=bu, g_bias=bg)

    together = jax.vmap(call)(*batched)
    for i, parts in enumerate(flat):
        alone = call(*parts)
        for name, t, a in zip(NAMES, together, alone, strict=True):
            np.testing.assert_allclose(t[i], a, rtol=1e-6, atol=1e-6, err_msg=name)
