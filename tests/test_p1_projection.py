"""P1: C51 projection — the Pallas "pull" kernels (window and hat) and the jnp reference against
a float64 computation.

The kernels run in interpret mode on CPU; JAXDQN_KERNEL_BACKEND=pallas on a GPU runs the same
checks against the compiled Triton kernels (and fails if one silently fell back).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import jaxprs_in_params

from pallas_kernels import c51_project, c51_project_reference, fallbacks
from pallas_kernels.projection import TILINGS, c51_project_pallas

BACKEND = os.environ.get("JAXDQN_KERNEL_BACKEND", "interpret")
BLOCK = 16  # small blocks so that the test shapes leave a ragged last block
N = 51


def _rng() -> np.random.Generator:
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")
    return np.random.default_rng(seed)


def project64(probs, atoms, v_min, delta_z) -> np.ndarray:
    """Σ_j p_j·max(0, 1 − |b_j − i|) in float64 from the (float32) inputs, as an [R, N, N] sum."""
    p = np.asarray(probs, np.float64)
    n = p.shape[-1]
    lead = p.shape[:-1]
    vm = np.broadcast_to(np.asarray(v_min, np.float64), lead)[..., None]
    dz = np.broadcast_to(np.asarray(delta_z, np.float64), lead)[..., None]
    b = np.clip((np.asarray(atoms, np.float64) - vm) / dz, 0.0, n - 1)
    hat = np.maximum(0.0, 1.0 - np.abs(b[..., :, None] - np.arange(n)))
    return np.einsum("...j,...ji->...i", p, hat)


def tol(n: int = N) -> float:
    """What float32 allows ``rel_err`` of an n-atom projection: b = (z − v_min)/Δz is rounded
    twice, |δb| ≤ (n − 1)·2⁻²³ inside the support, and a terminal row (all mass at one b, a row
    max ≥ ½) moves by 2·|δb| of its max; 1.5× that for the kernels' own sums. (Over 300 random
    batches of ``learner_batch`` the jnp scatter's worst was 0.82 × 2·(n − 1)·2⁻²³ at both 51 and
    101 atoms; a wrong lane or lost mass is ≥ 1e-3.)"""
    return 3.0 * (n - 1) * 2.0**-23


def rel_err(got, want) -> float:
    """Worst row of ‖got − want‖∞ / ‖want‖∞."""
    got = np.asarray(got, np.float64).reshape(-1, np.shape(want)[-1])
    want = np.asarray(want, np.float64).reshape(got.shape)
    assert np.all(np.isfinite(got))
    return float(np.max(np.abs(got - want).max(-1) / np.abs(want).max(-1)))


def kernel(probs, atoms, v_min, delta_z):
    """The window kernel (the hat kernel's own tests are below)."""
    backend = "window" if BACKEND == "pallas" else "window_interpret"
    out = c51_project(probs, atoms, v_min, delta_z, backend=backend, block_rows=BLOCK)
    if BACKEND == "pallas":
        failed = {k: v for k, v in fallbacks().items() if k[0] == "c51_project"}
        assert not failed, f"the Pallas kernel fell back to the reference: {failed}"
    return out


def learner_batch(rng, rows, n=N, v_min=-10.0, v_max=10.0):
    """Targets as a learner makes them: r + γ·z on a uniform support, some terminal rows,
    rewards large enough to clip at both ends."""
    support = np.linspace(v_min, v_max, n, dtype=np.float32)
    logits = rng.normal(0.0, 2.0, (rows, n))
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    reward = rng.normal(0.0, 6.0, (rows, 1))
    gamma = rng.choice([0.0, 0.5, 0.9, 0.99, 1.0], size=(rows, 1), p=[0.2, 0.1, 0.2, 0.4, 0.1])
    atoms = reward + gamma * support
    return (
        probs.astype(np.float32),
        atoms.astype(np.float32),
        np.float32(v_min),
        np.float32((v_max - v_min) / (n - 1)),
    )


def test_p1_hand_computed_example():
    # support {0, 1, 2}: 0.5 splits half/half, 1.25 splits 3/4 to 1 and 1/4 to 2, 3.0 clips to 2
    probs = jnp.array([[0.2, 0.3, 0.5]])
    atoms = jnp.array([[0.5, 1.25, 3.0]])
    want = np.array([[0.1, 0.325, 0.575]])
    np.testing.assert_allclose(c51_project_reference(probs, atoms, 0.0, 1.0), want, atol=1e-7)
    np.testing.assert_allclose(kernel(probs, atoms, 0.0, 1.0), want, atol=1e-7)


def test_p1_matches_float64_on_fresh_random_targets():
    rng = _rng()
    probs, atoms, v_min, delta_z = learner_batch(rng, 3 * BLOCK + 5)
    want = project64(probs, atoms, v_min, delta_z)
    assert rel_err(c51_project_reference(probs, atoms, v_min, delta_z), want) <= tol()
    got = kernel(probs, atoms, v_min, delta_z)
    assert got.shape == probs.shape and got.dtype == jnp.float32
    assert rel_err(got, want) <= tol()
    np.testing.assert_allclose(np.asarray(got).sum(-1), 1.0, atol=1e-5)  # mass is conserved


def test_p1_unsorted_and_arbitrary_atoms():
    """Any source atoms are allowed (the kernel's exact fallback path)."""
    rng = _rng()
    probs, atoms, v_min, delta_z = learner_batch(rng, 2 * BLOCK + 3)
    atoms[::3] = rng.permuted(atoms[::3], axis=1)
    atoms[1::3] = rng.uniform(-14.0, 14.0, atoms[1::3].shape).astype(np.float32)
    # sorted but not affine, and γ = 0.3 (up to 7 sources a lane): windows the kernel cannot
    # prove complete, so these rows take its exact fallback
    atoms[2::6] = np.sort(rng.normal(0.0, 5.0, atoms[2::6].shape), axis=1).astype(np.float32)
    support = np.linspace(-10.0, 10.0, N)
    atoms[5::6] = rng.normal(0.0, 3.0, (atoms[5::6].shape[0], 1)) + 0.3 * support
    want = project64(probs, atoms, v_min, delta_z)
    assert rel_err(kernel(probs, atoms, v_min, delta_z), want) <= tol()


def test_p1_edge_cases():
    v_min, delta_z = -6.25, 0.25  # exactly representable support: -6.25 + 0.25·i
    support = v_min + delta_z * np.arange(N, dtype=np.float32)
    rng = _rng()
    probs = rng.dirichlet(np.ones(N), 6).astype(np.float32)
    atoms = np.stack(
        [
            support - 100.0,  # everything clipped to v_min
            support + 100.0,  # everything clipped to v_max
            support + 3 * delta_z,  # every atom exactly on a support point (shift by 3)
            np.full(N, 0.3, np.float32),  # all-equal atoms (terminal): 0.3 = v_min + 26.2·Δz
            np.full(N, support[17], np.float32),  # all-equal, exactly on a support point
            support * 0.5 + 1.0,  # γ = 0.5: up to 4 sources per destination
        ]
    ).astype(np.float32)
    got = np.asarray(kernel(probs, atoms, v_min, delta_z))
    want = np.zeros((6, N))
    want[0, 0] = probs[0].sum()
    want[1, -1] = probs[1].sum()
    want[2, 3:] = probs[2, :-3]
    want[2, -1] += probs[2, -3:].sum()
    want[3, 26] = probs[3].sum() * (1 - 0.2)
    want[3, 27] = probs[3].sum() * 0.2
    want[4, 17] = probs[4].sum()
    want[5] = project64(probs[5], atoms[5], v_min, delta_z)
    np.testing.assert_allclose(got, want, atol=2e-6)
    # on-support atoms are not split: bit-exact except the end lane, which sums four masses
    np.testing.assert_array_equal(got[2, :-1], np.asarray(want[2, :-1], np.float32))
    assert np.count_nonzero(got[:3] == 0.0) == 2 * (N - 1) + 3  # nothing leaks to other lanes


def test_p1_per_row_support_and_leading_shape():
    rng = _rng()
    probs, atoms, _, _ = learner_batch(rng, 2 * 3 * 7)
    v_min = rng.uniform(-12.0, -2.0, (2, 3, 7)).astype(np.float32)
    delta_z = rng.uniform(0.1, 0.6, (2, 3, 7)).astype(np.float32)
    probs, atoms = probs.reshape(2, 3, 7, N), atoms.reshape(2, 3, 7, N)
    got = kernel(probs, atoms, v_min, delta_z)
    assert got.shape == (2, 3, 7, N)
    assert rel_err(got, project64(probs, atoms, v_min, delta_z)) <= tol()
    # one per-row argument with a scalar other
    got = kernel(probs, atoms, v_min, 0.4)
    assert rel_err(got, project64(probs, atoms, v_min, 0.4)) <= tol()


def test_p1_output_fully_written():
    rng = _rng()
    probs, atoms, v_min, delta_z = learner_batch(rng, 2 * BLOCK + 7)
    poison = jnp.full(probs.shape, jnp.nan, jnp.float32)
    got = c51_project_pallas(
        jnp.asarray(probs),
        jnp.asarray(atoms),
        jnp.full((1,), v_min),
        jnp.full((1,), delta_z),
        interpret=BACKEND != "pallas",
        block_rows=BLOCK,
        out=poison,
    )
    assert bool(jnp.all(jnp.isfinite(got)))
    assert rel_err(got, project64(probs, atoms, v_min, delta_z)) <= tol()


@pytest.mark.slow
def test_p1_gradient_wrt_probs_is_exact_and_zero_elsewhere():
    rng = _rng()
    probs, atoms, v_min, delta_z = learner_batch(rng, BLOCK + 3)
    weights = jnp.asarray(rng.normal(size=probs.shape), jnp.float32)

    def loss(fn):
        return lambda p, z, vm, dz: jnp.sum(weights * fn(p, z, vm, dz))

    args = (jnp.asarray(probs), jnp.asarray(atoms), jnp.float32(v_min), jnp.float32(delta_z))
    got = jax.grad(loss(kernel), argnums=(0, 1, 2, 3))(*args)
    want = jax.grad(loss(c51_project_reference))(*args)
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-6)
    for g in got[1:]:
        assert not bool(jnp.any(g != 0.0))


