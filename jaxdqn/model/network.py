"""The branching dueling C51 network (M1–M7, M12) and the model factory that ties in M8–M13.

Forward pass for observations ``obs [B, D]`` and a support ``z_i = v_min + i·Δz`` (``v_min``,
``Δz`` scalars or ``[B]``, moved by the learner's adaptive support L7):

- **M1 trunk**: ``x = W_b obs`` (linear bottleneck, only when ``D > bottleneck_dim > 0``),
  ``h = silu(W_2 silu(W_1 x + b_1) + b_2)`` with widths SH1, SH2.
- **M2 VSN**: ``mask = sigmoid(W_v2 silu(W_v1 h + b_v1) + b_v2)`` (hidden R), ``W_v2 = b_v2 = 0``
  at init so ``mask ≡ 0.5``; ``h_m = mask ⊙ h`` (off: ``h_m = h``).
- **M3 branches** (direction, magnitude, order, urgency): ``u = W_u in + b_u`` (value path,
  AH), ``g = W_g in + b_g`` (gate path, AH), ``a = u ⊙ gate(g)``.
- **M4 gate**: ``gate = pallas_kernels.kan_gate`` (8 cubic B-spline bases per neuron on a uniform
  grid + residual, 9 parameters per neuron; partition-of-unity bases, coefficients 0.5, residual
  weight 0 → exactly 0.5 everywhere at init; see ``pallas_kernels/kan.py``), or ``sigmoid``
  (GLU) when M4 is off.
- **M5**: the magnitude branch's input is ``concat(h_m, stop_gradient(E[Q_dir]) / Δz)``
  ``[B, SH2 + 3]`` (off: ``h_m``).
- **M6 dueling C51 head** per branch: ``logits = V(a)[None] + A(a) − mean_actions A(a)``,
  ``V: [N]``, ``A: [3, N]``; ``probs = softmax over atoms``.
- **M7** E[Q], Var[Q], Q10/Q50/Q90 (:mod:`jaxdqn.model.distribution`).
- **M12 selectivity**: ``sel = sigmoid(w · h + b)`` on the unmasked trunk output (off: 1).

``fused`` (``kernels.fused``) computes M3–M6 for all four branches together
(:func:`jaxdqn.model.fused_branches.fused_branches`: one value/gate product, one gate call for
direction, order and urgency, or one kernel per call for both or for the gate and product with
``kernels.gated``, :mod:`jaxdqn.model.gated`; the heads of several branches at once as
``kernels.heads`` says, :func:`jaxdqn.model.heads.branch_heads`) with the per-branch modules'
parameters; the per-branch :class:`Branch` modules are the reference. Acting reads only M7's
statistics (``Model.act``); with ``kernels.acting`` the fused branches end in them without
writing the logits. Every Dense layer is :class:`jaxdqn.model.dense.Dense` (``nn.Dense`` with a
GEMM bias gradient on accelerators).

``matmul`` (``kernels.matmul``, f32 | bf16) is the operand precision of the products of the
network, M12 and M8–M11, and ``bias_grad`` (``kernels.bias_grad``) which of their layers take
the GEMM bias gradient (:func:`jaxdqn.model.dense.products`).

Parameters are one pytree with three top-level groups:

    main:  trunk, vsn, branch_direction, branch_magnitude, branch_order, branch_urgency
           (each branch holds its value/gate paths, its KAN gate and its dueling head)
    aux:   selectivity, attention, graph, denoiser
    xlstm: the M13 cell

:func:`param_labels` maps it to ``"trunk" | "branches" | "aux" | "xlstm"`` for
``optax.multi_transform``; :func:`branch_mask` marks the four branches alone (O4).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import Array

from jaxdqn.branches import BRANCH_KEYS, BRANCHES, NUM_ACTIONS
from jaxdqn.config import ModelConfig
from jaxdqn.model import distribution
from jaxdqn.model import gated as gated_lib
from jaxdqn.model.coordination import Coordinated, make_coordination
from jaxdqn.model.dense import Dense, activations, products
from jaxdqn.model.fused_branches import (
    ACTING,
    ACTING_PRODUCTS,
    acting_kernels_available,
    fused_branches,
)
from jaxdqn.model.heads import HEADS, dueling
from jaxdqn.model.xlstm import XLSTM, make_xlstm
from jaxdqn.shards import ONE_DEVICE, Shards
from pallas_kernels import kan_gate, kan_gate_init

__all__ = [
    "BRANCHES",
    "BRANCH_KEYS",
    "ActingOutput",
    "Branch",
    "KANGate",
    "Model",
    "Network",
    "NetworkOutput",
    "Params",
    "Selectivity",
    "Trunk",
    "VariableSelection",
    "branch_mask",
    "init",
    "make_model",
    "param_count",
    "param_labels",
]

Params = dict[str, Any]

_zeros = nn.initializers.zeros


class NetworkOutput(NamedTuple):
    """Everything one forward pass produces (B = batch, N = atoms)."""

    logits: Array  # [B, 4, 3, N] float32
    probs: Array  # [B, 4, 3, N] softmax over atoms
    q_mean: Array  # [B, 4, 3] E[Q]
    q_var: Array  # [B, 4, 3] Var[Q] = E[Z²] − E[Z]²
    quantiles: Array  # [B, 4, 3, 3] Q10, Q50, Q90
    features: Array  # [B, SH2] the VSN-masked shared features h_m
    selectivity: Array  # [B] M12 prediction in (0, 1); ones when M12 is off
    # [B, 4, 4, W] the heads' [v | A_0 | A_1 | A_2] before M6's combination (W >= N: the atoms
    # in the first N columns of each), where the model was made with raw_heads = W and its
    # heads compute them (kernels.loss_head=dueling, dueling_padded); else None
    heads: Array | None = None


class ActingOutput(NamedTuple):
    """What acting (A1–A3) and the evaluation policies read of a forward pass."""

    q_mean: Array  # [B, 4, 3] E[Q]
    q_var: Array  # [B, 4, 3] Var[Q]
    quantiles: Array  # [B, 4, 3, 3] Q10, Q50, Q90
    selectivity: Array  # [B] M12 prediction; ones when M12 is off


class Trunk(nn.Module):
    """M1: optional linear bottleneck, then FC → SiLU [SH1] → FC → SiLU [SH2]."""

    sh1: int
    sh2: int
    bottleneck: int = 0  # 0: no bottleneck layer

    @nn.compact
    def __call__(self, obs: Array) -> Array:
        x = obs
        if self.bottleneck:
            x = Dense(self.bottleneck, name="bottleneck")(x)
        x = nn.silu(Dense(self.sh1, name="fc1")(x))
        return nn.silu(Dense(self.sh2, name="fc2")(x))


class VariableSelection(nn.Module):
    """M2: per-feature sigmoid mask from a gating MLP; returns ``(mask ⊙ h, mask)``."""

    hidden: int

    @nn.compact
    def __call__(self, h: Array) -> tuple[Array, Array]:
        g = nn.silu(Dense(self.hidden, name="fc1")(h))
        # Zero last layer: the mask starts at exactly sigmoid(0) = 0.5 for every feature.
        logits = Dense(h.shape[-1], kernel_init=_zeros, bias_init=_zeros, name="fc2")(g)
        mask = jax.nn.sigmoid(logits)
        return mask * h, mask


class KANGate(nn.Module):
    """M4: KAN spline gate over ``[B, F]`` pre-activations (parameters ``coeffs [F, 8]``,
    ``w_res [F]``), via :func:`pallas_kernels.kan_gate`."""

    grid_min: float = -3.0
    grid_max: float = 3.0
    backend: str = "auto"

    @nn.compact
    def __call__(self, x: Array) -> Array:
        f = x.shape[-1]
        x = x.astype(jnp.promote_types(x.dtype, jnp.float32))  # P2 reads float32
        coeffs = self.param("coeffs", lambda _key: kan_gate_init(f)[0])
        w_res = self.param("w_res", lambda _key: kan_gate_init(f)[1])
        return kan_gate(
            x, coeffs, w_res, grid_min=self.grid_min, grid_max=self.grid_max, backend=self.backend
        )


class Branch(nn.Module):
    """M3 + M4 + M6: value path ⊙ gate(gate path), then a dueling C51 head → logits [B, 3, N]."""

    ah: int
    num_atoms: int
    kan: bool = True
    grid_min: float = -3.0
    grid_max: float = 3.0
    kan_backend: str = "auto"

    @nn.compact
    def __call__(self, x: Array) -> Array:
        value = Dense(self.ah, name="value")(x)
        gate_pre = Dense(self.ah, name="gate")(x)
        if self.kan:
            gate = KANGate(self.grid_min, self.grid_max, self.kan_backend, name="kan")(gate_pre)
        else:
            gate = jax.nn.sigmoid(gate_pre)
        a = (value * gate).astype(value.dtype)
        n = self.num_atoms
        v = Dense(n, wide=True, name="head_value")(a)
        adv = Dense(NUM_ACTIONS * n, wide=True, name="head_advantage")(a)
        adv = adv.reshape(-1, NUM_ACTIONS, n)
        return dueling(v, adv)


class Selectivity(nn.Module):
    """M12: ``sigmoid(w · h + b)`` per sample, ``h [B, SH2] -> [B]``."""

    @nn.compact
    def __call__(self, h: Array) -> Array:
        return jax.nn.sigmoid(Dense(1, name="dense")(h)[:, 0])


class Network(nn.Module):
    """The ``main`` group: trunk, VSN and the four branches (M1–M6).

    ``__call__(obs [B, D], v_min [B], delta_z [B]) -> (logits [B, 4, 3, N], h [B, SH2],
    h_masked [B, SH2])``; with ``statistics`` (``kernels.acting``: pallas | interpret, the fused
    branches only) the first element is their
    :class:`~jaxdqn.model.fused_branches.BranchStatistics` instead of the logits.
    """

    cfg: ModelConfig
    obs_dim: int
    kan_backend: str = "auto"
    fused: bool = True
    head_kernels: str = "blockdiag"  # kernels.heads resolved (HEADS)
    gated_kernels: str = "reference"  # kernels.gated resolved (GATED)
    statistics: str | None = None  # kernels.acting's kernel (pallas | interpret), or logits
    acting_product: str = "f32"  # kernels.acting_product (ACTING_PRODUCTS)
    raw_heads: int = 0  # W > 0: also the heads' outputs before M6, W wide (fused path)

    @nn.compact
    def __call__(self, obs: Array, v_min: Array, delta_z: Array) -> tuple[Array, Array, Array]:
        c = self.cfg
        use_bottleneck = 0 < c.bottleneck_dim < self.obs_dim
        h = Trunk(c.sh1, c.sh2, c.bottleneck_dim if use_bottleneck else 0, name="trunk")(obs)
        h_m = VariableSelection(c.vsn_hidden, name="vsn")(h)[0] if c.vsn else h
        if self.fused:
            out = fused_branches(
                c,
                h_m,
                v_min,
                delta_z,
                kan_backend=self.kan_backend,
                head_kernels=self.head_kernels,
                gated_kernels=self.gated_kernels,
                statistics=self.statistics,
                acting_product=self.acting_product,
                raw=self.raw_heads,
            )
            return out, h, h_m

        def branch(name: str) -> Branch:
            return Branch(
                c.ah,
                c.num_atoms,
                c.kan,
                c.kan_grid_min,
                c.kan_grid_max,
                self.kan_backend,
                name=name,
            )

        logits_dir = branch("branch_direction")(h_m)
        mag_in = h_m
        if c.dir_conditioning:
            p_dir = jax.nn.softmax(logits_dir, axis=-1)
            q_dir = distribution.expectation(p_dir, v_min[:, None], delta_z[:, None])
            # Δz-normalised so the 3 extra inputs live on the atom-index scale; no gradient
            # from the magnitude branch's loss into the direction branch.
            cond = jax.lax.stop_gradient(q_dir / delta_z[:, None])
            mag_in = jnp.concatenate([h_m, cond], axis=-1)
        logits_mag = branch("branch_magnitude")(mag_in)
        logits_ord = branch("branch_order")(h_m)
        logits_urg = branch("branch_urgency")(h_m)
        logits = jnp.stack([logits_dir, logits_mag, logits_ord, logits_urg], axis=1)
        return logits, h, h_m


@dataclasses.dataclass(frozen=True)
class Model:
    """Pure functions of the whole model (from :func:`make_model`); no Python-side state.

    - ``init(key) -> Params`` — ``{"main": ..., "aux": ..., "xlstm": ...}``.
    - ``apply(params, obs [B, D], v_min, delta_z) -> NetworkOutput`` — ``v_min``/``delta_z``
      scalars or ``[B]``.
    - ``act(params, obs, v_min, delta_z) -> ActingOutput`` — what acting reads of ``apply``
      (E[Q], Var[Q], quantiles, M12), computed without the logits with ``kernels.acting``.
    - ``coordinate(params, q [B, 4, 3]) -> Coordinated`` — M8–M11 (uses ``params["aux"]``).
    - ``xlstm`` — the M13 functions (:class:`jaxdqn.model.xlstm.XLSTM`); its parameters are
      ``params["xlstm"]``.
    """

    cfg: ModelConfig
    obs_dim: int
    init: Callable[[Array], Params]
    apply: Callable[..., NetworkOutput]
    act: Callable[..., ActingOutput]
    coordinate: Callable[[Params, Array], Coordinated]
    xlstm: XLSTM


_COORD_KEYS = ("attention", "graph", "denoiser")


def make_model(
    cfg: ModelConfig,
    obs_dim: int,
    *,
    kan_backend: str = "auto",
    fused: bool = True,
    heads: str = "blockdiag",
    statistics: str = "reference",
    gated: str = "reference",
    acting: str = "reference",
    shards: Shards = ONE_DEVICE,
    matmul: str = "f32",
    bias_grad: str = "gemm",
    acting_product: str = "f32",
    acting_activations: str = "f32",
    learner_activations: str = "f32",
    raw_heads: int = 0,
) -> Model:
    """Factory of the model's pure functions for ``cfg`` and observations of width ``obs_dim``;
    ``kan_backend`` picks the M4 gate's implementation (``kernels.kan``), ``fused`` computes
    the four branches together (``kernels.fused``; off: one module per branch), ``heads`` how
    it computes their heads (``kernels.heads`` resolved: blockdiag | split | folded | pallas |
    interpret), ``statistics`` how M7 is computed (``kernels.statistics`` resolved:
    reference | pallas | interpret, :func:`jaxdqn.model.distribution.statistics_of_logits`),
    ``gated`` how the fused branches compute M3 + M4 (``kernels.gated`` resolved: reference |
    pallas | interpret | gate | gate_interpret, :mod:`jaxdqn.model.gated`), ``acting`` how
    ``act`` computes the statistics (``kernels.acting`` resolved: reference | pallas | interpret,
    :mod:`jaxdqn.model.fused_branches`; ``pallas`` where its kernel cannot be built is
    ``reference``, with one warning); ``shards``:
    the devices a batch is split over (M8's mean is batch-global; the rest is row-wise);
    ``matmul``: the matrix products' operand precision (``kernels.matmul``, f32 | bf16);
    ``bias_grad``: which layers take the GEMM bias gradient (``kernels.bias_grad``);
    ``acting_product``: acting's value/gate product in f32 or bf16 where the gate kernel reads
    it (``kernels.acting_product``; only ``act`` with ``acting`` and ``gated`` kernels);
    ``acting_activations``: ``act``'s network (trunk, VSN, branches) in f32 or with bfloat16
    operands and activations (``kernels.acting_activations``; needs ``acting_product="bf16"``;
    M12 and the statistics stay float32); ``learner_activations``: ``apply``'s network (the
    learner's online and target passes) in f32 or with bfloat16 operands and activations and
    float32 logits (``kernels.learner_activations``; differentiable, float32 parameter
    gradients; M7's statistics, M12 and the features returned stay float32); ``raw_heads`` =
    W > 0: ``apply`` also returns the heads' outputs before M6's combination, each of
    ``[v | A_0 | …]`` W ≥ N columns wide (:attr:`NetworkOutput.heads`, for
    ``kernels.loss_head=dueling`` with W = N, ``dueling_padded`` with W = N rounded up to a
    power of two) where the fused branches' heads compute them."""
    products(matmul, bias_grad)  # an unknown value fails here, not at the first trace
    if heads not in HEADS:
        raise ValueError(f"kernels.heads: {heads!r} is not one of {HEADS}")
    if statistics not in distribution.STATISTICS:
        raise ValueError(
            f"kernels.statistics: {statistics!r} is not one of {distribution.STATISTICS}"
        )
    if gated not in gated_lib.GATED:
        raise ValueError(f"kernels.gated: {gated!r} is not one of {gated_lib.GATED}")
    if acting not in ACTING:
        raise ValueError(f"kernels.acting: {acting!r} is not one of {ACTING}")
    if acting != "reference" and not fused:
        raise ValueError(f"kernels.acting: {acting!r} needs the fused branches (kernels.fused)")
    if acting_product not in ACTING_PRODUCTS:
        raise ValueError(
            f"kernels.acting_product: {acting_product!r} is not one of {ACTING_PRODUCTS}"
        )
    activations(acting_activations)  # an unknown value fails here, not at the first trace
    activations(learner_activations, "kernels.learner_activations")
    if acting_activations == "bf16" and acting_product != "bf16":
        raise ValueError(
            "kernels.acting_activations=bf16 feeds the branches a bfloat16 h_m: it needs "
            f"kernels.acting_product=bf16, got {acting_product!r}"
        )
    if acting == "pallas" and not acting_kernels_available(cfg, matmul == "bf16"):
        acting = "reference"
    net = Network(cfg, obs_dim, kan_backend, fused, heads, gated, acting_product=acting_product)
    act_net = None if acting == "reference" else net.clone(statistics=acting)
    net = net.clone(raw_heads=raw_heads)  # apply's pass only (acting reads statistics)
    sel = Selectivity()
    coord = make_coordination(cfg, shards)
    cell = make_xlstm(cfg)

    def init_params(key: Array) -> Params:
        k_main, k_sel, k_coord, k_xlstm = jax.random.split(key, 4)
        obs = jnp.zeros((1, obs_dim), jnp.float32)
        one = jnp.ones((1,), jnp.float32)
        main = net.init(k_main, obs, -one, one)["params"]
        aux: Params = {}
        if cfg.selectivity:
            aux["selectivity"] = sel.init(k_sel, jnp.zeros((1, cfg.sh2), jnp.float32))["params"]
        aux.update(coord.init(k_coord))
        return {"main": dict(main), "aux": aux, "xlstm": cell.init(k_xlstm)}

    def apply(
        params: Params, obs: Array, v_min: Array | float, delta_z: Array | float
    ) -> NetworkOutput:
        with products(matmul, bias_grad), activations(learner_activations):
            return _apply(params, obs, v_min, delta_z)

    def _inputs(obs: Array, v_min: Array | float, delta_z: Array | float):
        chex.assert_rank(obs, 2)
        chex.assert_axis_dimension(obs, 1, obs_dim)
        b = obs.shape[0]
        v_min = jnp.broadcast_to(jnp.asarray(v_min, obs.dtype), (b,))
        return v_min, jnp.broadcast_to(jnp.asarray(delta_z, obs.dtype), (b,))

    def _selectivity(params: Params, h: Array, obs: Array) -> Array:
        if cfg.selectivity:  # float32 whatever the network's activations
            with activations("f32"):
                return sel.apply({"params": params["aux"]["selectivity"]}, h)
        return jnp.ones(obs.shape[:1], obs.dtype)

    def _apply(
        params: Params, obs: Array, v_min: Array | float, delta_z: Array | float
    ) -> NetworkOutput:
        v_min, delta_z = _inputs(obs, v_min, delta_z)
        logits, h, h_m = net.apply({"params": params["main"]}, obs, v_min, delta_z)
        logits, heads = logits if isinstance(logits, tuple) else (logits, None)
        # bfloat16 under learner_activations: what leaves the network is float32
        h, h_m = h.astype(obs.dtype), h_m.astype(obs.dtype)
        vm, dz = v_min[:, None, None], delta_z[:, None, None]
        probs, q_mean, q_var, q_quant = distribution.statistics_of_logits(
            logits, vm, dz, statistics
        )
        return NetworkOutput(
            logits=logits,
            probs=probs,
            q_mean=q_mean,
            q_var=q_var,
            quantiles=q_quant,
            features=h_m,
            selectivity=_selectivity(params, h, obs),
            heads=heads,
        )

    def act(
        params: Params, obs: Array, v_min: Array | float, delta_z: Array | float
    ) -> ActingOutput:
        if act_net is None:  # the statistics of the full pass (XLA drops the rest)
            with products(matmul, bias_grad), activations(acting_activations):
                out = _apply(params, obs, v_min, delta_z)
            return ActingOutput(out.q_mean, out.q_var, out.quantiles, out.selectivity)
        with products(matmul, bias_grad):
            v_min, delta_z = _inputs(obs, v_min, delta_z)
            with activations(acting_activations):
                stats, h, _ = act_net.apply({"params": params["main"]}, obs, v_min, delta_z)
            # M12 reads h in float32 (XLA folds the widening into its product)
            return ActingOutput(*stats, _selectivity(params, h.astype(jnp.float32), obs))

    def coordinate(params: Params, q: Array) -> Coordinated:
        aux = params["aux"]
        with products(matmul, bias_grad):
            return coord.apply({k: aux[k] for k in _COORD_KEYS if k in aux}, q)

    return Model(
        cfg=cfg,
        obs_dim=obs_dim,
        init=init_params,
        apply=apply,
        act=act,
        coordinate=coordinate,
        xlstm=cell,
    )


def init(
    key: Array, cfg: ModelConfig, obs_dim: int, *, kan_backend: str = "auto", fused: bool = True
) -> tuple[Params, Model]:
    """``(params, model)``: a fresh parameter tree and the model's pure functions."""
    model = make_model(cfg, obs_dim, kan_backend=kan_backend, fused=fused)
    return model.init(key), model


def _label(path: tuple[Any, ...]) -> str:
    group = path[0].key
    if group == "main":
        return "branches" if str(path[1].key).startswith("branch_") else "trunk"
    if group in ("aux", "xlstm"):
        return group
    raise ValueError(f"param_labels: unexpected top-level parameter group {group!r}")


def param_labels(params: Params) -> Params:
    """Same-structure tree of labels ``"trunk"`` (trunk, VSN), ``"branches"`` (the four
    branches with their gates and heads), ``"aux"`` and ``"xlstm"`` for optax.multi_transform."""
    return jax.tree_util.tree_map_with_path(lambda p, _: _label(p), params)


def branch_mask(params: Params) -> Params:
    """Same-structure tree of bools: True on the four branches' parameters (O4 resets these)."""
    return jax.tree_util.tree_map_with_path(lambda p, _: _label(p) == "branches", params)


def param_count(params: Params) -> int:
    """Total number of scalars in a parameter tree."""
    return int(sum(x.size for x in jax.tree_util.tree_leaves(params)))
