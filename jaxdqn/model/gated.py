"""M3 + M4 of several branches as one kernel call: ``kernels.gated``.

For ``x [B, K]`` and m branches with value/gate paths ``W_u^k, W_g^k [K, AH]``, biases
``b_u^k, b_g^k [AH]`` and gates (M4's KAN gate, or the sigmoid without M4):

    a = [u_k ⊙ gate_k(g_k)]_k,   u_k = x W_u^k + b_u^k,   g_k = x W_g^k + b_g^k   → [B, m·AH]

:data:`GATED` settings (resolved):

- ``reference``: XLA's products and the gate call of
  :func:`jaxdqn.model.fused_branches.fused_branches` (no call into this module);
- ``pallas``: :func:`pallas_kernels.gated.gated_value_pallas`, the GEMM with the gate in its
  epilogue (only ``a`` is written; the jnp path where the kernel cannot be built);
- ``interpret``: that kernel under the Pallas interpreter (CPU tests);
- ``gate``: XLA's product as in ``reference`` but without its bias, then
  :func:`pallas_kernels.gate_product.gate_product_pallas`, one kernel per call that reads u and g
  where the product wrote them, adds the biases (and M5's ``cond W_cond`` for magnitude) and
  writes only ``a`` (no bias pass, no copy of the gate columns, no separate product pass; the
  jnp path where the kernel cannot be built);
- ``gate_interpret``: that kernel under the Pallas interpreter (CPU tests);
- ``gate_grad``: ``gate``, and where the model is differentiated (the learner's online pass)
  that kernel forward and :func:`pallas_kernels.gate_grad.gate_grad_pallas` backward: one
  pass that reads the cotangent and the product and writes the product's cotangent, the bias
  sums (and M4's parameter sums) in registers (where u and g are one source's disjoint
  columns and no rank term is added: the first call of the fused branches; M5's magnitude
  call and anything else as ``gate``);
- ``gate_grad_interpret``: those kernels under the Pallas interpreter (CPU tests).

``pallas``, ``interpret``, ``gate`` and ``gate_interpret`` are forward only: where the model is
differentiated, the custom VJP's forward rule runs the reference (:func:`gated_reference`, or
the slices, adds, gate and product of ``gate``) and its backward is that function's VJP, so the
gradients are the reference's. Undifferentiated passes (acting, the target network,
evaluation) run the kernel. Every setting equals ``reference`` to float rounding.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import Array

from jaxdqn.model.dense import affine, default_precision
from pallas_kernels import kan_gate
from pallas_kernels.gate_grad import gate_grad_available, gate_grad_pallas
from pallas_kernels.gate_product import (
    gate_product_available,
    gate_product_inputs,
    gate_product_pallas,
)
from pallas_kernels.gated import gated_kernel_available, gated_value_pallas

__all__ = [
    "GATED",
    "GATE_KERNELS",
    "GEMM_KERNELS",
    "GRAD_KERNELS",
    "GateSpec",
    "gate",
    "gate_product",
    "gated_reference",
    "gated_values",
]

GEMM_KERNELS = ("pallas", "interpret")
"""``kernels.gated`` settings that compute the value/gate product in the kernel."""
GRAD_KERNELS = ("gate_grad", "gate_grad_interpret")
"""``kernels.gated`` settings that also differentiate through the backward kernel."""
GATE_KERNELS = ("gate", "gate_interpret", *GRAD_KERNELS)
"""``kernels.gated`` settings that keep XLA's product and fuse the gate and ``u ⊙ gate``."""
GATED = ("reference", *GEMM_KERNELS, *GATE_KERNELS)
"""The resolved ``kernels.gated`` settings."""


class GateSpec(NamedTuple):
    """The static gate settings: M4 on (else the sigmoid), its grid, ``kernels.kan``."""

    kan: bool
    grid_min: float
    grid_max: float
    kan_backend: str


def gate(g: Array, coeffs: Array | None, w_res: Array | None, spec: GateSpec) -> Array:
    """M4's KAN gate of ``kernels.kan`` on the pre-activations ``g [B, F]`` (``coeffs [F, 8]``,
    ``w_res [F]``), or GLU's sigmoid when M4 is off."""
    if not spec.kan:
        return jax.nn.sigmoid(g)
    g = _widened(g)  # P2's kernels read float32 (a bfloat16 pass's g widened here)
    return kan_gate(
        g, coeffs, w_res, grid_min=spec.grid_min, grid_max=spec.grid_max, backend=spec.kan_backend
    )


def gated_reference(x, w_u, w_g, b_u, b_g, coeffs, w_res, spec: GateSpec) -> Array:
    """``u ⊙ gate(g)`` with ``[u | g] = x [W_u | W_g] + [b_u | b_g]`` (one :func:`affine`) and
    :func:`gate`: the ``reference`` computation."""
    f = w_u.shape[1]
    pre = affine(x, jnp.concatenate([w_u, w_g], 1), jnp.concatenate([b_u, b_g]))
    # x's dtype: the kernel's (a bfloat16 pass's products are bfloat16, its gate may be wider)
    return (pre[:, :f] * gate(pre[:, f:], coeffs, w_res, spec)).astype(x.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9))