def test_p1_kernel_never_builds_nxn_and_uses_no_atomics():
    """Every array in the kernel body is a [block_rows, 64] tile or smaller: no [R, N, N]."""
    fn = lambda p, z, vm, dz: c51_project_pallas(p, z, vm, dz, block_rows=BLOCK, interpret=True)
    jaxpr = jax.make_jaxpr(fn)(jnp.ones((40, N)), jnp.ones((40, N)), jnp.ones((1,)), jnp.ones((1,)))
    (call,) = [e for e in jaxpr.eqns if e.primitive.name == "pallas_call"]
    seen = []

    def walk(jxp):
        for eqn in jxp.eqns:
            seen.append(eqn.primitive.name)
            assert "atomic" not in eqn.primitive.name
            for var in eqn.outvars:
                shape = getattr(var.aval, "shape", ())
                assert np.prod(shape, dtype=np.int64) <= BLOCK * 64, (eqn.primitive, shape)
            for sub in jaxprs_in_params(eqn.params):
                walk(sub)

    walk(call.params["jaxpr"])
    assert "while" in seen and seen.count("masked_load") >= 10  # the walk reached the loop body


@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_p1_backends_agree_and_bad_backend_fails(backend):
    rng = _rng()
    probs, atoms, v_min, delta_z = learner_batch(rng, 9)
    got = c51_project(probs, atoms, v_min, delta_z, backend=backend)
    assert rel_err(got, project64(probs, atoms, v_min, delta_z)) <= tol()
    # the message names every backend c51_project takes, the kernel methods' included
    with pytest.raises(ValueError, match=r"backend must be one of .*'dense', 'hat'.*'cuda'"):
        c51_project(probs, atoms, v_min, delta_z, backend="cuda")
    with pytest.raises(ValueError, match="shape"):
        c51_project(probs, atoms[:, :-1], v_min, delta_z)


