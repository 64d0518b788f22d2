"""Backend selection, Triton compiler parameters and the build-or-fall-back probe.

Every kernel in this package is a Pallas *Triton* kernel. On jax 0.11 each Triton `pallas_call`
emits a DeprecationWarning asking to migrate to the Mosaic GPU backend; Triton still works on
jax 0.10 – 0.12 and is the one GPU backend that runs the same kernels on 0.10, so the warning is
silenced here (by its exact message, nothing else). A Mosaic GPU port would replace
`compiler_params()` by `plgpu.CompilerParams` of `jax.experimental.pallas.mosaic_gpu` (or move the
kernels to `plgpu.kernel`), and the `plgpu.load/store` gathers by Mosaic GPU's explicit SMEM
staging; the references and the custom_vjp wiring stay as they are.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable

import jax
from jax.experimental.pallas import triton as pl_triton

BACKENDS = ("auto", "pallas", "interpret", "reference")

# Emitted at lowering time, possibly while a caller's outer jit compiles, so a scoped
# catch_warnings around our own call would miss it: a narrow global filter is the only way.
warnings.filterwarnings(
    "ignore", message=r"The Pallas Triton backend is deprecated", category=DeprecationWarning
)

_PROBED: dict[Hashable, str | None] = {}


def resolve(backend: str, name: str) -> str:
    """Map a user backend string to "pallas", "interpret" or "reference"."""
    if backend not in BACKENDS:
        raise ValueError(f"{name}: backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "pallas" if jax.default_backend() == "gpu" else "reference"
    return backend


def compiler_params(num_warps: int, num_stages: int | None = None) -> pl_triton.CompilerParams:
    """Explicit Triton parameters: they, not a platform default, select the Triton backend."""
    # Mosaic GPU port: return jax.experimental.pallas.mosaic_gpu.CompilerParams(...) here.
    return pl_triton.CompilerParams(num_warps=num_warps, num_stages=num_stages)


def tile_dot(x: jax.Array, y: jax.Array, contract, bf16: bool) -> jax.Array:
    """A tile product inside a kernel, contracting the axes ``contract`` = ((x's,), (y's,)):
    JAX's float32 default (TF32 on an H100/H200) or, with ``bf16``, bfloat16 operands and
    float32 accumulation."""
    precision = jax.lax.DotAlgorithmPreset.BF16_BF16_F32 if bf16 else None
    return jax.lax.dot_general(x, y, (contract, ((), ())), precision=precision)


def kernel_available(key: Hashable, build: Callable[[], object]) -> bool:
    """Build (lower, compile, run once on zeros) a kernel configuration once per process.

    Lowering errors would otherwise surface only when the caller's outer jit compiles, where
    nothing can fall back. On failure: one RuntimeWarning per configuration and False, so the
    caller uses the jnp reference instead of crashing.
    """
    if key not in _PROBED:
        try:
            build()
            _PROBED[key] = None
        except Exception as err:  # any build failure means "use the reference"
            _PROBED[key] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            warnings.warn(
                f"pallas_kernels: cannot build the Pallas kernel {key!r} on this platform "
                f"({_PROBED[key]}); falling back to the jnp reference",
                RuntimeWarning,
                stacklevel=3,
            )
    return _PROBED[key] is None


def fallbacks() -> dict[Hashable, str]:
    """Kernel configurations that failed to build in this process, with the reason."""
    return {key: why for key, why in _PROBED.items() if why is not None}
