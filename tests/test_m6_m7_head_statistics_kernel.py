"""M6 + M7 for acting as one Pallas kernel (pallas_kernels/head_statistics.py): the dueling
heads with E[Z], Var[Z] and the quantiles in the epilogue, no logits written.

The kernel runs in interpret mode on the CPU; set JAXDQN_KERNEL_BACKEND=pallas on a GPU to run
the same checks against the compiled Triton kernel. Lowering for CUDA (Pallas → Triton IR) is
checked on the CPU at acting's size.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdqn.model import distribution as D
from pallas_kernels.head_statistics import (
    HeadStatBlocks,
    fold_dueling,
    head_statistics_available,
    head_statistics_pallas,
    pad_groups,
)
from pallas_kernels.heads import dueling_heads_reference
from pallas_kernels.statistics import cumsum_by_products

BACKEND = os.environ.get("JAXDQN_KERNEL_BACKEND", "interpret")
A, LEVELS = 3, tuple(D.QUANTILE_LEVELS)


def _inputs(rows: int, m: int, k: int, n: int, seed: int, scale: float = 1.0):
    ka, kw, kb, kv, kd = jax.random.split(jax.random.PRNGKey(seed), 5)
    return (
        jax.random.normal(ka, (rows, m * k)),
        scale * jax.random.normal(kw, (m, k, (1 + A) * n)) / np.sqrt(k),
        0.3 * jax.random.normal(kb, (m, (1 + A) * n)),
        jax.random.uniform(kv, (rows,), minval=-2.0, maxval=-1.0),
        jax.random.uniform(kd, (rows,), minval=0.05, maxval=0.2),
    )


SMALL = HeadStatBlocks(16, 16, 4)


def _kernel(*args, blocks=SMALL, levels=LEVELS, **kw):
    return head_statistics_pallas(
        *args, actions=A, levels=levels, blocks=blocks, interpret=BACKEND == "interpret", **kw
    )


def _by_hand(a, w, b, v_min, dz, levels=LEVELS):
    """float64 numpy: each branch's product, the dueling combination, softmax, moments on the
    support and numpy.interp of the CDF."""
    a, w, b = (np.asarray(x, np.float64) for x in (a, w, b))
    m, k, f = w.shape
    n = f // (1 + A)
    o = np.stack([a[:, i * k : (i + 1) * k] @ w[i] + b[i] for i in range(m)], 1)
    v, adv = o[..., :n], o[..., n:].reshape(a.shape[0], m, A, n)
    x = v[:, :, None] + adv - adv.mean(2, keepdims=True)
    p = np.exp(x - x.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    z = np.asarray(v_min, np.float64)[:, None] + np.asarray(dz, np.float64)[:, None] * np.arange(n)
    z = np.broadcast_to(z[:, None, None], p.shape)
    mean = (p * z).sum(-1)
    var = (p * z * z).sum(-1) - mean**2
    cdf = np.cumsum(p, -1).reshape(-1, n)
    quant = np.stack(
        [np.interp(levels, c, zr) for c, zr in zip(cdf, z.reshape(-1, n), strict=True)]
    )
    return mean, var, quant.reshape(*mean.shape, len(levels))


@pytest.mark.parametrize(
    "rows,m,k,n",
    [(37, 3, 40, 51), (70, 1, 24, 51), (16, 2, 259, 21), (33, 3, 16, 5)],
    ids=str,
)
def test_m6_m7_head_statistics_kernel_equals_numpy(rows, m, k, n):
    """Ragged rows and inputs (K = 259 is not a multiple of any block), any atom count."""
    args = _inputs(rows, m, k, n, seed=rows + k)
    with jax.default_matmul_precision("highest"):
        got = _kernel(*args)
    want = _by_hand(*args)
    chex_shapes = [(rows, m, A), (rows, m, A), (rows, m, A, len(LEVELS))]
    assert [tuple(g.shape) for g in got] == chex_shapes
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=2e-5)


def test_m6_m7_head_statistics_kernel_equals_its_jnp_reference_at_default_precision():
    """The kernel's products at the default precision, as the model's acting pass runs them,
    and two tilings: the same statistics as the jnp reference (the heads' reference, then the
    model's M7: softmax, moments, definition-by-count quantiles) to float rounding."""
    args = _inputs(50, 3, 48, 51, seed=3, scale=3.0)
    a, w, b, v_min, dz = args
    logits = dueling_heads_reference(a, w, b, A)
    want = D.statistics_of_logits(logits, v_min[:, None, None], dz[:, None, None])[1:]
    for blocks in (SMALL, HeadStatBlocks(32, 32, 4)):
        got = _kernel(*args, blocks=blocks)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=5e-5)