def test_p1_hat_kernel_matches_float64_on_learner_unsorted_and_edge_rows():
    """``method="hat"``: the dense pull in registers gives the float64 projection on learner
    rows, unsorted and arbitrary atoms, clipped and terminal rows and a per-row support, and
    writes every output (poisoned buffer)."""
    rng = _rng()
    probs, atoms, v_min, delta_z = learner_batch(rng, 3 * BLOCK + 5)
    atoms[::4] = rng.permuted(atoms[::4], axis=1)
    atoms[1::4] = rng.uniform(-14.0, 14.0, atoms[1::4].shape).astype(np.float32)
    atoms[2] = v_min - 50.0  # everything clipped to v_min
    atoms[3] = 0.3  # terminal: all sources at one position
    v_rows = rng.uniform(-12.0, -8.0, probs.shape[0]).astype(np.float32)
    for vm in (np.full((1,), v_min, np.float32), v_rows):
        poison = jnp.full(probs.shape, jnp.nan, jnp.float32)
        got = c51_project_pallas(
            jnp.asarray(probs),
            jnp.asarray(atoms),
            jnp.asarray(vm),
            jnp.full(vm.shape, delta_z),
            interpret=BACKEND != "pallas",
            block_rows=4,
            out=poison,
            method="hat",
        )
        assert bool(jnp.all(jnp.isfinite(got)))
        assert rel_err(got, project64(probs, atoms, vm if vm.size > 1 else v_min, delta_z)) <= tol()
    with pytest.raises(ValueError, match="method"):
        c51_project_pallas(
            jnp.asarray(probs), jnp.asarray(atoms), jnp.ones(1), jnp.ones(1), method="scatter"
        )


