"""L2 + M7 + P1 as one Pallas kernel from the target network's pass
(pallas_kernels/c51_target.py, ``kernels.target_head``).

The kernel runs in interpret mode on the CPU; set JAXDQN_KERNEL_BACKEND=pallas on a GPU to run
the same checks against the compiled Triton kernel. Lowering for CUDA (Pallas → Triton IR) is
checked on the CPU at the learner's size.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdqn.agent import targets as T
from jaxdqn.agent.resolve import Projection, target_head_kernels
from jaxdqn.model.network import make_model
from pallas_kernels import fallbacks
from pallas_kernels.c51_target import _target_call, c51_target
from tests.test_losses import _MODEL_CFG, _OBS_DIM

BACKEND = os.environ.get("JAXDQN_KERNEL_BACKEND", "interpret")


def _inputs(groups: int, width: int, seed: int, dueling: bool, n: int = 51):
    k = jax.random.split(jax.random.PRNGKey(seed), 4)
    x = 2.0 * jax.random.normal(k[0], (groups, 4 if dueling else 3, width))
    noise = jax.random.gumbel(k[1], (groups, 3))
    reward = jax.random.uniform(k[2], (groups,), minval=-1.5, maxval=1.5)
    # every fifth transition terminal; the rest γⁿ = 0.97
    discount = jnp.where(jnp.arange(groups) % 5 == 0, 0.0, 0.97)
    v_min = jax.random.uniform(k[3], (groups,), minval=-4.0, maxval=-2.0)
    delta_z = jnp.full((groups,), 5.0 / (n - 1))
    return x, noise, reward, discount, v_min, delta_z


def _by_hand(x, noise, reward, discount, v_min, dz, floor, n, dueling):
    """float64 numpy: M6, softmax, E[Z], L2's temperature and draw, the TD target, and P1 by
    splitting each source atom's mass between its two neighbours (a push, unlike the kernel)."""
    x = np.asarray(x, np.float64)[..., :n]
    if dueling:
        x = x[:, :1] + x[:, 1:] - x[:, 1:].mean(1, keepdims=True)
    p = np.exp(x - x.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    v_min, dz = np.asarray(v_min, np.float64), np.asarray(dz, np.float64)
    q = v_min[:, None] + dz[:, None] * (p * np.arange(n)).sum(-1)
    tau = np.maximum(q.max(1) - q.min(1), np.maximum(np.abs(q.mean(1)) * 0.01, floor))
    a = np.argmax(q / tau[:, None] + np.asarray(noise, np.float64), axis=1)
    g = np.arange(x.shape[0])
    r, gamma = np.asarray(reward, np.float64), np.asarray(discount, np.float64)
    td = r + gamma * q[g, a]
    z = v_min[:, None] + dz[:, None] * np.arange(n)
    b = np.clip((r[:, None] + gamma[:, None] * z - v_min[:, None]) / dz[:, None], 0.0, n - 1)
    target = np.zeros((x.shape[0], n))
    for row in g:
        for j in range(n):
            low = int(np.floor(b[row, j]))
            frac = b[row, j] - low
            target[row, low] += p[row, a[row], j] * (1.0 - frac)
            if frac > 0:
                target[row, low + 1] += p[row, a[row], j] * frac
    return target, td, a, q


@pytest.mark.parametrize(
    ("groups", "width", "dueling"),
    [(37, 51, False), (16, 51, True), (19, 64, True), (8, 11, False)],
    ids=["logits_ragged", "heads", "padded_heads_ragged", "11_atoms"],
)
def test_l2_p1_target_kernel_equals_float64_by_hand(groups, width, dueling):
    """Ragged group counts (37 = 18 programs of 2 + 1), heads with M6 done in the kernel,
    segments padded 51 → 64, and an 11-atom support (16 lanes)."""
    n = 11 if width == 11 else 51
    args = _inputs(groups, width, groups + width, dueling, n)
    got = c51_target(*args, 1e-6, num_atoms=n, dueling=dueling, backend=BACKEND)
    assert not fallbacks()
    want = _by_hand(*args, 1e-6, n, dueling)
    np.testing.assert_array_equal(got[2], want[2])
    # positions b = (r + γz − v_min)/Δz up to N − 1 in float32: ~4e-6 of a lane
    for g, w, name in zip(got, want, ("target", "td", "a_next", "q"), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=name)
    np.testing.assert_allclose(got[0].sum(-1), 1.0, atol=1e-5)
    assert got[2].dtype == jnp.int32 and got[0].shape == (groups, n)


@pytest.mark.parametrize(("groups", "warps"), [(2, 2), (1, 1)], ids=["2x2", "1x1"])
def test_l2_target_kernel_under_vmap_is_each_member_s_own_call(groups, warps):
    """The learning runs vmap the learner over a seed population: the batched kernel (a grid
    axis Pallas adds for the members) gives each member what its own call gives, at the
    default tiling and the learning runs' 1 × 1. Members hold different inputs (a kernel that
    read one member's rows for all would differ), and v_min, Δz are shared (not batched) as
    a population's support can be."""
    members = [_inputs(19, 64, 40 + m, dueling=True) for m in range(3)]
    stacked = [jnp.stack(parts) for parts in zip(*members, strict=True)]
    x, noise, reward, discount, v_min, dz = stacked
    run = lambda x, e, r, d, lo, step: c51_target(
        x, e, r, d, lo, step, 1e-6, num_atoms=51, dueling=True, backend=BACKEND,
        groups=groups, num_warps=warps,
    )  # fmt: skip
    got = jax.jit(jax.vmap(run, in_axes=(0, 0, 0, 0, None, None)))(
        x, noise, reward, discount, v_min[0], dz[0]
    )
    for m in range(3):
        own = run(x[m], noise[m], reward[m], discount[m], v_min[0], dz[0])
        for a, b in zip(got, own, strict=True):
            np.testing.assert_allclose(a[m], b, rtol=1e-6, atol=1e-7)
    assert float(jnp.max(jnp.abs(got[0][0] - got[0][1]))) > 1e-2  # the members differ


def test_l2_target_kernel_greedy_takes_the_first_maximum_and_terminals_land_on_r():
    """Zero noise: a′ = argmax E[Q′], the first on ties (jnp.argmax); discount 0: all of a′'s
    mass at the projection of r, split between the two support points around it."""
    n, g = 11, 3
    row = jnp.linspace(-1.0, 1.0, n)
    # group 0: three equal rows (tie at 0); group 1: rows 1 and 2 equal and highest (1);
    # group 2: row 2 highest
    x = jnp.stack([
        jnp.stack([row, row, row]),
        jnp.stack([row, 3 * row, 3 * row]),
        jnp.stack([row, 2 * row, 4 * row]),
    ])  # fmt: skip
    zeros = jnp.zeros((g,))
    reward = jnp.array([0.25, 0.0, -0.75])
    v_min, dz = jnp.full((g,), -1.0), jnp.full((g,), 0.2)
    target, td, a, q = c51_target(
        x, jnp.zeros((g, 3)), reward, zeros, v_min, dz, 1e-6, num_atoms=n, backend=BACKEND
    )
    np.testing.assert_array_equal(a, [0, 1, 2])
    np.testing.assert_allclose(td, reward, atol=1e-7)  # γ = 0: td = r
    # r = 0.25 sits at b = 6.25: 0.75 to atom 6, 0.25 to atom 7; r = 0 is atom 5; −0.75 at 1.25
    want = np.zeros((g, n))
    want[0, 6], want[0, 7], want[1, 5], want[2, 1], want[2, 2] = 0.75, 0.25, 1.0, 0.75, 0.25
    np.testing.assert_allclose(target, want, atol=1e-6)
    assert float(q[1, 1]) == pytest.approx(float(q[1, 2])) and float(q[1, 1]) > float(q[1, 0])


def _network_output(seed: int, dueling: bool):
    """A real target pass: the test model (11 atoms) at random observations, with the heads'
    ``[v | A]`` where the model is made to give them."""
    n = _MODEL_CFG.num_atoms
    kw = {"fused": True, "raw_heads": n} if dueling else {}
    model = make_model(_MODEL_CFG, _OBS_DIM, kan_backend="reference", **kw)
    k = jax.random.split(jax.random.PRNGKey(seed), 3)
    b = 24
    params = model.init(k[0])
    out = model.apply(params, jax.random.normal(k[1], (b, _OBS_DIM)), jnp.float32(-1.0), 0.2)
    assert (out.heads is not None) == dueling
    reward = jax.random.uniform(k[2], (b,), minval=-0.5, maxval=0.5)
    discount = jnp.where(jnp.arange(b) % 7 == 0, 0.0, 0.95)
    return out, reward, discount


@pytest.mark.parametrize("sampled", [True, False], ids=["sampled", "greedy"])
@pytest.mark.parametrize("dueling", [False, True], ids=["logits", "heads"])
def test_l2_target_from_network_draws_and_projects_as_target_distribution(sampled, dueling):
    """The kernel path of the learner's target (``kernels.target_head``) against
    :func:`target_distribution` on the same network output and key: the same a′ (Gumbel noise
    drawn as ``jax.random.categorical`` draws it), the same projected target, TD target and
    end-atom mass, to float rounding; and another key draws other actions."""
    out, reward, discount = _network_output(3, dueling)
    key = jax.random.PRNGKey(11)
    v_min, dz = jnp.float32(-1.0), jnp.float32(0.2)
    floor = 1e-3
    want = T.target_distribution(
        key, out.probs, out.q_mean, reward, discount, v_min, dz,
        projection=Projection("reference", "reference"), temperature_floor=floor, sampled=sampled,
    )  # fmt: skip
    got = T.target_from_network(
        key, out, reward, discount, v_min, dz, backend=BACKEND, temperature_floor=floor,
        sampled=sampled,
    )  # fmt: skip
    np.testing.assert_array_equal(got.next_actions, want.next_actions)
    np.testing.assert_allclose(got.probs, want.probs, atol=2e-6)
    np.testing.assert_allclose(got.td, want.td, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got.end_mass, want.end_mass, atol=1e-6)
    other = T.target_from_network(
        jax.random.PRNGKey(12), out, reward, discount, v_min, dz, backend=BACKEND,
        temperature_floor=floor, sampled=sampled,
    )  # fmt: skip
    changed = bool(jnp.any(other.next_actions != got.next_actions))
    assert changed == sampled


def test_l2_target_kernel_refuses_bad_shapes_and_backends_and_carries_no_gradient():
    x, noise, reward, discount, v_min, dz = _inputs(8, 51, 0, False)
    with pytest.raises(ValueError, match="c51_target"):
        c51_target(x, noise[:, :2], reward, discount, v_min, dz, 1e-6, num_atoms=51)
    with pytest.raises(ValueError, match="c51_target"):
        c51_target(x[..., :40], noise, reward, discount, v_min, dz, 1e-6, num_atoms=51)
    with pytest.raises(ValueError, match="backend"):
        c51_target(x, noise, reward, discount, v_min, dz, 1e-6, num_atoms=51, backend="cuda")
    with pytest.raises(ValueError, match=r"kernels\.target_head"):
        T.target_from_network(None, None, reward, discount, v_min, dz, backend="reference")
    assert target_head_kernels("auto") == "reference"
    grad = jax.grad(
        lambda x: c51_target(
            x, noise, reward, discount, v_min, dz, 1e-6, num_atoms=51, backend="reference"
        )[1].sum()
    )(x)
    np.testing.assert_array_equal(grad, 0.0)


@pytest.mark.parametrize("dueling", [False, True], ids=["logits", "dueling"])
def test_l2_target_kernel_lowers_to_triton_at_the_learner_s_size(dueling):
    """Pallas → Triton IR for CUDA on the CPU at B = 4,096 × 4 branches: one kernel."""
    g = 4096 * 4
    f32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    fn = jax.jit(lambda x, e, r, d, v, z, f: _target_call(x, e, r, d, v, z, f, 51, dueling,
                                                           False, 2, 2))  # fmt: skip
    traced = fn.trace(f32(g, 4 if dueling else 3, 51), f32(g, 3), *[f32(g)] * 4, f32())
    text = traced.lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("__gpu$xla.gpu.triton") == 1
