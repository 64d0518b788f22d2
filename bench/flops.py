"""Analytic FLOPs of one learner update from the layer shapes of a config (issue 33).

Counts **matrix products only**: every ``dot_general`` of the update, ``2·m·k·n`` FLOPs for a
``[m, k] @ [k, n]`` product (a multiply and an add per multiply-add). Not counted: the
elementwise and reduction work (activations, the gates of M2/M4, softmax, E[Q], the C51
projection, the losses, the sum-tree sample and priority rebuild, optax's Adam), none of which
is a matrix product in jaxdqn. The products, read from the code:

- **online forward** on the batch ``s`` (B rows; :mod:`jaxdqn.model.network`): M1's bottleneck
  ``[D, bn]`` (when ``0 < bn < D``), ``fc1 [·, SH1]``, ``fc2 [SH1, SH2]``; M2's VSN
  ``[SH2, R]``, ``[R, SH2]``; the branches M3–M6 (below); M12's ``[SH2, 1]``.
- **online backward**: per layer ``dW = xᵀ dy`` (the same FLOPs as the forward product) and
  ``dx = dy Wᵀ`` (the same again) where the layer's input depends on the parameters: not for
  the first layer (the observation), M5's conditioning rows (``stop_gradient``) or M9's
  query/key/value (they read the ``stop_gradient`` E[Q]). So online forward + backward ≈ 3×
  the forward, less the dx of those layers.
- **target forward** (:func:`jaxdqn.agent.learner.target_network`): the same network, no
  backward, on ``s′`` (B rows), and on ``[s′; s]`` (2B rows; one pass when ``kernels.fused``,
  else two) when the loss needs the target's E[Q] at s (L6 with M11: ``needs_target_q_s``).
- **M8–M11 coordination** (:mod:`jaxdqn.model.coordination`, only with ``loss.aux_training``)
  on the online E[Q] ``[B, 12]`` (no gradient into the network): M9's query/key/value/out
  ``[12, heads·d]``, M10's four edges (gate ``[6, 1]``, message ``[3, 3]``), M11's steps
  ``[12, H]``, ``[H, 12]``, forward and backward.
- **M13 xLSTM** (:mod:`jaxdqn.model.xlstm`, L6 with M13): one step on a 12-vector per update,
  independent of B (a few hundred FLOPs): six input layers, ``C q`` and ``n·q``, backward.
- **bias gradients on accelerators** (``bias_gemm``): :func:`jaxdqn.model.dense.batch_sum`
  computes an online layer's bias gradient as ``ones[8, B] @ dy [B, F]`` where
  ``kernels.bias_grad`` says so (:func:`jaxdqn.model.dense.gemm_bias_gradient`: every layer
  with ``gemm``, those under 128 outputs with ``narrow``, none with ``sum``; the CPU program has
  none of these).

The branches, as the program runs them: ``kernels.fused`` (the accelerators' default) computes
one value/gate product ``[SH2, 8·AH]`` and one **block-diagonal** head product
``[m·AH, m·4N]`` for the ``m`` branches computed together (4, or 3 and the magnitude's own
``[AH, 4N]`` when M5 conditions it; M5 adds ``[3, AH]`` products for its value and gate rows),
doing ``m``× the head's multiply-adds; the reference (one module per branch; the CPU's
default) computes each branch's ``value``/``gate`` ``[SH2(+3), AH]`` and
``head_value [AH, N]``, ``head_advantage [AH, 3N]``.

``kernels.heads`` = ``split`` or the Pallas head kernels compute each branch's head alone (the
model's count), the kernels with their bias gradients inside.

Two totals: :func:`executed_flops` — the products the JAX program executes (block-diagonal
heads when fused with ``kernels.heads=blockdiag``, bias GEMMs on accelerators), and
:func:`model_flops` — the update's math, each branch's head its own product and no bias GEMMs
(what the PyTorch peer's batched heads compute; the figure "% of the matmul rate" is quoted
for). On the CPU the executed count equals
a count of the ``dot_general`` equations of the update's jaxpr (:func:`jaxpr_flops`,
``tests/test_bench_flops.py``).

    python bench/flops.py                      # configs/gpu.yaml, all off and all on, B = 4096
    python bench/flops.py --config configs/smoke.yaml --batch 32 --obs-dim 47
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jaxdqn import config  # noqa: E402
from jaxdqn.branches import NUM_ACTIONS, NUM_BRANCHES, NUM_Q  # noqa: E402
from jaxdqn.model.dense import gemm_bias_gradient  # noqa: E402

__all__ = [
    "Layer",
    "Product",
    "breakdown",
    "coordination_layers",
    "executed_flops",
    "jaxpr_flops",
    "jaxpr_products",
    "model_flops",
    "network_layers",
    "network_parameters",
    "update_products",
    "xlstm_products",
]

_ONES_ROWS = 8  # jaxdqn.model.dense._ONES_ROWS: the rows of ones of the bias-gradient GEMM


@dataclasses.dataclass(frozen=True)
class Layer:
    """One dense layer applied row-wise: ``[rows, k] @ [k, n]`` (+ bias).

    ``blocks > 1``: a block-diagonal product of ``blocks`` independent ``[k/blocks, n/blocks]``
    layers executed as one ``[k, n]`` product. ``grad_in``: the input depends on parameters
    (the backward computes ``dx``). ``bias``: the layer has a bias (a bias-gradient GEMM on
    accelerators)."""

    name: str
    k: int
    n: int
    grad_in: bool = True
    bias: bool = True
    blocks: int = 1

    def products(self, rows: int, block_diagonal: bool) -> tuple[int, int, int, int]:
        """``(m, k, n, count)`` of the forward product for ``rows`` rows."""
        if self.blocks == 1 or block_diagonal:
            return rows, self.k, self.n, 1
        return rows, self.k // self.blocks, self.n // self.blocks, self.blocks


@dataclasses.dataclass(frozen=True)
class Product:
    """``count`` matrix products ``[m, k] @ [k, n]`` of ``part`` (target forward, online forward,
    online backward, bias gradients), from layer ``layer``'s ``op`` (forward, dx, dW, bias)."""

    part: str
    layer: str
    op: str
    m: int
    k: int
    n: int
    count: int = 1

    @property
    def flops(self) -> int:
        return 2 * self.m * self.k * self.n * self.count


