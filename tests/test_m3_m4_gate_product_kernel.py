"""M3 + M4's gate and product as one kernel reading XLA's value/gate product in place
(pallas_kernels/gate_product.py, ``kernels.gated=gate``).

The kernel runs in interpret mode on the CPU; set JAXDQN_KERNEL_BACKEND=pallas on a GPU to run
the value checks against the compiled Triton kernel. Lowering for CUDA (Pallas → Triton IR) is
checked on the CPU too, at configs/gpu.yaml's acting sizes.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_m3_gated_kernel import _numpy as gated_by_definition

from pallas_kernels import fallbacks
from pallas_kernels.gate_product import (
    DEFAULT_GATE_PRODUCT_BLOCKS,
    GateProductBlocks,
    gate_product_available,
    gate_product_pallas,
    gate_product_reference,
)
from pallas_kernels.kan import kan_gate_init

BACKEND = os.environ.get("JAXDQN_KERNEL_BACKEND", "interpret")


def kernel(*args, **kw):
    out = gate_product_pallas(*args, **kw, interpret=BACKEND == "interpret")
    if BACKEND == "pallas":
        failed = {k: v for k, v in fallbacks().items() if k[0] == "gate_product"}
        assert not failed, f"the Pallas kernel fell back: {failed}"
    return np.asarray(out)


def _by_hand(u_src, g_src, coeffs, w_res, u0, g0, f):
    """Float64: the gated path's definition (test_m3_gated_kernel: the B-spline gate by
    Cox–de Boor) with selection matrices as the products, so u and g are the given columns
    exactly."""
    pick = lambda c, c0: np.eye(c, dtype=np.float64)[:, c0 : c0 + f]
    x = np.concatenate([u_src, g_src], 1).astype(np.float64)
    cu = u_src.shape[1]
    w_u = np.concatenate([pick(cu, u0), np.zeros((g_src.shape[1], f))], 0)
    w_g = np.concatenate([np.zeros((cu, f)), pick(g_src.shape[1], g0)], 0)
    zero = np.zeros(f)
    return gated_by_definition(x, w_u, w_g, zero, zero, coeffs, w_res)


def _sources(rows, cu, cg, f, seed, kan=True):
    rng = np.random.default_rng(seed)
    u_src = rng.normal(size=(rows, cu)).astype(np.float32)
    g_src = (2.5 * rng.normal(size=(rows, cg))).astype(np.float32)  # past the grid too
    gate = (rng.normal(size=(f, 8)).astype(np.float32), rng.normal(size=f).astype(np.float32))
    return u_src, g_src, *(gate if kan else (None, None))


@pytest.mark.parametrize("kan", [True, False], ids=["kan", "sigmoid"])
@pytest.mark.parametrize(
    "rows,f,offsets,blocks",
    [
        (37, 40, "one_source", GateProductBlocks(8, 16, 4)),
        (70, 50, "two_sources", GateProductBlocks(16, 32, 4)),
        (19, 24, "one_source", DEFAULT_GATE_PRODUCT_BLOCKS),
    ],
    ids=["ragged", "two_sources", "default_blocks"],
)
def test_m3_m4_gate_product_kernel_equals_float64_numpy(kan, rows, f, offsets, blocks):
    """u ⊙ gate(g) read at column offsets: one source [u | g] (the fused branches' product,
    u at 0 and g at F, with a spare column after) or two (magnitude's u and g at offsets of
    their own); ragged rows and columns (masked tiles on every edge); the KAN gate by its
    B-spline definition or the sigmoid; and the jnp reference agrees."""
    if offsets == "one_source":
        src, _, coeffs, w_res = _sources(rows, 2 * f + 1, 1, f, seed=rows, kan=kan)
        u_src, g_src, u0, g0 = src, src, 0, f
    else:
        u_src, g_src, coeffs, w_res = _sources(rows, f + 3, f + 5, f, seed=rows, kan=kan)
        u0, g0 = 3, 5
    want = _by_hand(u_src, g_src, coeffs, w_res, u0, g0, f)
    kw = dict(u0=u0, g0=g0, width=f)
    got = kernel(u_src, g_src, coeffs, w_res, **kw, blocks=blocks)
    assert got.shape == (rows, f) and got.dtype == np.float32
    scale = np.abs(want).max()
    np.testing.assert_allclose(got / scale, want / scale, atol=2e-6)
    ref = np.asarray(gate_product_reference(u_src, g_src, coeffs, w_res, **kw))
    np.testing.assert_allclose(ref / scale, want / scale, atol=2e-6)


def test_m4_gate_product_kernel_gate_is_flat_half_at_init():
    """With M4's initial parameters (coefficients ½, residual 0) the gate is exactly ½ for
    any pre-activation, inside or outside the grid: the kernel returns ½ u bit for bit."""
    src, _, _, _ = _sources(21, 2 * 40, 1, 40, seed=5)
    src[:, 40:] *= 10.0
    coeffs, w_res = (np.asarray(v) for v in kan_gate_init(40))
    got = kernel(src, src, coeffs, w_res, g0=40, width=40, blocks=GateProductBlocks(8, 16, 4))
    np.testing.assert_array_equal(got, 0.5 * src[:, :40])


def test_m3_gate_product_kernel_refuses_bad_shapes_and_blocks():
    src, _, coeffs, w_res = _sources(8, 32, 1, 16, seed=1)
    with pytest.raises(ValueError, match="disagree"):  # g's columns run past the source
        gate_product_pallas(src, src, coeffs, w_res, g0=20, width=16, interpret=True)
    with pytest.raises(ValueError, match="disagree"):  # rows differ
        gate_product_pallas(src, src[:4], coeffs, w_res, g0=16, width=16, interpret=True)
    with pytest.raises(ValueError, match="disagree"):  # coeffs without w_res
        gate_product_pallas(src, src, coeffs, None, g0=16, width=16, interpret=True)
    with pytest.raises(ValueError, match="powers of two"):
        GateProductBlocks(24, 256, 4)
    if jax.default_backend() == "gpu":
        assert gate_product_available(16, True)
    else:  # no Triton here: one warning, False, and the model runs its reference
        with pytest.warns(RuntimeWarning, match="gate_product"):
            assert not gate_product_available(16, True)


def test_m3_gate_product_kernel_lowers_to_triton_at_acting_sizes():
    """Pallas → Triton IR for CUDA on the CPU (no GPU needed) at acting's sizes: 65,536 rows
    of the three branches' [u | g] (1,536 columns, g at 768) and magnitude's own u and g
    (256 columns each), with the KAN gate and the sigmoid."""
    spec = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    for cu, f, g0 in ((1536, 768, 768), (256, 256, 0)):
        for kan in (True, False):
            gate = (spec(f, 8), spec(f)) if kan else (None, None)
            fn = jax.jit(functools.partial(gate_product_pallas, g0=g0, width=f))
            text = fn.trace(spec(65536, cu), spec(65536, cu), *gate)
            text = text.lower(lowering_platforms=("cuda",)).as_text()
            assert text.count("__gpu$xla.gpu.triton") == 1
