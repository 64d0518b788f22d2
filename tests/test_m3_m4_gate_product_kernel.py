"""M3 + M4's gate and product as one kernel reading XLA's value/gate product in place
(pallas_kernels/gate_product.py, ``kernels.gated=gate``).

The kernel runs in interpret mode on the CPU; set JAXDQN_KERNEL_BACKEND=pallas on a GPU to run
the value checks against the compiled Triton kernel. Lowering for CUDA (Pallas → Triton IR) is
checked on the CPU too, at configs/gpu.yaml's acting sizes.
"""

from __future__ import annotations

import functools
import os
import warnings

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


def _by_hand(u_src, g_src, coeffs, w_res, u0, g0, f, u_bias=None, g_bias=None, cond=None):
    """Float64: the gated path's definition (test_m3_gated_kernel: the B-spline gate by
    Cox–de Boor) with selection matrices as the products, so u and g are the given columns
    exactly, plus the biases and c W_c (c as more inputs, W_c as their rows)."""
    pick = lambda c, c0: np.eye(c, dtype=np.float64)[:, c0 : c0 + f]
    c, w_cu, w_cg = cond if cond is not None else (np.zeros((len(u_src), 0)), None, None)
    x = np.concatenate([u_src, g_src, c], 1).astype(np.float64)
    cu, cg, zeros = u_src.shape[1], g_src.shape[1], lambda n: np.zeros((n, f))
    w_u = np.concatenate([pick(cu, u0), zeros(cg), zeros(0) if cond is None else w_cu], 0)
    w_g = np.concatenate([zeros(cu), pick(cg, g0), zeros(0) if cond is None else w_cg], 0)
    b_u, b_g = (np.zeros(f), np.zeros(f)) if u_bias is None else (u_bias, g_bias)
    return gated_by_definition(x, w_u, w_g, b_u, b_g, coeffs, w_res)


def _sources(rows, cu, cg, f, seed, kan=True):
    rng = np.random.default_rng(seed)
    u_src = rng.normal(size=(rows, cu)).astype(np.float32)
    g_src = (2.5 * rng.normal(size=(rows, cg))).astype(np.float32)  # past the grid too
    gate = (rng.normal(size=(f, 8)).astype(np.float32), rng.normal(size=f).astype(np.float32))
    return u_src, g_src, *(gate if kan else (None, None))


def _extras(rows, f, which, seed):
    """The optional terms: biases [F] and/or M5's c [B, 3] with W_cu, W_cg [3, F]."""
    rng = np.random.default_rng(seed)
    normal = lambda *shape: rng.normal(size=shape).astype(np.float32)
    out = {}
    if "bias" in which:
        out.update(u_bias=normal(f), g_bias=normal(f))
    if "cond" in which:
        out["cond"] = (normal(rows, 3), normal(3, f), normal(3, f))
    return out


@pytest.mark.parametrize("kan", [True, False], ids=["kan", "sigmoid"])
@pytest.mark.parametrize(
    "rows,f,offsets,extras,blocks",
    [
        (37, 40, "one_source", "bias", GateProductBlocks(8, 16, 4)),
        (70, 50, "two_sources", "", GateProductBlocks(16, 32, 4)),
        (45, 24, "one_source", "bias_cond", GateProductBlocks(16, 16, 4)),
        (19, 24, "one_source", "bias", DEFAULT_GATE_PRODUCT_BLOCKS),
    ],
    ids=["ragged", "two_sources", "m5", "default_blocks"],
)
def test_m3_m4_gate_product_kernel_equals_float64_numpy(kan, rows, f, offsets, extras, blocks):
    """(u + b_u + c W_cu) ⊙ gate(g + b_g + c W_cg) read at column offsets: one source [u | g]
    (the fused branches' bias-free product, u at 0 and g at F, with a spare column after, the
    biases added by the kernel; and, as M5's call, c W_c too) or two (u and g at offsets of
    their own, nothing added); ragged rows and columns (masked tiles on every edge); the KAN
    gate by its B-spline definition or the sigmoid; and the jnp reference agrees."""
    if offsets == "one_source":
        src, _, coeffs, w_res = _sources(rows, 2 * f + 1, 1, f, seed=rows, kan=kan)
        u_src, g_src, u0, g0 = src, src, 0, f
    else:
        u_src, g_src, coeffs, w_res = _sources(rows, f + 3, f + 5, f, seed=rows, kan=kan)
        u0, g0 = 3, 5
    more = _extras(rows, f, extras, seed=rows + 1)
    want = _by_hand(u_src, g_src, coeffs, w_res, u0, g0, f, **more)
    kw = dict(u0=u0, g0=g0, width=f, **more)
    got = kernel(u_src, g_src, coeffs, w_res, **kw, blocks=blocks)
    assert got.shape == (rows, f) and got.dtype == np.float32
    scale = np.abs(want).max()
    np.testing.assert_allclose(got / scale, want / scale, atol=2e-6)
    ref = np.asarray(gate_product_reference(u_src, g_src, coeffs, w_res, **kw))
    np.testing.assert_allclose(ref / scale, want / scale, atol=2e-6)


