"""M6, the dueling C51 head, for one branch and for several branches at once.

For a branch's features ``a [B, AH]``: ``v = a W_V + b_V`` ``[B, N]``, ``A = a W_A + b_A``
``[B, 3, N]``, logits ``= v[:, None] + A − mean_actions A`` (:func:`dueling`).

:func:`branch_heads` computes the heads of m branches whose features sit side by side in
``a [B, m·AH]`` (``kernels.fused``), as ``kernels.heads`` says (:data:`HEADS`):

- ``blockdiag``: one product with the block-diagonal matrix of the branches' ``[W_V | W_A]``:
  m times the multiply-adds of m separate products, but one plain GEMM whose operands and
  result keep the row-major layout (a batched product over a middle branch axis made XLA
  transpose its operands, slower at these sizes);
- ``split``: one product per branch;
- ``folded``: blockdiag's one product with the dueling combination folded into each branch's
  weights first (:func:`pallas_kernels.head_statistics.fold_dueling`, the acting kernel's own
  fold: ``W'_j = W_V + W_{A_j} − mean_i W_{A_i}``, the biases alike, ``[AH, 3N]`` instead of
  ``[AH, 4N]``): the product gives the logits directly, with 3/4 of blockdiag's multiply-adds
  and no dueling pass; the same math to float rounding (differentiated through the fold: the
  gradients of ``W_V`` and ``W_A`` follow from it);
- ``pallas`` / ``interpret``: the Triton kernels of :func:`pallas_kernels.heads.dueling_heads`,
  each branch's product alone with the dueling combination in its epilogue (bf16 operands
  when traced under ``kernels.matmul=bf16``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import Array

from jaxdqn.branches import NUM_ACTIONS
from jaxdqn.model.dense import affine, default_precision
from pallas_kernels.head_statistics import fold_dueling
from pallas_kernels.heads import dueling_heads

__all__ = ["HEADS", "branch_heads", "dueling"]

HEADS = ("blockdiag", "split", "folded", "pallas", "interpret")
"""The resolved ``kernels.heads`` settings."""


def dueling(v: Array, adv: Array) -> Array:
    """M6: logits ``V[..., None, :] + A − mean_actions A`` from ``v [..., N]`` and
    ``adv [..., 3, N]`` → ``[..., 3, N]``."""
    return v[..., None, :] + adv - jnp.mean(adv, axis=-2, keepdims=True)


def branch_heads(
    a: Array, w: list[Array], bias: list[Array], impl: str, raw: int = 0
) -> Array | tuple[Array, Array | None]:
    """The dueling heads of m branches: ``a [B, m·AH]``, each branch's ``w[k] = [W_V | W_A]``
    ``[AH, 4N]`` and ``bias[k] [4N]`` → logits ``[B, m, 3, N]``, computed as ``impl`` says;
    float32 logits also from bfloat16 ``a`` (``kernels.learner_activations``: the products'
    ``wide`` result). With ``raw`` = W ≥ N: ``(logits, heads)``, ``heads [B, m, 4, W]`` the
    products' ``[v | A_0 | A_1 | A_2]`` before the combination (``kernels.loss_head=dueling``
    reads them instead of the logits) where ``impl`` computes them (blockdiag, split), else
    None; with W > N each of the four is padded to W columns by zero weights and biases (the
    product that wider; aligned rows for the kernels), its first N the atoms."""
    if impl not in HEADS:
        raise ValueError(f"kernels.heads: {impl!r} is not one of {HEADS}")
    b, m = a.shape[0], len(w)
    ah, n = w[0].shape[0], w[0].shape[1] // (1 + NUM_ACTIONS)
    if impl in ("pallas", "interpret"):
        bf16 = default_precision() == jax.lax.DotAlgorithmPreset.BF16_BF16_F32
        a = a.astype(jnp.promote_types(a.dtype, jnp.float32))  # the kernel reads float32
        logits = dueling_heads(
            a, jnp.stack(w), jnp.stack(bias), actions=NUM_ACTIONS, backend=impl, bf16=bf16
        )
        return (logits, None) if raw else logits
    if impl == "folded":
        wf, bf = fold_dueling(jnp.stack(w), jnp.stack(bias), NUM_ACTIONS, pad=False)
        w_all = wf[0] if m == 1 else jax.scipy.linalg.block_diag(*wf)
        logits = affine(a, w_all, bf.reshape(-1), wide=True).reshape(b, m, NUM_ACTIONS, n)
        return (logits, None) if raw else logits
    if raw > n:  # each of [v | A_0 | …] padded to `raw` columns (zero weights and bias)
        widen = lambda x: jnp.pad(
            x.reshape(*x.shape[:-1], 1 + NUM_ACTIONS, n),
            [(0, 0)] * (x.ndim - 1) + [(0, 0), (0, raw - n)],
        ).reshape(*x.shape[:-1], (1 + NUM_ACTIONS) * raw)
        w, bias = [widen(x) for x in w], [widen(x) for x in bias]
    width = max(raw, n)
    if impl == "split":
        parts = [affine(a[:, k * ah : (k + 1) * ah], w[k], bias[k], wide=True) for k in range(m)]
        out = jnp.stack(parts, axis=1)
    else:
        w_all = w[0] if m == 1 else jax.scipy.linalg.block_diag(*w)
        out = affine(a, w_all, jnp.concatenate(bias), wide=True).reshape(b, m, -1)
    if not raw:
        return dueling(out[..., :n], out[..., n:].reshape(b, m, NUM_ACTIONS, n))
    out = out.reshape(b, m, 1 + NUM_ACTIONS, width)
    return dueling(out[:, :, 0, :n], out[:, :, 1:, :n]), out
