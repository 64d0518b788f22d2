"""M3–M6 of the four branches computed together (``kernels.fused``): the same function as the
per-branch :class:`jaxdqn.model.network.Branch` modules, with the same parameter tree, in fewer
and larger kernels; and, for acting, the same branches ending in M7's statistics instead of the
logits (``kernels.acting``).

:func:`fused_branches` runs inside :class:`jaxdqn.model.network.Network`'s compact call (its
:class:`BranchParams` are the Network's submodules, named as the per-branch modules). With
branches ordered k = (direction, order, urgency, magnitude) under M5 (:data:`FUSED_ORDER`), else
in the output order (direction, magnitude, order, urgency) (:func:`fused_order`):

1. one matrix product ``[u_k | g_k]_k = h_m [W_u^k | W_g^k]_k + b`` for every branch's value and
   gate path (the magnitude branch's rows for h_m only), then one gate call (M4's kernel, or the
   sigmoid) and the product ``a_k = u_k ⊙ gate(g_k)`` — or, with ``kernels.gated``
   (:mod:`jaxdqn.model.gated`), the product and gate as one kernel per call (``pallas``), or
   the biases, gate and ``u ⊙ gate`` as one kernel reading XLA's bias-free product in place
   (``gate``);
2. the heads ``head_k = a_k [W_V^k | W_A^k] + b`` and the dueling combination for direction,
   order and urgency (:func:`jaxdqn.model.heads.branch_heads`, as ``kernels.heads`` says) — or,
   with ``statistics`` (``kernels.acting``), the Pallas kernel of
   :mod:`pallas_kernels.head_statistics` that ends each head in E[Z], Var[Z] and the quantiles
   and writes no logits;
3. M5: the magnitude pre-activations get ``cond W^mag_cond`` (cond = the direction's E[Q] / Δz,
   no gradient), then its gate and head. Without M5 all four go in steps 1–2.
"""

from __future__ import annotations

from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import Array

from jaxdqn.branches import BRANCH_KEYS, NUM_ACTIONS
from jaxdqn.config import ModelConfig
from jaxdqn.model import distribution
from jaxdqn.model import gated as gated_lib
from jaxdqn.model.dense import affine, bf16_activations, bf16_linear, default_precision, linear
from jaxdqn.model.fused_layout import FROM_FUSED, fused_columns, fused_order
from jaxdqn.model.heads import branch_heads
from pallas_kernels import kan_gate_init
from pallas_kernels.head_statistics import head_statistics_available, head_statistics_pallas

__all__ = [
    "ACTING",
    "ACTING_PRODUCTS",
    "BranchParams",
    "BranchStatistics",
    "DenseParams",
    "KANParams",
    "acting_kernels_available",
    "fused_branches",
]

ACTING = ("reference", "pallas", "interpret")
"""The resolved ``kernels.acting`` settings: ``reference`` computes acting's statistics from
the logits (the model's ``apply``), ``pallas`` / ``interpret`` with the heads' statistics
kernel (compiled / under the Pallas interpreter)."""
ACTING_PRODUCTS = ("f32", "bf16")
"""``kernels.acting_product``: the precision of acting's value/gate product where the gate
kernel reads it (:func:`fused_branches`' ``acting_product``)."""

_zeros = nn.initializers.zeros


class BranchStatistics(NamedTuple):
    """M7 of every branch and action without the logits: E[Z] ``[B, 4, 3]``, Var[Z]
    ``[B, 4, 3]``, quantiles ``[B, 4, 3, L]`` (branches in :data:`BRANCH_KEYS` order)."""

    q_mean: Array
    q_var: Array
    quantiles: Array


class DenseParams(nn.Module):
    """The ``kernel [K, F]`` and ``bias [F]`` of a :class:`~jaxdqn.model.dense.Dense` layer
    (same names, initialisers and random streams), returned unapplied so that several layers
    can be computed as one matrix product."""

    in_features: int
    features: int

    @nn.compact
    def __call__(self) -> tuple[Array, Array]:
        kernel = self.param(
            "kernel", nn.initializers.lecun_normal(), (self.in_features, self.features), jnp.float32
        )
        return kernel, self.param("bias", _zeros, (self.features,), jnp.float32)


class KANParams(nn.Module):
    """The ``coeffs [F, 8]`` and ``w_res [F]`` of a :class:`KANGate`, unapplied."""

    features: int

    @nn.compact
    def __call__(self) -> tuple[Array, Array]:
        coeffs = self.param("coeffs", lambda _key: kan_gate_init(self.features)[0])
        return coeffs, self.param("w_res", lambda _key: kan_gate_init(self.features)[1])