def _gated(x, w_u, w_g, b_u, b_g, coeffs, w_res, spec, interpret, bf16):
    return gated_value_pallas(
        x,
        w_u,
        w_g,
        b_u,
        b_g,
        coeffs,
        w_res,
        grid_min=spec.grid_min,
        grid_max=spec.grid_max,
        bf16=bf16,
        interpret=interpret,
    ).astype(x.dtype)


def _gated_fwd(x, w_u, w_g, b_u, b_g, coeffs, w_res, spec, interpret, bf16):
    # Differentiated: the reference's forward, and its VJP (a pytree of residuals) kept.
    reference = functools.partial(gated_reference, spec=spec)
    return jax.vjp(reference, x, w_u, w_g, b_u, b_g, coeffs, w_res)


def _gated_bwd(spec, interpret, bf16, vjp, g):
    return vjp(g)


_gated.defvjp(_gated_fwd, _gated_bwd)


def gated_values(branches: list[dict[str, Any]], x: Array, spec: GateSpec, impl: str) -> Array:
    """``a [B, m·AH]`` for the m branches' parameter dicts ``branches`` (each with
    ``"value"``, ``"gate"`` = (kernel, bias) and, with M4, ``"kan"`` = (coeffs, w_res); a
    kernel's first ``K`` rows are used) on ``x [B, K]``, by ``impl`` (``pallas`` or
    ``interpret``; module docstring)."""
    if impl not in GEMM_KERNELS:
        raise ValueError(f"kernels.gated: {impl!r} is not one of {GEMM_KERNELS}")
    k = x.shape[1]
    side_by_side = lambda path: jnp.concatenate([p[path][0][:k] for p in branches], 1)
    stacked = lambda path, i: jnp.concatenate([p[path][i] for p in branches], 0)
    w_u, w_g = side_by_side("value"), side_by_side("gate")
    b_u, b_g = stacked("value", 1), stacked("gate", 1)
    coeffs, w_res = (stacked("kan", 0), stacked("kan", 1)) if spec.kan else (None, None)
    bf16 = default_precision() == jax.lax.DotAlgorithmPreset.BF16_BF16_F32
    x = _widened(x)  # the kernel reads float32 (a bfloat16 pass's features widened here)
    args = (x, w_u, w_g, b_u, b_g, coeffs, w_res)
    if impl == "pallas" and not gated_kernel_available(k, w_u.shape[1], spec.kan, bf16):
        return gated_reference(*args, spec)
    return _gated(*args, spec, impl == "interpret", bf16)


def _gate_product_reference(
    u_src, g_src, coeffs, w_res, u_bias, g_bias, cond, u_cols, g_cols, spec, out_bf16=False
):
    # The kernel's inputs (a bfloat16 product widened first, as the kernel does), then the
    # gate as kernels.kan computes it (P2 where it runs), rounded as the kernel stores it.
    u_src, g_src = _widened(u_src), _widened(g_src)
    u, g = gate_product_inputs(u_src, g_src, u_cols, g_cols, u_bias, g_bias, cond)
    a = u * gate(g, coeffs, w_res, spec)
    return a.astype(jnp.bfloat16) if out_bf16 else a


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9, 10, 11))
def _gate_product(
    u_src, g_src, coeffs, w_res, u_bias, g_bias, cond, u_cols, g_cols, spec, out_bf16, interpret
):
    return gate_product_pallas(
        u_src,
        g_src,
        coeffs,
        w_res,
        u0=u_cols[0],
        g0=g_cols[0],
        width=u_cols[1] - u_cols[0],
        u_bias=u_bias,
        g_bias=g_bias,
        cond=cond,
        grid_min=spec.grid_min,
        grid_max=spec.grid_max,
        out_dtype=jnp.bfloat16 if out_bf16 else jnp.float32,
        interpret=interpret,
    )


def _widened(x: Array) -> Array:
    """``x`` at least float32 (a bfloat16 product is read as float32)."""
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def _gate_product_fwd(*args):
    # Differentiated: the reference's forward (the slices, the bias and rank-r adds, the gate
    # call, the product), and its VJP kept: the gradients of the reference path exactly.
    *arrays, u_cols, g_cols, spec, out_bf16, _interpret = args
    reference = functools.partial(
        _gate_product_reference, u_cols=u_cols, g_cols=g_cols, spec=spec, out_bf16=out_bf16
    )
    return jax.vjp(reference, *arrays)


def _gate_product_bwd(u_cols, g_cols, spec, out_bf16, interpret, vjp, g):
    return vjp(g)


_gate_product.defvjp(_gate_product_fwd, _gate_product_bwd)


def _grad_kw(u0, g0, width, spec, interpret) -> dict:
    return dict(
        u0=u0,
        g0=g0,
        width=width,
        grid_min=spec.grid_min,
        grid_max=spec.grid_max,
        interpret=interpret,
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8, 9))
def _gate_product_grad(src, coeffs, w_res, u_bias, g_bias, u0, g0, width, spec, interpret):
    kw = _grad_kw(u0, g0, width, spec, interpret)
    return gate_product_pallas(src, src, coeffs, w_res, u_bias=u_bias, g_bias=g_bias, **kw)