def _uses_bottleneck(model: config.ModelConfig, obs_dim: int) -> bool:
    return 0 < model.bottleneck_dim < obs_dim


def network_layers(
    model: config.ModelConfig, obs_dim: int, *, fused: bool = True, heads: str = "blockdiag"
) -> list[Layer]:
    """The dense layers of one network pass (M1–M6, M12) in order, for observations of width
    ``obs_dim``; ``fused``: the branches as ``kernels.fused`` computes them (module docstring);
    ``heads``: ``kernels.heads`` resolved. The Pallas head kernels (``pallas``, ``interpret``)
    sum the heads' bias gradients inside the kernel: their head layers count no bias GEMM."""
    layers = []
    width = obs_dim
    if _uses_bottleneck(model, obs_dim):
        layers.append(Layer("trunk.bottleneck", width, model.bottleneck_dim, grad_in=False))
        width = model.bottleneck_dim
    layers.append(Layer("trunk.fc1", width, model.sh1, grad_in=bool(layers)))
    layers.append(Layer("trunk.fc2", model.sh1, model.sh2))
    if model.vsn:
        layers += [
            Layer("vsn.fc1", model.sh2, model.vsn_hidden),
            Layer("vsn.fc2", model.vsn_hidden, model.sh2),
        ]
    ah, head = model.ah, (1 + NUM_ACTIONS) * model.num_atoms  # head_value | head_advantage
    m5 = model.dir_conditioning
    if fused:
        gemm_bias = heads not in ("pallas", "interpret")
        layers.append(Layer("branches.value_gate", model.sh2, 2 * NUM_BRANCHES * ah))
        m = NUM_BRANCHES - 1 if m5 else NUM_BRANCHES
        layers.append(Layer("branches.heads", m * ah, m * head, bias=gemm_bias, blocks=m))
        if m5:
            layers += [
                Layer("branch_magnitude.value_cond", NUM_ACTIONS, ah, grad_in=False, bias=False),
                Layer("branch_magnitude.gate_cond", NUM_ACTIONS, ah, grad_in=False, bias=False),
                Layer("branch_magnitude.heads", ah, head, bias=gemm_bias),
            ]
    else:
        for key in ("direction", "magnitude", "order", "urgency"):
            width = model.sh2 + (NUM_ACTIONS if m5 and key == "magnitude" else 0)
            layers += [
                Layer(f"branch_{key}.value", width, ah),
                Layer(f"branch_{key}.gate", width, ah),
                Layer(f"branch_{key}.head_value", ah, model.num_atoms),
                Layer(f"branch_{key}.head_advantage", ah, NUM_ACTIONS * model.num_atoms),
            ]
    if model.selectivity:
        layers.append(Layer("selectivity", model.sh2, 1))
    return layers