class BranchParams(nn.Module):
    """The parameters of one :class:`Branch` (identical tree, names and initial values), for
    the fused computation of all four branches in :class:`Network`."""

    in_features: int
    ah: int
    num_atoms: int
    kan: bool = True

    @nn.compact
    def __call__(self) -> dict[str, tuple[Array, Array]]:
        n = self.num_atoms
        out = {
            "value": DenseParams(self.in_features, self.ah, name="value")(),
            "gate": DenseParams(self.in_features, self.ah, name="gate")(),
            "head_value": DenseParams(self.ah, n, name="head_value")(),
            "head_advantage": DenseParams(self.ah, NUM_ACTIONS * n, name="head_advantage")(),
        }
        if self.kan:
            out["kan"] = KANParams(self.ah, name="kan")()
        return out


def fused_branches(
    cfg: ModelConfig,
    h_m: Array,
    v_min: Array,
    delta_z: Array,
    *,
    kan_backend: str,
    head_kernels: str,
    gated_kernels: str,
    statistics: str | None = None,
    acting_product: str = "f32",
    raw: int = 0,
) -> Array | BranchStatistics | tuple[Array, Array | None]:
    """The four branches on ``h_m [B, SH2]`` with the supports ``v_min``, ``delta_z [B]``
    (steps in the module docstring); call it inside a compact flax module (the branches'
    parameters are created there, named as the per-branch modules).

    Args:
      cfg: the model section.
      kan_backend, head_kernels, gated_kernels: ``kernels.kan``, ``kernels.heads`` and
        ``kernels.gated`` resolved (:data:`jaxdqn.model.gated.GATED`).
      statistics: ``None`` → the logits; ``"pallas"`` / ``"interpret"`` → the heads'
        statistics kernel (compiled / interpreted) and :class:`BranchStatistics` (forward
        only: no gradient is defined through it).
      acting_product: ``kernels.acting_product``: ``"bf16"`` computes the value/gate product
        of a statistics pass read by the gate kernel (``gate``, ``gate_interpret``) with
        bfloat16 operands and result (:func:`jaxdqn.model.dense.bf16_linear`); every other
        pass, and ``"f32"``, as before.
      raw: with ``statistics`` None and ``raw`` = W > 0, also the heads' outputs before M6's
        combination, each of ``[v | A_0 | …]`` W ≥ N wide (:func:`jaxdqn.model.heads.branch_heads`).
    Returns:
      logits ``[B, 4, 3, N]`` in the order of :data:`BRANCH_KEYS`, or their statistics; with
      ``raw``, ``(logits, heads [B, 4, 4, W] or None)``.
    """
    raw = raw if statistics is None else 0
    sh2 = h_m.shape[1]
    ah, n = cfg.ah, cfg.num_atoms
    order = fused_order(cfg.dir_conditioning)
    cols = fused_columns(ah, order)
    mag_width = sh2 + NUM_ACTIONS if cfg.dir_conditioning else sh2
    width = lambda key: mag_width if key == "branch_magnitude" else sh2
    # in the creation order of the per-branch modules
    prm = {key: BranchParams(width(key), ah, n, cfg.kan, name=key)() for key in BRANCH_KEYS}
    spec = gated_lib.GateSpec(cfg.kan, cfg.kan_grid_min, cfg.kan_grid_max, kan_backend)
    gemm_kernel = gated_kernels in gated_lib.GEMM_KERNELS
    gate_kernel = gated_kernels in gated_lib.GATE_KERNELS
    bf16_products = default_precision() == jax.lax.DotAlgorithmPreset.BF16_BF16_F32
    # The statistics kernel's products round `a` to bfloat16 under kernels.matmul=bf16: the
    # gate kernel then writes it so (half the bytes written and read, the same numbers).
    bf16_statistics = statistics is not None and bf16_products
    # kernels.learner_activations=bf16 (a logits pass): the gate kernel writes `a` in
    # bfloat16 too, the dtype of every activation of the pass.
    bf16_a = bf16_statistics or (statistics is None and bf16_activations())
    if not gemm_kernel:
        # [B, 8·AH]: the columns of `cols` (value paths in `order`, then gate paths)
        w = jnp.concatenate([prm[k][path][0][:sh2] for path, k in cols], 1)
        b = jnp.concatenate([prm[k][path][1] for path, k in cols])
        # The gate kernel adds the biases where it reads u and g: XLA would add them in a
        # pass of its own over the whole product, which the kernel's call cannot fuse.
        if not gate_kernel:
            pre = affine(h_m, w, b)
        elif statistics is not None and acting_product == "bf16":
            pre = bf16_linear(h_m, w)
        else:
            pre = linear(h_m, w)

    def gate_params(keys: tuple[str, ...]) -> tuple[Array | None, Array | None]:
        """M4's (coeffs, w_res) of the branches ``keys`` side by side; (None, None) without M4."""
        cat = lambda i: jnp.concatenate([prm[k]["kan"][i] for k in keys], 0) if cfg.kan else None
        return cat(0), cat(1)

    def gated(u_src: Array, g_src: Array, u_cols: slice, g_cols: slice, keys) -> Array:
        """``a = u ⊙ gate(g)`` for the branches ``keys`` from the given columns."""
        a = u_src[:, u_cols] * gated_lib.gate(g_src[:, g_cols], *gate_params(keys), spec)
        return a.astype(u_src.dtype)  # bfloat16 u (learner_activations): `a` kept so

    def gate_kernel_call(u_cols: slice, g_cols: slice, keys, cond=None) -> Array:
        """:func:`gated` by the gate kernel, reading the bias-free product ``pre`` in place and
        adding the biases (and M5's ``cond`` term) where it reads u and g."""
        biases = b[u_cols], b[g_cols]
        args = (pre, pre, u_cols, g_cols, *gate_params(keys), spec, gated_kernels, *biases)
        return gated_lib.gate_product(*args, cond=cond, out_bf16=bf16_a)

    def heads(a: Array, keys: tuple[str, ...]):
        """M6 for the branches ``keys`` on ``a [B, m·AH]`` → logits ``[B, m, 3, N]`` (or
        their statistics, ``[B, m, 3]`` …)."""
        w = [jnp.concatenate([prm[k]["head_value"][0], prm[k]["head_advantage"][0]], 1)
             for k in keys]  # fmt: skip
        bias = [jnp.concatenate([prm[k]["head_value"][1], prm[k]["head_advantage"][1]])
                for k in keys]  # fmt: skip
        if statistics is None:
            return branch_heads(a, w, bias, head_kernels, raw=raw)
        return head_statistics_pallas(
            a,
            jnp.stack(w),
            jnp.stack(bias),
            v_min,
            delta_z,
            actions=NUM_ACTIONS,
            levels=distribution.QUANTILE_LEVELS,
            bf16=bf16_products,
            per_action=True,
            interpret=statistics == "interpret",
        )

    first = order[:3] if cfg.dir_conditioning else order
    span = lambda path: slice(cols[path, first[0]].start, cols[path, first[-1]].stop)
    if gemm_kernel:  # M3 + M4 in one kernel per call (gated.py)
        a = gated_lib.gated_values([prm[k] for k in first], h_m, spec, gated_kernels)
    elif gate_kernel:
        a = gate_kernel_call(span("value"), span("gate"), first)
    else:
        a = gated(pre, pre, span("value"), span("gate"), first)
    out = heads(a, first)
    if not cfg.dir_conditioning:  # computed in the output order: nothing to reorder
        return out if statistics is None else BranchStatistics(*out)
    branch = lambda x, i: jax.tree.map(lambda y: y[:, i], x)
    fused = [branch(out, i) for i in range(len(first))]  # FUSED_ORDER
    # M5: magnitude's pass, conditioned on the direction's E[Q]
    if statistics is None:
        p_dir = jax.nn.softmax(fused[0][0] if raw else fused[0], axis=-1)
        q_dir = distribution.expectation(p_dir, v_min[:, None], delta_z[:, None])
    else:
        q_dir = fused[0].mean
    cond = jax.lax.stop_gradient(q_dir / delta_z[:, None])  # as in the per-branch path
    mag_key = ("branch_magnitude",)
    mag = prm[mag_key[0]]
    if gemm_kernel:
        x = jnp.concatenate([h_m, cond], 1)
        a = gated_lib.gated_values([mag], x, spec, gated_kernels)
    elif gate_kernel:  # cond W_cond in the kernel: r = 3 FMAs per element, no GEMM
        w_cond = (mag["value"][0][sh2:], mag["gate"][0][sh2:])
        mag_cols = cols["value", mag_key[0]], cols["gate", mag_key[0]]
        a = gate_kernel_call(*mag_cols, mag_key, (cond, *w_cond))
    else:
        u = pre[:, cols["value", mag_key[0]]] + cond @ mag["value"][0][sh2:]
        g = pre[:, cols["gate", mag_key[0]]] + cond @ mag["gate"][0][sh2:]
        a = gated(u, g, slice(0, ah), slice(0, ah), mag_key)
    fused.append(branch(heads(a, mag_key), 0))
    ordered = [fused[i] for i in FROM_FUSED]
    out = jax.tree.map(lambda *xs: jnp.stack(xs, axis=1), *ordered)
    return out if statistics is None else BranchStatistics(*out)


def acting_kernels_available(cfg: ModelConfig, bf16: bool) -> bool:
    """Whether the heads' statistics kernel builds here for every call :func:`fused_branches`
    makes with ``cfg`` (three branches and magnitude under M5, else four); one warning and
    False where it does not."""
    calls = (3, 1) if cfg.dir_conditioning else (4,)
    levels = distribution.QUANTILE_LEVELS
    return all(
        head_statistics_available(
            m, cfg.ah, cfg.num_atoms, NUM_ACTIONS, levels, bf16, per_action=True
        )
        for m in calls
    )