@pytest.mark.parametrize("extras", ["", "bias_cond"], ids=["bare", "m5"])
@pytest.mark.parametrize("kan", [True, False], ids=["kan", "sigmoid"])
def test_m3_m4_gate_product_kernel_widens_a_bfloat16_product_in_registers(kan, extras):
    """kernels.acting_product=bf16: a bfloat16 product [u | g] is read as it is and widened,
    so the result is float32 and equals the float64 definition on the widened values (bare,
    and with the biases and c W_c added in float32) to the float32 tolerance, not to
    bfloat16's: the only rounding is the product's own. The jnp reference widens alike."""
    rows, f = 37, 40
    src, _, coeffs, w_res = _sources(rows, 2 * f + 1, 1, f, seed=11, kan=kan)
    src16 = jnp.asarray(src, jnp.bfloat16)
    widened = np.asarray(src16.astype(jnp.float32))
    assert not np.array_equal(widened, src)  # the rounding is real
    more = _extras(rows, f, extras, seed=12)
    kw = dict(g0=f, width=f, **more)
    want = _by_hand(widened, widened, coeffs, w_res, 0, f, f, **more)
    got = kernel(src16, src16, coeffs, w_res, **kw, blocks=GateProductBlocks(16, 16, 4))
    assert got.dtype == np.float32
    scale = np.abs(want).max()
    np.testing.assert_allclose(got / scale, want / scale, atol=2e-6)
    from jaxdqn.model.gated import GateSpec, gate_product

    spec = GateSpec(kan, -3.0, 3.0, "reference")
    args = (src16, src16, slice(0, f), slice(f, 2 * f), coeffs, w_res, spec, "gate")
    with warnings.catch_warnings():  # the CPU cannot build the kernel: one warning, reference
        warnings.simplefilter("ignore", RuntimeWarning)
        ref = np.asarray(gate_product(*args, **more))
    assert ref.dtype == np.float32
    np.testing.assert_allclose(ref / scale, want / scale, atol=2e-6)


def test_m3_gate_product_kernel_writes_bfloat16_as_the_float32_result_rounded():
    """``out_dtype=bfloat16``: the float32 result rounded to nearest even, bit for bit (what a
    bf16 consumer would round it to), from a float32 and from a bfloat16 product; the jnp
    reference of the model rounds alike; any other dtype is refused."""
    rows, f = 37, 40
    src, _, coeffs, w_res = _sources(rows, 2 * f + 1, 1, f, seed=13)
    more = _extras(rows, f, "bias_cond", seed=14)
    kw = dict(g0=f, width=f, **more, blocks=GateProductBlocks(16, 16, 4))
    for source in (src, jnp.asarray(src, jnp.bfloat16)):
        full = kernel(source, source, coeffs, w_res, **kw)
        got = gate_product_pallas(
            source, source, coeffs, w_res, **kw, out_dtype=jnp.bfloat16, interpret=True
        )
        assert got.dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(got), np.asarray(full.astype(jnp.bfloat16)))
    from jaxdqn.model.gated import GateSpec, gate_product

    spec = GateSpec(True, -3.0, 3.0, "reference")
    args = (src, src, slice(0, f), slice(f, 2 * f), coeffs, w_res, spec, "gate")
    with warnings.catch_warnings():  # the CPU cannot build the kernel: the model's reference
        warnings.simplefilter("ignore", RuntimeWarning)
        ref = gate_product(*args, **more, out_bf16=True)
        ref32 = gate_product(*args, **more)
    assert ref.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(ref), np.asarray(ref32.astype(jnp.bfloat16)))
    with pytest.raises(ValueError, match="out_dtype"):
        gate_product_pallas(src, src, coeffs, w_res, **kw, out_dtype=jnp.float16, interpret=True)


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
    b = np.zeros(16, np.float32)
    with pytest.raises(ValueError, match="disagree"):  # one bias without the other
        gate_product_pallas(src, src, coeffs, w_res, g0=16, width=16, u_bias=b, interpret=True)
    with pytest.raises(ValueError, match="disagree"):  # a bias of the wrong width
        gate_product_pallas(
            src, src, coeffs, w_res, g0=16, width=16, u_bias=b, g_bias=b[:8], interpret=True
        )
    c, w_c = np.zeros((8, 3), np.float32), np.zeros((3, 16), np.float32)
    for cond in ((c, w_c), (c, w_c, w_c[:2]), (c[:4], w_c, w_c), (c, w_c, None)):
        with pytest.raises(ValueError, match="disagree"):  # c [B, r] with W_cu, W_cg [r, F]
            gate_product_pallas(src, src, coeffs, w_res, g0=16, width=16, cond=cond)
    with pytest.raises(ValueError, match="powers of two"):
        GateProductBlocks(24, 256, 4)
    if jax.default_backend() == "gpu":
        assert gate_product_available(16, True)
    else:  # no Triton here: one warning, False, and the model runs its reference
        with pytest.warns(RuntimeWarning, match="gate_product"):
            assert not gate_product_available(16, True)