def coordination_layers(model: config.ModelConfig) -> list[Layer]:
    """The dense layers of M9–M11 on the 12 Q-values of a row, in order. Their input is the
    online E[Q] without gradient: a layer reading it directly computes no dx."""
    layers = []
    grad = False  # whether x (the values being coordinated) depends on M9–M11's parameters
    if model.q_attention:
        width = model.attention_heads * max(1, NUM_Q // model.attention_heads)
        layers += [Layer(f"attention.{p}", NUM_Q, width, grad_in=grad) for p in ("query", "key")]
        layers += [
            Layer("attention.value", NUM_Q, width, grad_in=grad),
            Layer("attention.out", width, NUM_Q),
        ]
        grad = True
    if model.graph:
        for edge in ("dir_to_mag", "dir_to_ord", "mag_to_urg", "ord_to_urg"):
            layers += [
                Layer(f"graph.{edge}_gate", 2 * NUM_ACTIONS, 1, grad_in=grad),
                Layer(f"graph.{edge}_message", NUM_ACTIONS, NUM_ACTIONS, grad_in=grad),
            ]
        grad = True
    if model.denoiser:
        for k in range(model.denoise_steps):
            layers += [
                Layer(f"denoiser.step{k}_fc1", NUM_Q, model.denoise_hidden, grad_in=grad),
                Layer(f"denoiser.step{k}_fc2", model.denoise_hidden, NUM_Q),
            ]
            grad = True
    return layers


def xlstm_products(model: config.ModelConfig) -> list[Product]:
    """M13's products of one update (one cell step on a 12-vector, with its backward): the
    query/key/value/output-gate layers ``[12] @ [12, d]`` and the input/forget gates
    ``[12] @ [12, 1]`` (forward and dW; their inputs are batch statistics, no dx), the
    retrieval ``C q`` and the normaliser ``n·q`` (forward; backward dC = dh ⊗ q, dq = Cᵀ dh,
    dn = g q, dq += g n)."""
    d, x = model.xlstm_hidden, NUM_Q
    fwd = [Product("online forward", f"xlstm.{p}", "forward", 1, x, d) for p in "qkvo"]
    fwd += [Product("online forward", f"xlstm.{g}_gate", "forward", 1, x, 1) for g in "if"]
    fwd += [
        Product("online forward", "xlstm.Cq", "forward", d, d, 1),
        Product("online forward", "xlstm.nq", "forward", 1, d, 1),
    ]
    bwd = [dataclasses.replace(p, part="online backward", op="dW") for p in fwd[:6]]
    bwd += [
        Product("online backward", "xlstm.Cq", "dC", d, 1, d),
        Product("online backward", "xlstm.Cq", "dq", 1, d, d),
        Product("online backward", "xlstm.nq", "dn", 1, 1, d),
        Product("online backward", "xlstm.nq", "dq", 1, 1, d),
    ]
    return fwd + bwd


def _pass(part: str, layers: list[Layer], rows: int, block_diagonal: bool) -> list[Product]:
    return [
        Product(part, layer.name, "forward", *layer.products(rows, block_diagonal))
        for layer in layers
    ]


def _backward(layers: list[Layer], rows: int, block_diagonal: bool) -> list[Product]:
    out = []
    for layer in layers:
        m, k, n, count = layer.products(rows, block_diagonal)
        out.append(Product("online backward", layer.name, "dW", k, m, n, count))
        if layer.grad_in:
            out.append(Product("online backward", layer.name, "dx", m, n, k, count))
    return out


def update_products(
    cfg: config.Config,
    batch: int,
    obs_dim: int,
    *,
    fused: bool = True,
    block_diagonal: bool = True,
    bias_gemm: bool = False,
    heads: str = "blockdiag",
) -> list[Product]:
    """Every matrix product of one learner update of ``cfg`` at batch ``batch`` (this device's
    rows) on observations of width ``obs_dim``: ``fused`` = ``kernels.fused`` resolved (True on
    accelerators by default), ``block_diagonal``: count the fused head product as executed
    (False: as its ``m`` branches' own products), ``bias_gemm``: add the accelerators'
    bias-gradient GEMMs (of the layers ``cfg.kernels.bias_grad`` gives one), ``heads``:
    ``kernels.heads`` resolved (:func:`network_layers`)."""
    model, loss = cfg.model, cfg.loss
    net = network_layers(model, obs_dim, fused=fused, heads=heads)
    needs_target_q_s = loss.aux_training and model.denoiser  # losses.make_loss
    rows_target = batch * (2 if needs_target_q_s else 1)
    online = net + (coordination_layers(model) if loss.aux_training else [])
    out = _pass("target forward", net, rows_target, block_diagonal)
    out += _pass("online forward", online, batch, block_diagonal)
    out += _backward(online, batch, block_diagonal)
    if loss.aux_training and model.xlstm:
        out += xlstm_products(model)
    if bias_gemm:
        out += [
            Product("bias gradients", layer.name, "bias", _ONES_ROWS, batch, layer.n)
            for layer in online
            if layer.bias and gemm_bias_gradient(layer.n, cfg.kernels.bias_grad)
        ]
    return out


def executed_flops(
    cfg: config.Config,
    batch: int,
    obs_dim: int,
    *,
    fused: bool = True,
    bias_gemm: bool = False,
    heads: str = "blockdiag",
) -> int:
    """Matrix-product FLOPs of one update as the JAX program executes them (block-diagonal heads
    when ``fused`` with ``heads`` = ``blockdiag``, each branch's head alone with ``split`` or
    the Pallas head kernels; ``bias_gemm`` on accelerators)."""
    products = update_products(
        cfg,
        batch,
        obs_dim,
        fused=fused,
        block_diagonal=heads == "blockdiag",
        bias_gemm=bias_gemm,
        heads=heads,
    )
    return sum(p.flops for p in products)


def model_flops(cfg: config.Config, batch: int, obs_dim: int) -> int:
    """Matrix-product FLOPs of one update's math: each branch's head its own product, no bias
    GEMMs (the fused value/gate product and M5's rows as the fused program has them)."""
    products = update_products(cfg, batch, obs_dim, fused=True, block_diagonal=False)
    return sum(p.flops for p in products)


def breakdown(products: list[Product]) -> dict[str, int]:
    """FLOPs per part (target forward, online forward, online backward, bias gradients)."""
    parts: dict[str, int] = collections.defaultdict(int)
    for p in products:
        parts[p.part] += p.flops
    return dict(parts)


def network_parameters(model: config.ModelConfig, obs_dim: int) -> int:
    """Weights and biases of the network's dense layers (M1–M6, M12; per-branch heads):
    the model's whole parameter count when M4's KAN, M8–M11 and M13 are off."""
    layers = network_layers(model, obs_dim, fused=False)
    return sum(layer.k * layer.n + (layer.n if layer.bias else 0) for layer in layers)


def _dot_flops(eqn) -> int:
    """``2 · prod(lhs dims) · prod(rhs free dims)``: the lhs holds the batch, contracted and its
    own free dims, the rhs adds its free dims (neither contracted nor batch)."""
    (_, rhs_contract), (_, rhs_batch) = eqn.params["dimension_numbers"]
    lhs, rhs = (v.aval.shape for v in eqn.invars)
    skip = set(rhs_contract) | set(rhs_batch)
    return 2 * math.prod(lhs) * math.prod(d for i, d in enumerate(rhs) if i not in skip)


def jaxpr_products(jaxpr, multiplier: int = 1) -> list[tuple[tuple, tuple, int]]:
    """``(lhs shape, rhs shape, FLOPs)`` of every ``dot_general`` in ``jaxpr`` (a ``Jaxpr`` or
    ``ClosedJaxpr``) and its sub-jaxprs: ``2 · prod(batch) · prod(contracted) · prod(free
    dims of both operands)``. A ``scan`` body counts ``length`` times, a ``cond`` its
    costliest branch, a ``while`` body once (its trip count is unknown). A custom VJP's
    backward is visible only where the jaxpr is of a gradient (it is traced there)."""
    from jax.extend import core

    inner = getattr(jaxpr, "jaxpr", jaxpr)
    out = []
    for eqn in inner.eqns:
        if eqn.primitive.name == "dot_general":
            lhs, rhs = (tuple(v.aval.shape) for v in eqn.invars)
            out.append((lhs, rhs, multiplier * _dot_flops(eqn)))
            continue
        subs = []
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(sub, (core.Jaxpr, core.ClosedJaxpr)):
                    subs.append(sub)
        if eqn.primitive.name == "cond":
            branches = [jaxpr_products(s, multiplier) for s in subs]
            out += max(branches, key=lambda b: sum(f for *_, f in b), default=[])
            continue
        times = eqn.params.get("length", 1) if eqn.primitive.name == "scan" else 1
        for sub in subs:
            out += jaxpr_products(sub, multiplier * times)
    return out


def jaxpr_flops(jaxpr) -> int:
    """Total FLOPs of :func:`jaxpr_products`."""
    return sum(f for *_, f in jaxpr_products(jaxpr))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "configs/gpu.yaml"))
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument(
        "--obs-dim", type=int, default=91, help="observation width (91: window 8 × 11 + 3)"
    )
    args = ap.parse_args()
    for label, extra in (("all off", config.ALL_OFF), ("all on", config.ALL_ON)):
        cfg = config.load(args.config, [*extra, f"replay.batch_size={args.batch}"])
        products = update_products(cfg, args.batch, args.obs_dim, bias_gemm=True)
        model, b = model_flops(cfg, args.batch, args.obs_dim), args.batch
        parts = ", ".join(f"{k} {v / 1e9:.2f}" for k, v in breakdown(products).items())
        print(f"{label}: model {model / 1e9:.2f} GFLOP ({model / b / 1e6:.3f} MFLOP/sample), "
              f"executed on an accelerator {sum(p.flops for p in products) / 1e9:.2f} GFLOP; "
              f"{parts}")  # fmt: skip
    cfg = config.load(args.config, list(config.ALL_OFF))
    print(f"all off network parameters: {network_parameters(cfg.model, args.obs_dim):,}")


if __name__ == "__main__":
    main()
