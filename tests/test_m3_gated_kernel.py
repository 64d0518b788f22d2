"""M3 + M4 as one kernel (pallas_kernels/gated.py, ``kernels.gated``): the value/gate GEMM with
the KAN (or sigmoid) gate in its epilogue.

The kernel runs in interpret mode on the CPU; set JAXDQN_KERNEL_BACKEND=pallas on a GPU to run
the value checks against the compiled Triton kernel (TF32 products there: looser tolerances).
Lowering for CUDA (Pallas → Triton IR) is checked on the CPU too, at configs/gpu.yaml sizes.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import fallbacks
from pallas_kernels.gated import (
    DEFAULT_GATED_BLOCKS,
    GatedBlocks,
    gated_kernel_available,
    gated_value_pallas,
    gated_value_reference,
)
from pallas_kernels.kan import kan_gate_init

BACKEND = os.environ.get("JAXDQN_KERNEL_BACKEND", "interpret")
# TF32 products on a GPU (10-bit mantissas): the model's own GEMMs round the same way.
TOL = 2e-2 if BACKEND == "pallas" else 2e-5


def kernel(*args, blocks=DEFAULT_GATED_BLOCKS):
    out = gated_value_pallas(*args, blocks=blocks, interpret=BACKEND == "interpret")
    if BACKEND == "pallas":
        failed = {k: v for k, v in fallbacks().items() if k[0] == "gated_value"}
        assert not failed, f"the Pallas kernel fell back: {failed}"
    return np.asarray(out)


def _inputs(rows: int, k: int, f: int, seed: int, kan: bool = True):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, k)).astype(np.float32)
    w_u = (rng.normal(size=(k, f)) / np.sqrt(k)).astype(np.float32)
    w_g = (2.0 * rng.normal(size=(k, f)) / np.sqrt(k)).astype(np.float32)  # past the grid too
    b_u, b_g = rng.normal(size=(2, f)).astype(np.float32)
    gate = (rng.normal(size=(f, 8)).astype(np.float32), rng.normal(size=f).astype(np.float32))
    return (x, w_u, w_g, b_u, b_g, *(gate if kan else (None, None)))


def _numpy(x, w_u, w_g, b_u, b_g, coeffs, w_res, lo=-3.0, hi=3.0):
    """Float64 numpy: the cubic B-spline gate by its definition (Cox–de Boor on the uniform
    grid extended by 3 knots each side, so 8 bases on 5 intervals), clamped to [lo, hi]."""
    f64 = lambda v: np.asarray(v, np.float64)
    u = f64(x) @ f64(w_u) + f64(b_u)
    g = f64(x) @ f64(w_g) + f64(b_g)
    if coeffs is None:
        return u / (1.0 + np.exp(-g))
    h = (hi - lo) / 5
    knots = lo + h * np.arange(-3, 9)
    t = np.clip(g, lo, hi)
    # degree 0 on [knots_i, knots_{i+1}); the right edge belongs to the last interval
    basis = [((t >= knots[i]) & (t < knots[i + 1])).astype(np.float64) for i in range(11)]
    basis[7], basis[8] = np.where(t == hi, 1.0, basis[7]), np.where(t == hi, 0.0, basis[8])
    for d in range(1, 4):
        basis = [
            (t - knots[i]) / (d * h) * basis[i] + (knots[i + d + 1] - t) / (d * h) * basis[i + 1]
            for i in range(len(basis) - 1)
        ]
    spline = sum(f64(coeffs)[:, i] * basis[i] for i in range(8))
    return u * (spline + f64(w_res) * (1.0 / (1.0 + np.exp(-g)) - 0.5))


@pytest.mark.parametrize("kan", [True, False], ids=["kan", "sigmoid"])
@pytest.mark.parametrize(
    "rows,k,f,blocks",
    [
        (70, 40, 50, GatedBlocks(16, 16, 16)),
        (33, 259, 64, DEFAULT_GATED_BLOCKS),
        (5, 16, 16, (16, 16, 16, 1)),
    ],
    ids=["ragged", "m5_width", "one_tile"],
)
def test_m3_m4_gated_kernel_equals_float64_numpy(kan, rows, k, f, blocks):
    """u ⊙ gate(g) for ragged B, K, F (masked tiles on every edge, K not a multiple of bk: the
    magnitude branch's SH2 + 3 inputs), the KAN gate by its B-spline definition or the sigmoid;
    and the jnp reference agrees."""
    args = _inputs(rows, k, f, seed=rows + k, kan=kan)
    want = _numpy(*args)
    got = kernel(*args, blocks=blocks)
    assert got.shape == (rows, f) and got.dtype == np.float32
    scale = np.abs(want).max()
    np.testing.assert_allclose(got / scale, want / scale, atol=TOL)
    ref = np.asarray(gated_value_reference(*args))
    np.testing.assert_allclose(ref / scale, want / scale, atol=2e-5)


def test_m4_gated_kernel_gate_is_flat_half_at_init():
    """With M4's initial parameters (coefficients ½, residual 0) the gate is exactly ½: the
    kernel returns ½ (x W_u + b_u) for any gate pre-activation, inside or outside the grid."""
    x, w_u, w_g, b_u, b_g, _, _ = _inputs(37, 24, 40, seed=3)
    coeffs, w_res = (np.asarray(v) for v in kan_gate_init(40))
    got = kernel(x, w_u, 10.0 * w_g, b_u, b_g, coeffs, w_res, blocks=GatedBlocks(16, 16, 16))
    want = 0.5 * (x.astype(np.float64) @ w_u + b_u)
    np.testing.assert_allclose(got, want, rtol=TOL, atol=TOL * np.abs(want).max())


def test_m3_gated_kernel_refuses_bad_shapes_and_blocks():
    args = list(_inputs(8, 16, 16, seed=1))
    with pytest.raises(ValueError, match="disagree"):
        gated_value_pallas(args[0][:, :8], *args[1:], interpret=True)
    with pytest.raises(ValueError, match="disagree"):  # coeffs without w_res
        gated_value_pallas(*args[:6], None, interpret=True)
    with pytest.raises(ValueError, match="powers of two"):
        GatedBlocks(48, 64, 32)
    if jax.default_backend() == "gpu":
        assert gated_kernel_available(16, 16, True)
    else:  # no Triton here: one warning, False, and the model runs its reference
        with pytest.warns(RuntimeWarning, match="gated_value"):
            assert not gated_kernel_available(16, 16, True)


@pytest.mark.parametrize("bf16", [False, True], ids=["f32", "bf16"])
def test_m3_gated_kernel_lowers_to_triton_at_gpu_sizes(bf16):
    """Pallas → Triton IR for CUDA on the CPU (no GPU needed) at acting's sizes (65,536 rows,
    the three branches' 768 columns of SH2 = 256 inputs; magnitude's 259 inputs): block shapes,
    masks and dot layouts pass Triton's lowering rules; bf16 rounds the operands in the IR
    (``arith.truncf``: the CPU's interpreter ignores the preset, so this is where it is
    checked), f32 keeps them."""
    spec = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    for k, f in ((256, 768), (259, 256)):
        args = (spec(65536, k), spec(k, f), spec(k, f), spec(f), spec(f), spec(f, 8), spec(f))
        fn = jax.jit(functools.partial(gated_value_pallas, bf16=bf16))
        text = fn.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
        assert text.count("__gpu$xla.gpu.triton") == 1
        assert ("truncf" in text) == bf16