def test_m3_gate_product_kernel_lowers_to_triton_at_acting_sizes():
    """Pallas → Triton IR for CUDA on the CPU (no GPU needed) at acting's sizes: 65,536 rows
    in the fused bias-free product [u | g] of 2,048 columns: the three branches' call (768
    columns, g at 1,024; the kernel adds the biases) and magnitude's under M5 (256 columns at
    768 and 1,792, biases and c W_c with r = 3); and two sources without either; with the KAN
    gate and the sigmoid; from a float32 product and from a bfloat16 one, read as it is, and
    into a bfloat16 ``a``."""
    spec = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    calls = ((768, 0, 1024, True, 0), (256, 768, 1792, True, 3), (256, 0, 0, False, 0))
    for f, u0, g0, bias, rank in calls:
        for kan in (True, False):
            gate = (spec(f, 8), spec(f)) if kan else (None, None)
            biases = (spec(f), spec(f)) if bias else (None, None)
            cond = (spec(65536, rank), spec(rank, f), spec(rank, f)) if rank else None

            def run(u, g, c, w, bu, bg, cond, u0=u0, g0=g0, f=f, out=jnp.float32):
                kw = dict(u0=u0, g0=g0, width=f, u_bias=bu, g_bias=bg, cond=cond, out_dtype=out)
                return gate_product_pallas(u, g, c, w, **kw)

            # kernels.acting_product's bfloat16 product; a bfloat16 `a` for bf16 head products
            for dtype, out in (
                (jnp.float32,) * 2,
                (jnp.bfloat16,) * 2,
                (jnp.float32, jnp.bfloat16),
            ):
                src = jax.ShapeDtypeStruct((65536, 2048), dtype)
                fn = jax.jit(functools.partial(run, out=out))
                text = fn.trace(src, src, *gate, *biases, cond)
                text = text.lower(lowering_platforms=("cuda",)).as_text()
                assert text.count("__gpu$xla.gpu.triton") == 1
                assert ("tensor<65536x2048xbf16>" in text) == (dtype == jnp.bfloat16)
                assert (f"tensor<65536x{f}xbf16>" in text) == (out == jnp.bfloat16)


@pytest.mark.parametrize("extras", ["bias", "bias_cond"], ids=["branches", "m5"])
def test_m3_m4_gate_product_kernel_under_vmap_equals_each_member_alone(extras):
    """A population vmaps acting over its members (each with its own product, gate, biases
    and M5's term): the batched kernel gives each member what the kernel gives that member
    alone (to float rounding: the interpreter evaluates the batched arithmetic in another
    order; another member's columns or gate would be off by O(1)), from a float32 and a
    bfloat16 product, and lowers to one Triton call at a population's acting size (16 members
    × 4,096 environments)."""
    f, rows = 24, 45
    members = []
    for i in range(3):
        src, _, coeffs, w_res = _sources(rows, 2 * f + 1, 1, f, seed=90 + i)
        more = _extras(rows, f, extras, seed=95 + i)
        members.append((src, coeffs, w_res, more["u_bias"], more["g_bias"], more.get("cond")))
    stack = lambda *xs: None if xs[0] is None else jax.tree.map(lambda *a: jnp.stack(a), *xs)
    batched = [stack(*parts) for parts in zip(*members, strict=True)]
    blocks = GateProductBlocks(16, 16, 4)
    for dtype in (jnp.float32, jnp.bfloat16):

        def run(src, c, w, bu, bg, cond, dtype=dtype):
            kw = dict(u0=0, g0=f, width=f, u_bias=bu, g_bias=bg, cond=cond, blocks=blocks)
            src = src.astype(dtype)
            return gate_product_pallas(src, src, c, w, **kw, interpret=BACKEND == "interpret")

        got = np.asarray(jax.vmap(run)(*batched))
        for i, args in enumerate(members):
            want = np.asarray(run(*args), np.float32)
            scale = np.abs(want).max()
            np.testing.assert_allclose(got[i].astype(np.float32) / scale, want / scale, atol=2e-6)
    spec = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    p, rows, f, rank = 16, 4096, 256, 3

    def fn(src, c, w, bu, bg, cond):
        kw = dict(u0=768, g0=1792, width=f, u_bias=bu, g_bias=bg, cond=cond)
        return gate_product_pallas(src, src, c, w, **kw)

    cond = (spec(p, rows, rank), spec(p, rank, f), spec(p, rank, f))
    args = (spec(p, rows, 2048), spec(p, f, 8), spec(p, f), spec(p, f), spec(p, f), cond)
    text = jax.jit(jax.vmap(fn)).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("__gpu$xla.gpu.triton") == 1
