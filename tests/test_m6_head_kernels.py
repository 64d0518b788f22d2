"""M6: the dueling C51 heads of several branches as Pallas kernels (pallas_kernels/heads.py).

The kernels run in interpret mode on the CPU; set JAXDQN_KERNEL_BACKEND=pallas on a GPU to run
the same checks against the compiled Triton kernels. Lowering for CUDA (Pallas → Triton IR) is
checked on the CPU too, at configs/gpu.yaml sizes.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import fallbacks
from pallas_kernels.heads import (
    HeadBlocks,
    dueling_heads,
    dueling_heads_bwd_pallas,
    dueling_heads_fwd_pallas,
    dueling_heads_reference,
)

BACKEND = os.environ.get("JAXDQN_KERNEL_BACKEND", "interpret")


def kernel(a, w, b, actions=3):
    out = dueling_heads(a, w, b, actions=actions, backend=BACKEND)
    if BACKEND == "pallas":
        failed = {k: v for k, v in fallbacks().items() if k[0] == "dueling_heads"}
        assert not failed, f"the Pallas kernels fell back to the reference: {failed}"
    return out


def _inputs(rows: int, m: int, k: int, n: int, seed: int):
    ka, kw, kb, kg = jax.random.split(jax.random.PRNGKey(seed), 4)
    return (
        jax.random.normal(ka, (rows, m * k)),
        0.2 * jax.random.normal(kw, (m, k, 4 * n)),
        jax.random.normal(kb, (m, 4 * n)),
        jax.random.normal(kg, (rows, m, 3, n)),
    )


def _by_hand(a, w, b):
    """float64 numpy: each branch's o = a_k W_k + b_k, then v + A_j − mean A."""
    a, w, b = (np.asarray(x, np.float64) for x in (a, w, b))
    m, k, f = w.shape
    n = f // 4
    out = np.zeros((a.shape[0], m, 3, n))
    for i in range(m):
        o = a[:, i * k : (i + 1) * k] @ w[i] + b[i]
        v, adv = o[:, :n], o[:, n:].reshape(-1, 3, n)
        out[:, i] = v[:, None] + adv - adv.mean(axis=1, keepdims=True)
    return out