def test_m6_m7_head_statistics_kernel_on_peaked_and_flat_distributions():
    """A head whose logits put all mass on one atom (E[Z] is that atom's value: atoms 17, 17
    and 40 here, the last moved by action 2's advantage) or spread it evenly (E[Z] is the
    support's middle); every statistic as float64 numpy computes it, at other levels too."""
    n, k, rows = 51, 16, 3
    w = np.zeros((1, k, (1 + A) * n), np.float32)
    b = np.zeros((1, (1 + A) * n), np.float32)
    b[0, 17] = 80.0  # the value head: all three actions peak on atom 17 …
    b[0, n + 2 * n + 40] = 200.0  # … except action 2, whose advantage moves it to atom 40
    a = np.zeros((rows, k), np.float32)
    v_min, dz = jnp.full((rows,), -1.0), jnp.full((rows,), 0.1)
    levels = (0.05, 0.5, 0.95)
    got = _kernel(a, w, b, v_min, dz, levels=levels)
    want = _by_hand(a, w, b, v_min, dz, levels)
    for g, wn in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), wn, atol=1e-5)
    peaks = [-1 + 1.7, -1 + 1.7, -1 + 4.0]  # atoms 17, 17, 40
    np.testing.assert_allclose(np.asarray(got.mean[0, 0]), peaks, atol=1e-5)
    flat = _kernel(a, w, np.zeros_like(b), v_min, dz, levels=levels)
    np.testing.assert_allclose(np.asarray(flat.mean), 1.5, atol=1e-5)  # −1 + 25·0.1
    uniform = _by_hand(a, w, np.zeros_like(b), v_min, dz, levels)[2]
    np.testing.assert_allclose(np.asarray(flat.quantiles), uniform, atol=1e-5)


@pytest.mark.parametrize("rows,m,k,n", [(37, 3, 40, 51), (16, 2, 259, 21)], ids=str)
def test_m6_m7_head_statistics_aligned_weights_give_the_same_numbers(rows, m, k, n):
    """``aligned=True`` reads each column group zero-padded to NP atoms: the same tiles, so
    every statistic equals the packed layout's to float rounding (interpret mode's XLA may sum a
    tile product in another order: 1 ulp seen), and float64 numpy's to the usual tolerance. The
    padded layout itself: group s at columns s·NP … s·NP + N − 1, zeros after."""
    args = _inputs(rows, m, k, n, seed=rows + n)
    packed = _kernel(*args)
    aligned = _kernel(*args, aligned=True)
    for g, want in zip(aligned, packed, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(want), rtol=1e-5, atol=1e-6)
    with jax.default_matmul_precision("highest"):
        hi = _kernel(*args, aligned=True)
    for g, want in zip(hi, _by_hand(*args), strict=True):
        np.testing.assert_allclose(np.asarray(g), want, rtol=1e-4, atol=2e-5)
    w = np.asarray(args[1])
    padded = np.asarray(pad_groups(args[1], A))
    np_ = 1 << (n - 1).bit_length()
    assert padded.shape == (m, k, (1 + A) * np_)
    for s in range(1 + A):
        np.testing.assert_array_equal(
            padded[..., s * np_ : s * np_ + n], w[..., s * n : (s + 1) * n]
        )
        assert not padded[..., s * np_ + n : (s + 1) * np_].any()


@pytest.mark.parametrize("rows,m,k,n", [(37, 3, 40, 51), (16, 2, 259, 21), (33, 1, 16, 5)], ids=str)
def test_m6_m7_head_statistics_per_action_equals_numpy_and_the_fused_schedule(rows, m, k, n):
    """``per_action=True`` (the dueling combination folded into the weights, one program per
    action): float64 numpy's statistics to the usual tolerance, the fused schedule's to float
    rounding (the weights are summed before the product), two tilings; ragged rows and K."""
    args = _inputs(rows, m, k, n, seed=rows + 2 * n, scale=3.0)
    with jax.default_matmul_precision("highest"):
        got = _kernel(*args, per_action=True)
    for g, want in zip(got, _by_hand(*args), strict=True):
        np.testing.assert_allclose(np.asarray(g), want, rtol=1e-4, atol=2e-5)
    fused = _kernel(*args)
    for blocks in (SMALL, HeadStatBlocks(32, 32, 4)):
        per_action = _kernel(*args, blocks=blocks, per_action=True)
        for g, want in zip(per_action, fused, strict=True):
            np.testing.assert_allclose(np.asarray(g), np.asarray(want), rtol=1e-4, atol=5e-5)


