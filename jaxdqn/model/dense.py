"""A Dense layer whose bias gradient is a matrix product on accelerators.

``y = x W + b`` for ``x [..., K]``, ``W [K, F]``, ``b [F]``. Its backward pass is

    dx = dy Wᵀ,   dW = xᵀ dy,   db = Σ_rows dy = 1ᵀ dy,

with the sums over every leading (batch) row. Autodiff of ``x @ W + b`` emits ``db`` as a
column reduction of ``dy [rows, F]``, and on the GPU XLA fuses that reduction with whatever
elementwise work produced ``dy`` (gradient accumulations, activation derivatives), running all
of it on the reduction's launch grid. For narrow layers that grid is a handful of blocks: in the
learner update's trace a 12-wide bias gradient of M11 fused with a [4,096, 12] cotangent sum
took 95 µs in one kernel (bench/RESULTS.md, issue 12). As a matrix product ``1ᵀ dy`` (8 rows of
ones, so that neither operand is a vector and XLA keeps it a GEMM) the cotangent is computed by
its own full-grid fusion and the sum runs on the tensor cores' GEMM path.

**Which layers** (``kernels.bias_grad``, :func:`bias_gradients`): ``"gemm"`` (the default) takes
every layer's bias gradient as ``1ᵀ dy``; ``"narrow"`` only layers of fewer than :data:`WIDE`
outputs, the wider ones by autodiff's column sum; ``"sum"`` none (autodiff's sums everywhere,
the formulation before the GEMM). Why a choice: the GEMMs of one backward pass share their
block of ones, and XLA's dot merger (``--xla_gpu_dot_merger_threshold_mb``) makes several of
them one product over the *concatenated* cotangents; in the all-off learner update that
concatenation wrote ``f32[4,096, 3,632]`` (59.5 MB, the 2,048-, 816-, 512- and 256-wide
layers), the largest XLA kernel of the update (43–59 µs on an H100; bench/RESULTS.md,
fourteenth session). ``narrow`` keeps the GEMM where the column sum's grid is narrow and
leaves the wide cotangents nothing to share. The numbers differ by float rounding only.

On the CPU the layer is exactly ``flax.linen.Dense`` (the same parameters, the same ops, so the
same numbers bit for bit); :func:`affine` picks the formulation per platform when it is
traced. Parameters (``kernel [K, F]`` lecun-normal, ``bias [F]``
zeros by default) and their names equal ``nn.Dense``'s, so checkpoints and initialisations are
interchangeable.

**Activations** (:func:`activations`: ``kernels.learner_activations`` for the model's
``apply``, the learner's online and target passes; ``kernels.acting_activations`` for
``act``): under ``"bf16"`` every layer is :func:`bf16_affine`: bfloat16 operands, float32
accumulation, a bfloat16 result (the activations between layers are bfloat16, so the passes
over them move half the bytes), and its backward ``dx = dy Wᵀ`` likewise, ``dW = xᵀ dy`` and
the bias sum in float32 (the parameters and their gradients stay float32). A layer that ends
in the distribution's logits asks for a float32 result (``wide``).

**Precision** (``kernels.matmul``, :func:`matmul_precision`): ``"f32"`` = JAX's default for
float32 operands (TF32 tensor-core passes on an H100/H200 GPU, exact float32 on the CPU);
``"bf16"`` = operands rounded to bfloat16 with float32 accumulation
(``jax.lax.DotAlgorithmPreset.BF16_BF16_F32``) in every product traced under it and in their
transposes (autodiff copies a product's precision; the accelerators' custom VJP passes it to its
backward products explicitly). Parameters, activations and elementwise ops stay float32; the
batch sums of :func:`batch_sum` keep ``Precision.HIGHEST``. The CPU backend ignores the preset
(the same numbers as ``"f32"``).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

__all__ = [
    "BIAS_GRADS",
    "MATMUL",
    "WIDE",
    "Dense",
    "activations",
    "affine",
    "batch_sum",
    "bf16_activations",
    "bf16_affine",
    "bias_gradients",
    "default_precision",
    "gemm_bias_gradient",
    "matmul_precision",
    "products",
]

_ONES_ROWS = 8
MATMUL = {"f32": None, "bf16": "BF16_BF16_F32"}
BIAS_GRADS = ("gemm", "narrow", "sum")
WIDE = 128
# The kernels.bias_grad in effect where a layer is traced (bias_gradients); like JAX's own
# default_matmul_precision, a scoped setting read at trace time, never a value of a program.
_BIAS_GRAD: contextvars.ContextVar[str] = contextvars.ContextVar("bias_grad", default="gemm")
ACTIVATIONS = ("f32", "bf16")
# kernels.learner_activations / acting_activations where the network is traced (activations).
_ACTIVATIONS: contextvars.ContextVar[str] = contextvars.ContextVar("activations", default="f32")


def matmul_precision(matmul: str) -> contextlib.AbstractContextManager:
    """The context to trace a model in for ``kernels.matmul``: none for ``"f32"``,
    ``jax.default_matmul_precision("BF16_BF16_F32")`` for ``"bf16"``.

    Raises:
      ValueError: ``matmul`` not in :data:`MATMUL`.
    """
    if matmul not in MATMUL:
        raise ValueError(f"kernels.matmul: {matmul!r} is not one of {sorted(MATMUL)}")
    preset = MATMUL[matmul]
    return contextlib.nullcontext() if preset is None else jax.default_matmul_precision(preset)


def bias_gradients(bias_grad: str) -> contextlib.AbstractContextManager:
    """The context to trace a model in for ``kernels.bias_grad`` (:data:`BIAS_GRADS`): which
    layers :func:`affine` gives the ``1ᵀ dy`` bias gradient on accelerators. Like
    :func:`matmul_precision`, an unknown value fails when the context is made, not entered.

    Raises:
      ValueError: ``bias_grad`` not in :data:`BIAS_GRADS`.
    """
    if bias_grad not in BIAS_GRADS:
        raise ValueError(f"kernels.bias_grad: {bias_grad!r} is not one of {list(BIAS_GRADS)}")
    return _scoped(_BIAS_GRAD, bias_grad)


def activations(
    dtype: str, field: str = "kernels.acting_activations"
) -> contextlib.AbstractContextManager:
    """The context a network pass is traced in for ``kernels.learner_activations`` (the
    model's ``apply``) or ``kernels.acting_activations`` (``act``), :data:`ACTIVATIONS`: under
    ``"bf16"`` every :func:`affine` and :func:`linear` is :func:`bf16_affine` (bfloat16
    operands and result, float32 accumulation), so the activations between layers are
    bfloat16; differentiable (float32 parameter gradients). ``field`` names the setting in the
    error.

    Raises:
      ValueError: ``dtype`` not in :data:`ACTIVATIONS`.
    """
    if dtype not in ACTIVATIONS:
        raise ValueError(f"{field}: {dtype!r} is not one of {ACTIVATIONS}")
    return _scoped(_ACTIVATIONS, dtype)


def bf16_activations() -> bool:
    """Whether the layers traced here run in bfloat16 (:func:`activations` ``("bf16")``)."""
    return _ACTIVATIONS.get() == "bf16"


@contextlib.contextmanager
def _scoped(var: contextvars.ContextVar, value):
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def products(matmul: str, bias_grad: str = "gemm") -> contextlib.AbstractContextManager:
    """:func:`matmul_precision` and :func:`bias_gradients` together: the context the model's
    functions are traced in (an unknown value of either fails here)."""
    return _both(matmul_precision(matmul), bias_gradients(bias_grad))


@contextlib.contextmanager
def _both(first, second):
    with first, second:
        yield


def gemm_bias_gradient(features: int, bias_grad: str) -> bool:
    """Whether a layer of ``features`` outputs takes its bias gradient as ``1ᵀ dy`` on an
    accelerator under ``kernels.bias_grad = bias_grad``: always for ``gemm``, below
    :data:`WIDE` outputs for ``narrow``, never for ``sum``."""
    return bias_grad == "gemm" or (bias_grad == "narrow" and features < WIDE)


def batch_sum(dy: jax.Array) -> jax.Array:
    """``Σ_rows dy`` of ``dy [..., F] -> [F]`` float32, as a matrix product with a block of
    ones: float32 ``dy`` at ``Precision.HIGHEST``, bfloat16 ``dy`` (:func:`bf16_affine`'s
    cotangents; exact operands) with float32 accumulation."""
    flat = dy.reshape(-1, dy.shape[-1])
    ones = jnp.ones((_ONES_ROWS, flat.shape[0]), dy.dtype)
    precision = jax.lax.Precision.HIGHEST if dy.dtype == jnp.float32 else None
    return jnp.dot(ones, flat, precision=precision, preferred_element_type=jnp.float32)[0]


def _plain(x: jax.Array, kernel: jax.Array, bias: jax.Array, precision: Any = None) -> jax.Array:
    # The ops of flax.linen.Dense.__call__ (dot_general over the last axis, then + bias).
    y = jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())), precision=precision)
    return y + jnp.reshape(bias, (1,) * (y.ndim - 1) + (-1,))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _gemm_bias(x: jax.Array, kernel: jax.Array, bias: jax.Array, precision: Any) -> jax.Array:
    return _plain(x, kernel, bias, precision)


def _gemm_bias_fwd(x, kernel, bias, precision):
    return _plain(x, kernel, bias, precision), (x, kernel)


def _gemm_bias_bwd(precision, res, dy):
    # The backward products take the forward's precision explicitly: a custom VJP's backward
    # is traced where the gradient is taken, outside the forward's default_matmul_precision.
    x, kernel = res
    dx = jax.lax.dot_general(dy, kernel, (((dy.ndim - 1,), (1,)), ((), ())), precision=precision)
    x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
    dw = jax.lax.dot_general(x2, dy2, (((0,), (0,)), ((), ())), precision=precision)
    return dx, dw, batch_sum(dy)


_gemm_bias.defvjp(_gemm_bias_fwd, _gemm_bias_bwd)


def default_precision() -> Any:
    """The matrix-product precision in effect where the layer is traced (``None``: JAX's
    default; an algorithm preset name such as ``"BF16_BF16_F32"`` under
    ``jax.default_matmul_precision``), as a ``dot_general`` ``precision`` argument."""
    value = jax.config.jax_default_matmul_precision
    if isinstance(value, str) and value in jax.lax.DotAlgorithmPreset.__members__:
        return jax.lax.DotAlgorithmPreset[value]
    return value


def affine(x: jax.Array, kernel: jax.Array, bias: jax.Array, wide: bool = False) -> jax.Array:
    """``x @ kernel + bias`` over the last axis; on accelerators its bias gradient is
    :func:`batch_sum` (a GEMM) where :func:`gemm_bias_gradient` says so for the
    ``kernels.bias_grad`` in effect (:func:`bias_gradients`), on the CPU it is exactly
    ``flax.linen.Dense``'s.

    The formulation is chosen when the function is traced, from the platform it will run on
    (``jax.default_backend()``), so the CPU program holds ``nn.Dense``'s ops and nothing else;
    inside :func:`activations` ``("bf16")`` it is :func:`bf16_affine` (a bfloat16 result, or
    float32 with ``wide``: for a layer whose output the loss reads, the logits)."""
    if bf16_activations():
        return bf16_affine(x, kernel, bias, wide)
    if jax.default_backend() == "cpu":
        return _plain(x, kernel, bias)
    return _accelerator_affine(x, kernel, bias, _BIAS_GRAD.get())


def _bf16_product(a: jax.Array, b: jax.Array, out_dtype) -> jax.Array:
    # a [..., K] x b [K, N] with bfloat16 operands, float32 accumulation, an out_dtype result.
    bf = jnp.bfloat16
    dims = (((a.ndim - 1,), (0,)), ((), ()))
    return jax.lax.dot_general(
        a.astype(bf), b.astype(bf), dims, jax.lax.Precision.DEFAULT,
        preferred_element_type=out_dtype,
    )  # fmt: skip


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _bf16_layer(x, kernel, bias, wide: bool, gemm_bias: bool):
    out = jnp.float32 if wide else jnp.bfloat16
    y = _bf16_product(x, kernel, out)
    return y if bias is None else y + bias.astype(out)


def _bf16_layer_fwd(x, kernel, bias, wide, gemm_bias):
    # The residual is the bfloat16 copy of x (the product read it so): half the bytes kept;
    # an empty array of x's dtype says what dx is returned in.
    y = _bf16_layer(x, kernel, bias, wide, gemm_bias)
    return y, (x.astype(jnp.bfloat16), kernel, jnp.zeros((0,), x.dtype), bias)


def _bf16_layer_bwd(wide, gemm_bias, res, dy):
    x16, kernel, x_dtype, bias = res
    dy2 = dy.reshape(-1, dy.shape[-1])
    x2 = x16.reshape(-1, x16.shape[-1])
    # dx in bfloat16 (the activation cotangents flow on in bfloat16, widened only where x was
    # float32: the network's input); dW and db in float32, the parameters' own precision.
    dx = _bf16_product(dy2, kernel.T, jnp.bfloat16).astype(x_dtype.dtype).reshape(x16.shape)
    dw = _bf16_product(x2.T, dy2, jnp.float32)
    if bias is None:
        return dx, dw, None
    db = batch_sum(dy2) if gemm_bias else jnp.sum(dy2.astype(jnp.float32), axis=0)
    return dx, dw, db


_bf16_layer.defvjp(_bf16_layer_fwd, _bf16_layer_bwd)


def bf16_affine(
    x: jax.Array, kernel: jax.Array, bias: jax.Array | None, wide: bool = False
) -> jax.Array:
    """``x @ kernel (+ bias)`` over the last axis of ``x [..., K]`` (``kernel [K, F]``, float32
    ``bias [F]`` or None) with bfloat16 operands and float32 accumulation: the result is
    bfloat16 (the bias added in bfloat16), or float32 with ``wide``. Differentiable, with

        dx = bf16(dy) bf16(W)ᵀ  → bfloat16 (x's dtype where x is float32),
        dW = bf16(x)ᵀ bf16(dy)  → float32,    db = Σ_rows dy → float32,

    ``db`` as :func:`batch_sum`'s ones-product (float32 accumulation) where
    :func:`gemm_bias_gradient` says so on an accelerator, else a float32 column sum. The forward
    keeps bfloat16 ``x`` for the backward. The parameters' gradients are float32 sums over the
    batch of bfloat16-rounded factors."""
    gemm_bias = jax.default_backend() != "cpu" and gemm_bias_gradient(
        kernel.shape[-1], _BIAS_GRAD.get()
    )
    return _bf16_layer(x, kernel, bias, wide, gemm_bias)


def _accelerator_affine(x, kernel, bias, bias_grad: str) -> jax.Array:
    # The products take the precision in effect explicitly, so that both formulations' backward
    # products keep it (the custom VJP's backward is traced outside the precision's context).
    precision = default_precision()
    if gemm_bias_gradient(kernel.shape[-1], bias_grad):
        return _gemm_bias(x, kernel, bias, precision)
    return _plain(x, kernel, bias, precision)


def linear(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """``x @ kernel`` over the last axis, without a bias: for a consumer that adds the bias
    itself (a kernel that reads the product, :func:`pallas_kernels.gate_product`), where XLA
    would otherwise write ``x @ kernel + bias`` in a pass of its own. The precision in effect
    (:func:`default_precision`) is the ``dot_general``'s, so its transposes keep it; inside
    :func:`activations` ``("bf16")`` it is :func:`bf16_affine` without a bias."""
    if bf16_activations():
        return bf16_affine(x, kernel, None)
    precision = None if jax.default_backend() == "cpu" else default_precision()
    return jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())), precision=precision)


def bf16_linear(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """``x @ kernel`` over the last axis with bfloat16 operands and a bfloat16 result (float32
    accumulation inside the product): for a forward-only consumer that reads the product in
    bfloat16 and widens it in registers (acting's gate kernel, ``kernels.acting_product``):
    half the bytes the product writes and the consumer reads. The precision is explicit, so a
    ``kernels.matmul`` context does not apply. Not for differentiated passes (autodiff would
    round the weight gradient to bfloat16): :func:`bf16_affine` is its differentiable form."""
    return _bf16_product(x, kernel, jnp.bfloat16)


class Dense(nn.Module):
    """Drop-in for ``flax.linen.Dense`` (float32, with bias) computed by :func:`affine`
    (``wide``: a float32 result inside :func:`activations` ``("bf16")``, for the logits)."""

    features: int
    kernel_init: Callable[..., Any] = nn.initializers.lecun_normal()
    bias_init: Callable[..., Any] = nn.initializers.zeros
    wide: bool = False

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = self.param("kernel", self.kernel_init, (x.shape[-1], self.features), jnp.float32)
        bias = self.param("bias", self.bias_init, (self.features,), jnp.float32)
        return affine(x, kernel, bias, self.wide)
