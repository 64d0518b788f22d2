"""Deterministic by construction (issue 16): the formulations that ``train.deterministic``
selects equal the ones they replace, and the compiled update then holds no scatter-add — the
one XLA op whose float result depends on the order a GPU runs its threads in (sums and
reductions are ordered; scatter-set of one value and scatter-max are order-free)."""

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdqn import config
from jaxdqn.agent import iteration
from jaxdqn.agent.build import build_agent, make_init
from jaxdqn.agent.losses import pick
from jaxdqn.agent.replay import make_prioritised_replay
from jaxdqn.agent.resolve import projection_backend, projection_fallback
from jaxdqn.config import ConfigError
from jaxdqn.market import market as market_setup
from pallas_kernels import c51_project, c51_project_dense, c51_project_reference

SMOKE = Path(__file__).resolve().parent.parent / "configs" / "smoke.yaml"


@pytest.mark.slow
def test_p1_dense_projection_equals_the_scatter_reference():
    k = jax.random.split(jax.random.PRNGKey(0), 4)
    rows, n = 256, 51
    p = jax.nn.softmax(3 * jax.random.normal(k[0], (rows, n)), axis=-1)
    gamma = jax.random.uniform(k[1], (rows, 1), minval=0.0, maxval=1.0)
    z = jnp.linspace(-14.0, 14.0, n)[None] * gamma + 4 * jax.random.normal(k[2], (rows, 1))
    z = z.at[:5].set(jax.random.normal(k[3], (5, n)) * 20)  # unsorted, clipped sources too
    v_min, dz = jnp.linspace(-10, -5, rows), jnp.linspace(0.2, 0.4, rows)
    want = c51_project_reference(p, z, v_min, dz)
    got = c51_project_dense(p, z, v_min, dz)
    np.testing.assert_allclose(got, want, atol=1e-6)
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-5)
    via = c51_project(p, z, v_min, dz, backend="dense")
    np.testing.assert_allclose(via, want, atol=1e-6)
    # the gradient (custom_vjp, shared by every backend) is the exact linear map's
    g = jax.random.normal(k[0], (rows, n))
    dense_grad = jax.grad(lambda q: jnp.sum(g * c51_project(q, z, v_min, dz, backend="dense")))
    ref_grad = jax.grad(lambda q: jnp.sum(g * c51_project_reference(q, z, v_min, dz)))
    np.testing.assert_allclose(dense_grad(p), ref_grad(p), atol=1e-5)


@pytest.mark.slow
def test_l1_pick_equals_take_along_axis_bit_for_bit_with_its_gradient():
    x = jax.random.normal(jax.random.PRNGKey(1), (16, 4, 3, 51))
    a = jax.random.randint(jax.random.PRNGKey(2), (16, 4), 0, 3)
    take = lambda x: jnp.take_along_axis(x, a[:, :, None, None], axis=2)[:, :, 0]
    np.testing.assert_array_equal(pick(x, a, axis=2), take(x))
    w = jax.random.normal(jax.random.PRNGKey(3), (16, 4, 51))
    g_take = jax.grad(lambda x: jnp.sum(w * take(x)))(x)
    g_pick = jax.grad(lambda x: jnp.sum(w * pick(x, a, axis=2)))(x)
    np.testing.assert_array_equal(g_pick, g_take)


def test_l8_set_priorities_with_duplicates_does_not_depend_on_their_order():
    replay = make_prioritised_replay(64, jax.ShapeDtypeStruct((), jnp.float32), alpha=0.6)
    state = replay.add(replay.init(), jnp.arange(64.0), jnp.ones(64))
    idx = jnp.array([3, 7, 3, 9, 7, 7, 1, 3], jnp.int32)
    prio = jnp.array([0.5, 2.0, 4.0, 1.0, 0.1, 3.0, 0.7, 1.5])
    perm = jnp.array([5, 2, 7, 0, 6, 1, 3, 4])
    a = replay.set_priorities(state, idx, prio)
    b = replay.set_priorities(state, idx[perm], prio[perm])
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)
    # the largest of a slot's duplicates wins (slot 3: 4.0, slot 7: 3.0)
    leaves = a.tree[-1]
    np.testing.assert_allclose(leaves[3], 4.0**0.6, rtol=1e-6)
    np.testing.assert_allclose(leaves[7], 3.0**0.6, rtol=1e-6)


def _scatter_combiners(hlo: str) -> list[str]:
    """The update computation of every stablehlo.scatter: "add", "max", "set" or "other"."""
    out = []
    lines = hlo.splitlines()
    for i, line in enumerate(lines):
        if re.search(r'"?stablehlo\.scatter"?\(', line):
            body = " ".join(lines[i : i + 6])
            if "stablehlo.add" in body:
                out.append("add")
            elif "stablehlo.maximum" in body:
                out.append("max")
            elif "stablehlo.return %arg" in body:
                out.append("set")
            else:
                out.append("other")
    return out


@pytest.mark.slow
@pytest.mark.parametrize("projection", ["dense", "reference"])
def test_l8_deterministic_iteration_holds_no_scatter_add(projection):
    """The whole jitted iteration (acting, replay, learner) on the smoke config, every
    component on. With the deterministic projection no scatter-add is left; the scatter
    reference has its two (the check sees them)."""
    cfg = config.load(SMOKE, [f"kernels.projection={projection}"])
    prepared = market_setup.prepare(cfg)
    agent = build_agent(cfg, prepared)
    state = jax.eval_shape(lambda: make_init(agent)(prepared.market, jax.random.PRNGKey(0)))
    fn = jax.jit(lambda s, m: iteration.iteration(agent, s, m))
    combiners = _scatter_combiners(fn.lower(state, prepared.market).as_text())
    assert combiners, "no scatter found at all: the check would see nothing"
    assert "other" not in combiners
    if projection == "dense":
        assert "add" not in combiners, combiners
    else:
        assert combiners.count("add") == 2, combiners


def test_l8_projection_backend_resolution(monkeypatch):
    assert projection_backend("auto", False) == "reference"
    assert projection_backend("auto", True) == "reference"  # the CPU: the scatter is ordered
    assert projection_backend("pallas", True) == "pallas"
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert projection_backend("auto", True) == "pallas"
    assert projection_backend("auto", False) == "reference"
    assert projection_backend("dense", False) == "dense"
    with pytest.raises(ConfigError, match=r"with train\.deterministic use auto, dense or pallas"):
        projection_backend("reference", True)
    # where the Pallas kernel cannot be built a pull falls back to the other pull, never to
    # the scatter-add
    assert projection_fallback("pallas") == projection_fallback("dense") == "dense"
    assert projection_backend("hat", True) == "hat" and projection_fallback("hat") == "dense"
    assert projection_fallback("window") == "dense"
    assert projection_fallback("reference") == projection_fallback("auto") == "reference"
