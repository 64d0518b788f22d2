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
# kernels.acting_activations where acting's network is traced (activations): likewise scoped.
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


def activations(dtype: str) -> contextlib.AbstractContextManager:
    """The context acting's forward pass is traced in for ``kernels.acting_activations``
    (:data:`ACTIVATIONS`): under ``"bf16"`` every :func:`affine` takes bfloat16 operands and
    returns ``x W + b`` in bfloat16 (float32 accumulation, :func:`bf16_linear`), so the
    activations between layers are bfloat16. Forward only: never entered where a gradient is
    taken.

    Raises:
      ValueError: ``dtype`` not in :data:`ACTIVATIONS`.
    """
    if dtype not in ACTIVATIONS:
        raise ValueError(f"kernels.acting_activations: {dtype!r} is not one of {ACTIVATIONS}")
    return _scoped(_ACTIVATIONS, dtype)


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
    """``Σ_rows dy`` of ``dy [..., F] -> [F]`` as a matrix product with a block of ones."""
    flat = dy.reshape(-1, dy.shape[-1])
    ones = jnp.ones((_ONES_ROWS, flat.shape[0]), dy.dtype)
    return jnp.dot(ones, flat, precision=jax.lax.Precision.HIGHEST)[0]


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


def affine(x: jax.Array, kernel: jax.Array, bias: jax.Array) -> jax.Array:
    """``x @ kernel + bias`` over the last axis; on accelerators its bias gradient is
    :func:`batch_sum` (a GEMM) where :func:`gemm_bias_gradient` says so for the
    ``kernels.bias_grad`` in effect (:func:`bias_gradients`), on the CPU it is exactly
    ``flax.linen.Dense``'s.

    The formulation is chosen when the function is traced, from the platform it will run on
    (``jax.default_backend()``), so the CPU program holds ``nn.Dense``'s ops and nothing else;
    inside :func:`activations` ``("bf16")`` (acting only) it is bfloat16 in and out."""
    if _ACTIVATIONS.get() == "bf16":  # acting's forward pass only (activations)
        return bf16_linear(x, kernel) + bias.astype(jnp.bfloat16)
    if jax.default_backend() == "cpu":
        return _plain(x, kernel, bias)
    return _accelerator_affine(x, kernel, bias, _BIAS_GRAD.get())


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
    (:func:`default_precision`) is the ``dot_general``'s, so its transposes keep it."""
    precision = None if jax.default_backend() == "cpu" else default_precision()
    return jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())), precision=precision)


def bf16_linear(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """``x @ kernel`` over the last axis with bfloat16 operands and a bfloat16 result (float32
    accumulation inside the product): for a forward-only consumer that reads the product in
    bfloat16 and widens it in registers (acting's gate kernel, ``kernels.acting_product``):
    half the bytes the product writes and the consumer reads. The precision is explicit, so a
    ``kernels.matmul`` context does not apply. Not for differentiated passes."""
    bf = jnp.bfloat16
    dims = (((x.ndim - 1,), (0,)), ((), ()))
    return jax.lax.dot_general(
        x.astype(bf), kernel.astype(bf), dims, jax.lax.Precision.DEFAULT, preferred_element_type=bf
    )


class Dense(nn.Module):
    """Drop-in for ``flax.linen.Dense`` (float32, with bias) computed by :func:`affine`."""

    features: int
    kernel_init: Callable[..., Any] = nn.initializers.lecun_normal()
    bias_init: Callable[..., Any] = nn.initializers.zeros

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = self.param("kernel", self.kernel_init, (x.shape[-1], self.features), jnp.float32)
        bias = self.param("bias", self.bias_init, (self.features,), jnp.float32)
        return affine(x, kernel, bias)