def _eqns(jxp):
    for eqn in jxp.eqns:
        yield eqn
        for sub in jaxprs_in_params(eqn.params):
            yield from _eqns(sub)


def _kernel_body(fn, *args) -> list:
    """The equations of the one pallas_call body in ``fn``'s program."""
    (call,) = [
        e for e in _eqns(jax.make_jaxpr(fn)(*args).jaxpr) if e.primitive.name == "pallas_call"
    ]
    return list(_eqns(call.params["jaxpr"]))


def test_p1_hat_backend_of_c51_project_gives_values_and_the_exact_gradient():
    """``c51_project(backend="hat")`` (``hat_interpret`` on the CPU; ``kernels.projection``'s
    settings): the float64 projection and, through the custom VJP, the reference's gradient
    w.r.t. probs; the compiled kernel must not fall back."""
    backend = "hat" if BACKEND == "pallas" else "hat_interpret"
    rng = _rng()
    probs, atoms, v_min, delta_z = learner_batch(rng, 2 * BLOCK + 5)

    # the call runs the hat kernel (inside the custom VJP): its [rows, 64, 64] tile, no loop
    body = _kernel_body(
        lambda p, z: c51_project(p, z, v_min, delta_z, backend="hat_interpret"), probs, atoms
    )
    tile = (TILINGS["hat"][0], 64, 64)
    assert any(getattr(v.aval, "shape", ()) == tile for e in body for v in e.outvars)
    assert "while" not in {e.primitive.name for e in body}
    got = c51_project(probs, atoms, v_min, delta_z, backend=backend)
    assert rel_err(got, project64(probs, atoms, v_min, delta_z)) <= tol()
    if BACKEND == "pallas":
        assert not [k for k in fallbacks() if k[0] == "c51_project" and k[-1] == "hat"]
    weights = jnp.asarray(rng.normal(size=probs.shape), jnp.float32)
    grad = lambda **kw: jax.grad(
        lambda p: jnp.sum(weights * c51_project(p, atoms, v_min, delta_z, **kw))
    )(jnp.asarray(probs))
    np.testing.assert_allclose(grad(backend=backend), grad(backend="reference"), atol=1e-6)


@pytest.mark.parametrize("n", [N, 101])
def test_p1_pallas_backend_runs_the_hat_kernel_up_to_64_lanes_and_the_window_kernel_above(n):
    """``pallas`` / ``interpret`` (``kernels.projection``'s auto on a GPU): the hat kernel at the
    learner's 51 atoms (its [rows, 64, 64] tile, no loop), the window kernel at 101 (128 lanes:
    its fallback loop, no lanes² tile); both give the float64 projection."""
    rng = _rng()
    probs, atoms, v_min, delta_z = learner_batch(rng, 2 * BLOCK + 5, n=n)
    lanes = 64 if n <= 64 else 128
    fn = lambda p, z: c51_project(p, z, v_min, delta_z, backend="interpret")
    body = _kernel_body(fn, probs, atoms)
    names = {e.primitive.name for e in body}
    shapes = {getattr(v.aval, "shape", ()) for e in body for v in e.outvars}
    hat = (TILINGS["hat"][0], lanes, lanes)
    assert (hat in shapes, "while" in names) == ((True, False) if n <= 64 else (False, True))
    got = c51_project(probs, atoms, v_min, delta_z, backend=BACKEND)
    assert rel_err(got, project64(probs, atoms, v_min, delta_z)) <= tol(n)
    if BACKEND == "pallas":
        assert not [k for k in fallbacks() if k[0] == "c51_project"]