# (rows, m, K, N): ragged rows, K not a power of two and below/above one block, N = 51 padded
# to 64, tiny N padded to 16, one branch.
SHAPES = [(37, 3, 16, 51), (130, 4, 40, 51), (64, 1, 16, 5), (17, 2, 72, 21)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_m6_head_kernels_forward_equals_the_dueling_heads_by_hand(shape):
    a, w, b, _ = _inputs(*shape, seed=sum(shape))
    want = _by_hand(a, w, b)
    np.testing.assert_allclose(dueling_heads_reference(a, w, b, 3), want, rtol=1e-5, atol=1e-5)
    got = kernel(a, w, b)
    assert got.shape == want.shape and got.dtype == jnp.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # The dueling combination itself: A_j − mean_j A_j sums to zero over actions, so the mean
    # over actions of the logits is the value stream v = a_k W_V + b_V.
    _, m, k, n = shape
    v = np.stack(
        [np.asarray(a[:, i * k : (i + 1) * k] @ w[i, :, :n] + b[i, :n]) for i in range(m)], 1
    )
    np.testing.assert_allclose(np.asarray(got).mean(axis=2), v, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_m6_head_kernels_gradients_equal_autodiff_of_the_reference(shape):
    a, w, b, g = _inputs(*shape, seed=7 + sum(shape))

    def grads(backend):
        heads = kernel if backend == BACKEND else functools.partial(dueling_heads, backend=backend)
        loss = lambda a, w, b: jnp.sum(heads(a, w, b, actions=3) * g)
        return jax.grad(loss, argnums=(0, 1, 2))(a, w, b)

    for got, want in zip(grads(BACKEND), grads("reference"), strict=True):
        scale = float(jnp.max(jnp.abs(want)))
        assert scale > 0
        np.testing.assert_allclose(got / scale, want / scale, atol=2e-6)


@pytest.mark.parametrize("actions", [2, 5])
def test_m6_head_kernels_take_any_number_of_actions(actions):
    """w [m, K, (1+A)·N]: the dueling mean and its transpose over A actions."""
    rows, m, k, n = 40, 2, 16, 9
    ka, kw, kb, kg = jax.random.split(jax.random.PRNGKey(actions), 4)
    a = jax.random.normal(ka, (rows, m * k))
    w = 0.2 * jax.random.normal(kw, (m, k, (1 + actions) * n))
    b = jax.random.normal(kb, (m, (1 + actions) * n))
    g = jax.random.normal(kg, (rows, m, actions, n))
    want = dueling_heads_reference(a, w, b, actions)
    assert want.shape == (rows, m, actions, n)
    got = kernel(a, w, b, actions)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

    def grads(backend):
        f = lambda a, w, b: jnp.sum(dueling_heads(a, w, b, actions=actions, backend=backend) * g)
        return jax.grad(f, argnums=(0, 1, 2))(a, w, b)

    for x, y in zip(grads(BACKEND), grads("reference"), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)


def test_m6_head_kernels_bias_gradient_is_the_row_sum_of_the_dueling_cotangent():
    """db_k = Σ_rows [ḡ | g_j − ḡ/3] by hand, with several row shares in the dW kernel (its
    partials are added outside the kernel: every share must be counted once)."""
    rows, m, k, n = 200, 2, 16, 51
    a, w, _, g = _inputs(rows, m, k, n, seed=11)
    blocks = HeadBlocks(dw_br=16, dw_programs=16)  # 13 row tiles over several shares
    _, _, db = dueling_heads_bwd_pallas(
        a, w, g.reshape(rows, -1), actions=3, blocks=blocks, interpret=BACKEND == "interpret"
    )
    gg = np.asarray(g, np.float64)
    total = gg.sum(axis=2)  # [rows, m, N]
    want = np.concatenate(
        [total.sum(0)[:, None]] + [(gg[:, :, j] - total / 3).sum(0)[:, None] for j in range(3)],
        axis=1,
    ).reshape(m, 4 * n)
    np.testing.assert_allclose(db, want, rtol=1e-4, atol=1e-4)


def test_m6_head_kernels_refuse_bad_shapes_and_blocks():
    a, w, b, _ = _inputs(8, 2, 16, 5, seed=0)
    with pytest.raises(ValueError, match=r"a must be \[B, m·K\]"):
        dueling_heads(a[:, :-1], w, b, actions=3, backend=BACKEND)
    with pytest.raises(ValueError, match=r"w must be \[m, K, \(1\+A\)·N\]"):
        dueling_heads(a, w[..., :-1], b, actions=3, backend=BACKEND)
    with pytest.raises(ValueError, match="powers of two"):
        HeadBlocks(fwd_bm=48)
    with pytest.raises(ValueError, match="powers of two"):
        HeadBlocks(da_bn=8)


@pytest.mark.slow
@pytest.mark.parametrize("bf16", [False, True], ids=["f32", "bf16"])
def test_m6_head_kernels_lower_to_triton_at_gpu_sizes(bf16):
    """Pallas → Triton IR for CUDA on the CPU (no GPU needed) at configs/gpu.yaml sizes
    (B = 4,096, 4 branches, AH = 256, 51 atoms): block shapes, masks and dot layouts pass
    Triton's lowering rules. bf16 rounds the operands in the IR (``arith.truncf``); f32
    keeps them."""
    rows, m, k, n = 4096, 4, 256, 51
    spec = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    a, w, b, g = spec(rows, m * k), spec(m, k, 4 * n), spec(m, 4 * n), spec(rows, m * 3 * n)
    calls = {}
    for name, fn, args in (
        ("fwd", dueling_heads_fwd_pallas, (a, w, b)),
        ("bwd", dueling_heads_bwd_pallas, (a, w, g)),
    ):
        fn = jax.jit(functools.partial(fn, actions=3, bf16=bf16))
        text = fn.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
        calls[name] = text.count("__gpu$xla.gpu.triton")
        assert ("truncf" in text) == bf16, name
    assert calls == {"fwd": 1, "bwd": 2}
