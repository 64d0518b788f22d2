"""M7 as one Pallas kernel (pallas_kernels/statistics.py, ``kernels.statistics``).

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
from pallas_kernels import fallbacks
from pallas_kernels.statistics import c51_statistics_pallas

BACKEND = os.environ.get("JAXDQN_KERNEL_BACKEND", "interpret")


def _inputs(rows: int, n: int, seed: int, spread: float = 3.0):
    kx, kv, kd = jax.random.split(jax.random.PRNGKey(seed), 3)
    return (
        spread * jax.random.normal(kx, (rows, n)),
        jax.random.uniform(kv, (rows,), minval=-2.0, maxval=-1.0),
        jax.random.uniform(kd, (rows,), minval=0.05, maxval=0.2),
    )


def _by_hand(logits, v_min, dz):
    """float64 numpy: softmax, moments and numpy.interp of each row's CDF."""
    x = np.asarray(logits, np.float64)
    p = np.exp(x - x.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    i = np.arange(x.shape[-1])
    z = np.asarray(v_min, np.float64)[:, None] + np.asarray(dz, np.float64)[:, None] * i
    mean = (p * z).sum(-1)
    var = (p * z * z).sum(-1) - mean**2
    cdfs = np.cumsum(p, axis=-1)
    quant = np.stack([np.interp(D.QUANTILE_LEVELS, c, zr) for c, zr in zip(cdfs, z, strict=True)])
    return mean, var, quant


def _peaked_rows(n: int = 51):
    """Four rows of logits: all mass on atom 17, on atom 0, uniform, on the last atom; with
    v_min = −1 and Δz = 0.1."""
    rows = np.full((4, n), -60.0, np.float32)
    rows[0, 17] = 60.0
    rows[1, 0] = 60.0
    rows[2, :] = 0.0
    rows[3, n - 1] = 60.0
    return rows, jnp.full((4,), -1.0), jnp.full((4,), 0.1)


def _branch_inputs_and_loss(spread: float):
    """``[2, 4, 3, 51]`` logits with per-row supports, and ``loss(backend)``: a weighted sum
    of E[Z], Var[Z] and the median from :func:`D.statistics_of_logits` (for gradients)."""
    logits, v_min, dz = _inputs(24, 51, seed=5, spread=spread)
    logits = logits.reshape(2, 4, 3, 51)
    v_min, dz = v_min[:2, None, None], dz[:2, None, None]
    w = jax.random.normal(jax.random.PRNGKey(9), (3, 2, 4, 3))

    def loss(backend):
        def f(x, vm, d):
            _, mean, var, quant = D.statistics_of_logits(x, vm, d, backend)
            return jnp.sum(mean * w[0]) + jnp.sum(var * w[1]) + jnp.sum(quant[..., 1] * w[2])

        return f

    return logits, v_min, dz, loss


@pytest.mark.parametrize("shape", [(37, 51), (200, 51), (64, 5), (17, 21)], ids=str)
def test_m7_statistics_kernel_equals_numpy_and_the_jnp_reference(shape):
    logits, v_min, dz = _inputs(*shape, seed=sum(shape))
    got = c51_statistics_pallas(
        logits, v_min, dz, levels=D.QUANTILE_LEVELS, interpret=BACKEND == "interpret"
    )
    ref = D.statistics(jax.nn.softmax(logits, axis=-1), v_min, dz)
    for a, b in zip(got, ref, strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    for a, b in zip(got, _by_hand(logits, v_min, dz), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_m7_statistics_kernel_on_peaked_and_flat_rows():
    """One-hot-like rows (the CDF jumps over every level at atom 17: k = 17, and the linear
    CDF between z_16 and z_17 puts Q(τ) at z_16 + τ·Δz), a row peaked on atom 0 (k = 0:
    Q = v_min), a flat row, a row peaked on the last atom, and the variance clamp at zero."""
    rows, v_min, dz = _peaked_rows()
    mean, var, quant = c51_statistics_pallas(
        jnp.asarray(rows), v_min, dz, levels=D.QUANTILE_LEVELS, interpret=BACKEND == "interpret"
    )
    want = D.statistics(jax.nn.softmax(jnp.asarray(rows), axis=-1), v_min, dz)
    for a, b in zip((mean, var, quant), want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(mean[:2], [-1.0 + 1.7, -1.0], atol=1e-5)
    np.testing.assert_allclose(quant[1], [-1.0] * 3, atol=1e-6)
    np.testing.assert_allclose(
        quant[0], [-1.0 + 0.1 * (16 + t) for t in D.QUANTILE_LEVELS], atol=1e-5
    )
    assert float(jnp.min(var)) >= 0.0


def test_m7_statistics_of_logits_backends_agree_in_values_and_gradients():
    """``statistics_of_logits``: the kernel path gives the reference's values and, through its
    custom VJP, the reference's gradients (logits, v_min and Δz), also under vmap."""
    logits, v_min, dz, loss = _branch_inputs_and_loss(spread=3.0)

    ref = D.statistics_of_logits(logits, v_min, dz, "reference")
    got = D.statistics_of_logits(logits, v_min, dz, BACKEND)
    failed = {k: v for k, v in fallbacks().items() if k[0] == "c51_statistics"}
    assert not failed, f"the Pallas kernel fell back to the reference: {failed}"
    for a, b in zip(got, ref, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    g_ref = jax.grad(loss("reference"), argnums=(0, 1, 2))(logits, v_min, dz)
    g_got = jax.grad(loss(BACKEND), argnums=(0, 1, 2))(logits, v_min, dz)
    for a, b in zip(g_got, g_ref, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    batched = jax.vmap(lambda x: D.statistics_of_logits(x, v_min, dz, BACKEND)[1])
    np.testing.assert_allclose(batched(jnp.stack([logits, -logits]))[0], ref[1], rtol=1e-5)
    with pytest.raises(ValueError, match=r"kernels\.statistics"):
        D.statistics_of_logits(logits, v_min, dz, "triton")


def test_m7_statistics_kernel_lowers_to_triton_at_acting_size():
    """Pallas → Triton IR for CUDA on the CPU at E = 65,536 × 12 rows of 51 atoms."""
    rows = 65536 * 12
    spec = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    fn = jax.jit(functools.partial(c51_statistics_pallas, levels=D.QUANTILE_LEVELS))
    text = fn.trace(spec(rows, 51), spec(rows), spec(rows)).lower(lowering_platforms=("cuda",))
    assert text.as_text().count("__gpu$xla.gpu.triton") == 1


# --------------------------------------------------------------------------------------------
# kernels.statistics=scan: the same statistics as one left-to-right pass over the atoms (jnp)


@pytest.mark.parametrize("shape", [(37, 51), (200, 51), (64, 5), (17, 21)], ids=str)
def test_m7_statistics_scan_equals_numpy_and_the_jnp_reference(shape):
    """Well-conditioned rows (spread 1: no atom with a vanishing probability next to a level,
    where the interpolated quantile turns on the last bit of the CDF in either order)."""
    logits, v_min, dz = _inputs(*shape, seed=sum(shape), spread=1.0)
    got = D.statistics_by_scan(logits, v_min, dz)
    ref = D.statistics(jax.nn.softmax(logits, axis=-1), v_min, dz)
    for a, b in zip(got, ref, strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    for a, b in zip(got, _by_hand(logits, v_min, dz), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_m7_statistics_scan_on_peaked_and_flat_rows_and_other_levels():
    """The kernel test's rows (one-hot at 17: Q(τ) = z_16 + τ·Δz; at atom 0: Q = v_min;
    uniform; the last atom) and levels at both ends, where every CDF value is below τ = 1 − ε
    only if the CDF rounds low (the reference's clamp k = N − 1 is taken then)."""
    rows, v_min, dz = _peaked_rows()
    n = rows.shape[1]
    mean, var, quant = D.statistics_by_scan(jnp.asarray(rows), v_min, dz)
    want = D.statistics(jax.nn.softmax(jnp.asarray(rows), axis=-1), v_min, dz)
    for a, b in zip((mean, var, quant), want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(mean[:2], [-1.0 + 1.7, -1.0], atol=1e-5)
    np.testing.assert_allclose(quant[1], [-1.0] * 3, atol=1e-6)
    np.testing.assert_allclose(quant[0], [-1.0 + 0.1 * (16 + t) for t in D.QUANTILE_LEVELS])
    np.testing.assert_allclose(quant[3], [-1.0 + 0.1 * (n - 2 + t) for t in D.QUANTILE_LEVELS])
    levels = (0.001, 0.25, 0.999, 1.5)  # 1.5: above every CDF value, the clamp's case
    logits, v_min, dz = _inputs(40, n, seed=3, spread=1.0)
    got = D.statistics_by_scan(logits, v_min, dz, levels)[2]
    ref = D.quantiles(jax.nn.softmax(logits, axis=-1), v_min, dz, levels)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[:, 3], v_min + dz * (n - 1), rtol=1e-6)


def test_m7_statistics_scan_is_one_pass_of_slices():
    """The point of the formulation: no reduction, cumulative sum or gather over the atom axis
    (XLA fuses slices and elementwise work into one kernel), where the reference has them."""
    logits, v_min, dz = _inputs(8, 51, seed=1)
    prims = lambda f: {e.primitive.name for e in jax.make_jaxpr(f)(logits, v_min, dz).eqns}
    scan = prims(D.statistics_by_scan)
    ref = prims(lambda x, vm, d: D.statistics(jax.nn.softmax(x, axis=-1), vm, d))
    heavy = {"reduce_sum", "reduce_max", "cumsum", "gather"}
    assert heavy & ref and not heavy & scan, (sorted(scan), sorted(ref))


def test_m7_statistics_of_logits_scan_agrees_in_values_and_gradients():
    """``statistics_of_logits(..., "scan")``: the reference's values to float rounding and,
    through the custom VJP, exactly the reference's gradients; also under vmap and jit."""
    logits, v_min, dz, loss = _branch_inputs_and_loss(spread=1.0)

    ref = D.statistics_of_logits(logits, v_min, dz, "reference")
    got = jax.jit(functools.partial(D.statistics_of_logits, backend="scan"))(logits, v_min, dz)
    for a, b in zip(got, ref, strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    g_ref = jax.grad(loss("reference"), argnums=(0, 1, 2))(logits, v_min, dz)
    g_got = jax.grad(loss("scan"), argnums=(0, 1, 2))(logits, v_min, dz)
    for a, b in zip(g_got, g_ref, strict=True):
        np.testing.assert_array_equal(a, b)
    batched = jax.vmap(lambda x: D.statistics_of_logits(x, v_min, dz, "scan")[3])
    np.testing.assert_allclose(batched(jnp.stack([logits, -logits]))[0], ref[3], rtol=1e-5)
