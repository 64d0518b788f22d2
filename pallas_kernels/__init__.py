"""Pallas GPU kernels for jaxdqn and their pure-jnp references. Imports nothing from jaxdqn.

P1 `c51_project`: C51 categorical projection (Triton "pull" kernel, no atomics).
P2 `kan_gate`: KAN cubic B-spline gate, forward and backward kernels under a custom_vjp.
M3 + M4 `gated.gated_value_pallas`: the value/gate GEMM with the KAN (or sigmoid) gate in its
epilogue, forward only (jaxdqn's `kernels.gated=pallas` differentiates through its reference).
M3 + M4 `gate_product.gate_product_pallas`: the gate and the product u ⊙ gate(g) reading u and g
in place from XLA's value/gate product, forward only (jaxdqn's `kernels.gated=gate`).
M6 `dueling_heads`: several branches' dueling C51 heads, forward and backward kernels under a
custom_vjp (jaxdqn's `kernels.heads=pallas`).
M6 + M7 `head_statistics.head_statistics_pallas`: acting's heads with M7 in the epilogue, writing
E[Z], Var[Z] and the quantiles and no logits, forward only (jaxdqn's `kernels.acting=pallas`).
M7 `c51_statistics_pallas`: softmax, E[Z], Var[Z] and quantiles of C51 logits in one pass,
forward only (jaxdqn's `kernels.statistics=pallas` differentiates through its jnp reference).
L1 + L4 + M7's E[Q] `c51_loss.c51_loss_head`: the learner's cross-entropies, entropies and E[Q]
from the logits or the heads' `[v | A]`, forward and backward kernels under a custom_vjp
(jaxdqn's `kernels.loss_head`).
L2 + M7 + P1 `c51_target.c51_target`: the learner's target from the target network's logits or
heads — E[Q′], the drawn a′, the TD target and the projected distribution — in one kernel,
forward only (jaxdqn's `kernels.target_head`).
The kernels with a `backend` argument take one of {"auto", "pallas", "interpret", "reference"}.
"""

from pallas_kernels._backend import BACKENDS, fallbacks
from pallas_kernels.heads import HeadBlocks, dueling_heads, dueling_heads_reference
from pallas_kernels.kan import KanBlocks, kan_gate, kan_gate_init, kan_gate_reference
from pallas_kernels.projection import c51_project, c51_project_dense, c51_project_reference

__all__ = [
    "BACKENDS",
    "HeadBlocks",
    "KanBlocks",
    "c51_project",
    "c51_project_dense",
    "c51_project_reference",
    "dueling_heads",
    "dueling_heads_reference",
    "fallbacks",
    "kan_gate",
    "kan_gate_init",
    "kan_gate_reference",
]