def test_m6_fold_dueling_is_each_actions_logits_as_one_linear_map():
    """``a w'_j + b'_j`` equals the dueling logits ``v + A_j − mean_i A_i`` (float64 numpy), and
    the padded atoms (7 → 16, the kernels' smallest lane count) are zero."""
    a, w, b, _, _ = _inputs(9, 2, 12, 7, seed=4)
    fw, fb = fold_dueling(w, b, A)
    assert fw.shape == (2, 12, A * 16) and fb.shape == (2, A * 16)
    want = np.asarray(dueling_heads_reference(*(np.asarray(x, np.float64) for x in (a, w, b)), A))
    a64 = np.asarray(a, np.float64)
    for i in range(2):
        o = a64[:, i * 12 : (i + 1) * 12] @ np.asarray(fw[i], np.float64) + np.asarray(fb[i])
        o = o.reshape(9, A, 16)
        np.testing.assert_allclose(o[..., :7], want[:, i], rtol=1e-5, atol=1e-5)
        assert not np.asarray(fw[i]).reshape(12, A, 16)[..., 7:].any()
        assert not np.asarray(fb[i]).reshape(A, 16)[:, 7:].any()


def test_m7_cumsum_by_products_equals_a_sequential_cumsum_to_float_rounding():
    """The CDF as three bfloat16 parts times the triangular ones matrix: every term exact, so
    the sums differ from a sequential float64 cumsum by rounding only (a one-part split, plain
    bfloat16, is off by ~1e-3: the split is what makes it exact)."""
    x = jax.random.normal(jax.random.PRNGKey(5), (64, 64)) * 3.0
    p = jax.nn.softmax(x, axis=1)
    want = np.cumsum(np.asarray(p, np.float64), axis=1)
    got = np.asarray(cumsum_by_products(p))
    np.testing.assert_allclose(got, want, rtol=0, atol=3e-7)
    upper = np.triu(np.ones((64, 64), np.float32))
    one_part = np.asarray(p.astype(jnp.bfloat16).astype(jnp.float32)) @ upper
    assert np.abs(one_part - want).max() > 1e-4


def test_m6_m7_head_statistics_kernel_with_the_cdf_as_products_equals_numpy():
    args = _inputs(37, 3, 40, 51, seed=11, scale=3.0)
    with jax.default_matmul_precision("highest"):
        got = _kernel(*args, cdf="products")
    for g, want in zip(got, _by_hand(*args), strict=True):
        np.testing.assert_allclose(np.asarray(g), want, rtol=1e-4, atol=2e-5)
    with pytest.raises(ValueError, match="cdf must be scan or products"):
        head_statistics_pallas(*args, actions=A, levels=LEVELS, cdf="sorted", interpret=True)


def test_m6_m7_head_statistics_kernel_refuses_bad_shapes_and_blocks():
    a, w, b, v_min, dz = _inputs(8, 2, 16, 51, seed=0)
    with pytest.raises(ValueError, match=r"a must be \[B, m·K\]"):
        _kernel(a[:, :20], w, b, v_min, dz)
    with pytest.raises(ValueError, match=r"v_min and delta_z must be \[B\]"):
        _kernel(a, w, b, v_min[:3], dz)
    with pytest.raises(ValueError, match="powers of two"):
        _kernel(a, w, b, v_min, dz, blocks=HeadStatBlocks(24, 16, 4))


def test_m6_m7_head_statistics_kernel_lowers_to_triton_at_acting_size():
    """Pallas → Triton IR for CUDA on the CPU at E = 65,536 rows of the three fused branches,
    float32 (TF32) and bf16 operands (visible as truncations to bf16 in the IR)."""
    spec = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    rows, m, k, n = 65536, 3, 256, 51
    for bf16, aligned, cdf, per_action in (
        (False, False, "scan", False), (True, False, "scan", False),
        (False, True, "products", False), (False, False, "scan", True),
    ):  # fmt: skip
        fn = jax.jit(
            functools.partial(
                head_statistics_pallas,
                actions=A,
                levels=LEVELS,
                bf16=bf16,
                aligned=aligned,
                cdf=cdf,
                per_action=per_action,
            )
        )
        args = (spec(rows, m * k), spec(m, k, 4 * n), spec(m, 4 * n), spec(rows), spec(rows))
        text = fn.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
        assert text.count("__gpu$xla.gpu.triton") == 1
        assert ("truncf" in text) == (bf16 or cdf == "products")