def _gate_product_grad_fwd(src, coeffs, w_res, u_bias, g_bias, u0, g0, width, spec, interpret):
    out = _gate_product_grad(src, coeffs, w_res, u_bias, g_bias, u0, g0, width, spec, interpret)
    return out, (src, coeffs, w_res, u_bias, g_bias)


def _gate_product_grad_bwd(u0, g0, width, spec, interpret, residuals, da):
    src, coeffs, w_res, u_bias, g_bias = residuals
    kw = _grad_kw(u0, g0, width, spec, interpret)
    grads = gate_grad_pallas(src, da, coeffs, w_res, u_bias=u_bias, g_bias=g_bias, **kw)
    d_src, d_bu, d_bg, d_c, d_w = grads
    return d_src, d_c, d_w, d_bu, d_bg


_gate_product_grad.defvjp(_gate_product_grad_fwd, _gate_product_grad_bwd)


def _grad_kernel_applies(u_src, g_src, u_cols, g_cols, cond, out_bf16) -> bool:
    """Whether :func:`gate_grad_pallas` computes this call's VJP: one float32 source read at
    disjoint column ranges, no rank term, a float32 result."""
    disjoint = u_cols[1] <= g_cols[0] or g_cols[1] <= u_cols[0]
    return (
        u_src is g_src and u_src.dtype == jnp.float32 and cond is None and not out_bf16 and disjoint
    )


def gate_product(
    u_src: Array,
    g_src: Array,
    u_cols: slice,
    g_cols: slice,
    coeffs: Array | None,
    w_res: Array | None,
    spec: GateSpec,
    impl: str,
    u_bias: Array | None = None,
    g_bias: Array | None = None,
    cond: tuple[Array, Array, Array] | None = None,
    out_bf16: bool = False,
) -> Array:
    """``u ⊙ gate(g)`` → ``[B, F]`` with ``u = u_src[:, u_cols] + u_bias + c W_cu`` and ``g =
    g_src[:, g_cols] + g_bias + c W_cg`` (both column ranges F wide; the biases ``[F]``, both
    or neither; ``cond = (c [B, r], W_cu, W_cg [r, F])`` or None; ``u_src`` and ``g_src`` may
    be one array, e.g. the fused branches' bias-free ``[u | g]`` product, float32 or bfloat16:
    the result is float32 either way, or bfloat16 with ``out_bf16``: rounded as it is stored,
    for a consumer whose product rounds it so anyway) by ``impl``
    (``gate``: the Pallas kernel that reads both in place and adds the rest in registers;
    ``gate_interpret``: it under the Pallas interpreter). An undifferentiated pass runs the
    kernel; a differentiated one the reference (the slices, the adds, :func:`gate`, the
    product) and its VJP, or with ``gate_grad`` (``gate_grad_interpret``), where
    :func:`_grad_kernel_applies`, the kernel and the backward kernel
    :func:`~pallas_kernels.gate_grad.gate_grad_pallas`."""
    if impl not in GATE_KERNELS:
        raise ValueError(f"kernels.gated: {impl!r} is not one of {GATE_KERNELS}")
    if (u_bias is None) != (g_bias is None):
        raise ValueError("gate_product: give both biases or neither")
    u_cols, g_cols = (u_cols.start, u_cols.stop), (g_cols.start, g_cols.stop)
    width = u_cols[1] - u_cols[0]
    if g_cols[1] - g_cols[0] != width:
        raise ValueError(f"gate_product: column ranges of different widths: {u_cols}, {g_cols}")
    args = (u_src, g_src, coeffs, w_res, u_bias, g_bias, cond)
    interpret = impl.endswith("interpret")
    if impl in GRAD_KERNELS and _grad_kernel_applies(u_src, g_src, u_cols, g_cols, cond, out_bf16):
        kw = dict(u0=u_cols[0], g0=g_cols[0], bias=u_bias is not None)
        built = interpret or (
            gate_product_available(width, spec.kan, **kw)
            and gate_grad_available(u_src.shape[1], width, spec.kan, **kw)
        )
        if built:
            cols = (u_cols[0], g_cols[0], width)
            return _gate_product_grad(u_src, coeffs, w_res, u_bias, g_bias, *cols, spec, interpret)
    if not interpret:
        bias, rank = u_bias is not None, 0 if cond is None else cond[0].shape[1]
        bf16 = u_src.dtype == g_src.dtype == jnp.bfloat16
        built = gate_product_available(
            width,
            spec.kan,
            u0=u_cols[0],
            g0=g_cols[0],
            bias=bias,
            rank=rank,
            dtype=jnp.bfloat16 if bf16 else jnp.float32,
            out_dtype=jnp.bfloat16 if out_bf16 else jnp.float32,
        )
        if not built:
            return _gate_product_reference(*args, u_cols, g_cols, spec, out_bf16)
    return _gate_product(*args, u_cols, g_cols, spec, out_bf16, interpret)