@pytest.mark.parametrize("per_action", [False, True], ids=["fused", "per_action"])
def test_m6_m7_head_statistics_reads_a_bfloat16_a_as_its_bf16_products_would_round_it(per_action):
    """With ``bf16`` the products round ``a`` to bfloat16 anyway, so a bfloat16 ``a`` (acting's
    gate kernel writes it so under kernels.matmul=bf16) is read as it is: on a GPU (Triton
    rounds the operands to nearest even, as the gate kernel's store does) its statistics are
    those of its float32 widening and of the float32 ``a`` itself, bit for bit; the CPU
    computes BF16_BF16_F32 products in float32, so there they agree with the widening's to
    float32 rounding. In the IR, XLA widens a bfloat16 ``a`` before the call only without
    ``bf16``: with it, the Triton call reads ``a`` as it is."""
    a, w, b, v_min, dz = _inputs(37, 3, 40, 51, seed=3)
    a16 = a.astype(jnp.bfloat16)
    assert not np.array_equal(np.asarray(a16.astype(jnp.float32)), np.asarray(a))

    def same(xs, ys):
        for x, y in zip(xs, ys, strict=True):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))

    kw = dict(bf16=True, per_action=per_action)
    got = _kernel(a16, w, b, v_min, dz, **kw)  # a bfloat16 `a` reaches the kernel (IR below)
    widened = _kernel(a16.astype(jnp.float32), w, b, v_min, dz, **kw)
    if BACKEND == "pallas":  # Triton rounds float32 operands to nearest even
        same(got, widened)
        same(got, _kernel(a, w, b, v_min, dz, **kw))
    else:  # float32 products, which XLA may rearrange around the widening
        for x, y in zip(got, widened, strict=True):
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-5)
    spec = lambda dtype, *s: jax.ShapeDtypeStruct(s, dtype)
    f32 = jnp.float32
    args = (spec(f32, 3, 256, 204), spec(f32, 3, 204), spec(f32, 65536), spec(f32, 65536))
    for bf16 in (True, False):
        fn = functools.partial(
            head_statistics_pallas, actions=A, levels=LEVELS, bf16=bf16, per_action=per_action
        )
        text = jax.jit(fn).trace(spec(jnp.bfloat16, 65536, 768), *args)
        text = text.lower(lowering_platforms=("cuda",)).as_text()
        widen = "stablehlo.convert %arg0 : (tensor<65536x768xbf16>) -> tensor<65536x768xf32>"
        assert (widen in text) == (not bf16)  # else the Triton call reads %arg0 as it is


def test_m6_m7_head_statistics_available_warns_once_on_the_cpu_and_is_true_on_a_gpu():
    if jax.default_backend() == "gpu":
        assert head_statistics_available(3, 256, 51, A, LEVELS)
        return
    with pytest.warns(RuntimeWarning, match="head_statistics"):
        assert not head_statistics_available(3, 17, 51, A, LEVELS)


@pytest.mark.parametrize("per_action", [False, True], ids=["fused", "per_action"])
def test_m6_m7_head_statistics_under_vmap_equals_each_member_alone(per_action):
    """A population vmaps acting over its members, each with its own head weights and
    supports: the batched kernel (Pallas's batching rule adds a grid axis) gives each member
    what the kernel gives that member alone (to float rounding: the interpreter evaluates the
    batched kernel's arithmetic in another order; a member given another's weights or rows
    would be off by O(1)), and lowers to one Triton call at a
    population's acting size (16 members × 4,096 environments)."""
    members = [_inputs(37, 3, 40, 51, seed=70 + i, scale=3.0) for i in range(3)]
    stacked = [jnp.stack(parts) for parts in zip(*members, strict=True)]
    run = functools.partial(_kernel, per_action=per_action)
    got = jax.vmap(run)(*stacked)
    for i, args in enumerate(members):
        for g, want in zip(got, run(*args), strict=True):
            np.testing.assert_allclose(np.asarray(g[i]), np.asarray(want), rtol=1e-5, atol=2e-6)
    spec = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    p, rows, m, k, n = 16, 4096, 3, 256, 51
    args = (spec(p, rows, m * k), spec(p, m, k, 4 * n), spec(p, m, 4 * n))
    fn = functools.partial(head_statistics_pallas, actions=A, levels=LEVELS, per_action=per_action)
    traced = jax.jit(jax.vmap(fn)).trace(*args, spec(p, rows), spec(p, rows))
    text = traced.lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("__gpu$xla.gpu.triton") == 1
