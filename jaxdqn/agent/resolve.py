"""What a config means on this machine and this market, decided once: ``resolve(cfg, market,
shards) -> Resolved``.

Every rule that turns a setting into what the agent runs lives here, one function each, and
:func:`jaxdqn.agent.build.build_agent` hands the results to the factories:

* :func:`make_device_config`: one device's sizes when an agent is split over ``D`` devices;
* :func:`reward_units`: ``loss.reward_scale`` and the reward unit from the train split;
* :func:`in_q_units`: a threshold given in reward units (``acting.tau_floor``,
  ``loss.spread_max_gap``) as a Q value;
* :func:`replay_weighting`: ``replay.prioritised`` off = α 0 and unit IS weights;
* :func:`fused_kernels`: ``kernels.fused`` on this backend;
* :func:`head_kernels`: ``kernels.heads`` (nothing to pick without the fused branches);
* :func:`statistics_kernels`: ``kernels.statistics``;
* :func:`loss_head_kernels`: ``kernels.loss_head``;
* :func:`target_head_kernels`: ``kernels.target_head``;
* :func:`triton_kernels`: whether ``auto`` may pick a Triton kernel (a GPU, the fused branches);
* :func:`gated_kernels`: ``kernels.gated`` (nothing to pick without the fused branches);
* :func:`acting_kernels`: ``kernels.acting`` (likewise);
* :func:`acting_product`: ``kernels.acting_product`` (only with the kernels that read it);
* :func:`acting_activations`: ``kernels.acting_activations`` (only with that product);
* :func:`projection_backend` and :func:`projection_fallback`: P1's implementation under
  ``train.deterministic`` (D1) and what runs where the Pallas kernel cannot be built;
* :func:`resolve_kernels`: every kernel rule's answer, by name (a run's provenance).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from jaxdqn.config import Config, ConfigError, ReplayConfig
from jaxdqn.model.gated import GATE_KERNELS
from jaxdqn.shards import ONE_DEVICE, Shards

__all__ = [
    "Projection",
    "Resolved",
    "acting_activations",
    "acting_kernels",
    "acting_product",
    "fused_kernels",
    "gated_kernels",
    "in_q_units",
    "loss_head_kernels",
    "make_device_config",
    "projection_backend",
    "projection_fallback",
    "replay_weighting",
    "resolve",
    "resolve_kernels",
    "reward_units",
    "target_head_kernels",
    "triton_kernels",
]


class Projection(NamedTuple):
    """P1 as resolved: the backend and what runs where the Pallas kernel cannot be built."""

    backend: str
    fallback: str


class Resolved(NamedTuple):
    """Every decision :func:`resolve` made for one agent.

    Attributes:
      cfg: the config with one device's sizes (:func:`make_device_config`).
      learning_starts: the global replay size before the first update.
      reward_scale, reward_unit: :func:`reward_units`.
      temperature_floor: ``acting.tau_floor`` in Q units (A1, L2).
      spread_max_gap: ``loss.spread_max_gap`` in Q units (L3's bound, M14's gap cap).
      gamma_n: the bootstrap discount γⁿ (L7, with the n-step returns' γ).
      replay_alpha, importance_weights: :func:`replay_weighting`.
      fused: :func:`fused_kernels`.
      heads: :func:`head_kernels`.
      statistics: :func:`statistics_kernels`.
      gated: :func:`gated_kernels`.
      acting: :func:`acting_kernels`.
      acting_product: :func:`acting_product`.
      acting_activations: :func:`acting_activations`.
      learner_activations: ``kernels.learner_activations`` (no rule: it applies everywhere).
      loss_head: :func:`loss_head_kernels`.
      target_head: :func:`target_head_kernels`.
      projection: :class:`Projection`.
    """

    cfg: Config
    learning_starts: int
    reward_scale: float
    reward_unit: float
    temperature_floor: float
    spread_max_gap: float
    gamma_n: float
    replay_alpha: float
    importance_weights: bool
    fused: bool
    heads: str
    statistics: str
    gated: str
    acting: str
    acting_product: str
    acting_activations: str
    learner_activations: str
    loss_head: str
    target_head: str
    projection: Projection


def make_device_config(cfg: Config, count: int) -> Config:
    """``cfg`` with one device's share of an agent split over ``count`` devices: E/D
    environments, C/D replay slots, B/D rows per update (``learning_starts`` stays global).

    Raises:
      ConfigError: a size that ``count`` does not divide.
    """
    if count == 1:
        return cfg
    sizes = {
        "acting.num_envs": cfg.acting.num_envs,
        "replay.batch_size": cfg.replay.batch_size,
        "replay.capacity": cfg.replay.capacity,
    }
    bad = [f"{k}={v}" for k, v in sizes.items() if v % count]
    if bad:
        raise ConfigError(
            f"train.mesh: one agent over {count} devices needs sizes divisible by {count}; "
            f"got {', '.join(bad)}"
        )
    acting_cfg = dataclasses.replace(cfg.acting, num_envs=cfg.acting.num_envs // count)
    replay_cfg = dataclasses.replace(
        cfg.replay,
        batch_size=cfg.replay.batch_size // count,
        capacity=cfg.replay.capacity // count,
        # (what one shard holds when the global threshold is reached; the agent compares the
        # global size with the global threshold)
        learning_starts=-(-cfg.replay.learning_starts // count),
    )
    return dataclasses.replace(cfg, acting=acting_cfg, replay=replay_cfg)


def reward_units(
    reward_scale: float | str, close: np.ndarray | Sequence[np.ndarray]
) -> tuple[float, float]:
    """``(reward_scale, reward_unit)`` for ``loss.reward_scale`` and the train split's closes
    (one array, or a panel's one array per instrument).

    σ = std(ddof=1) of the log returns per bar log(close[t+1]/close[t]) of the train split (a
    panel's: every instrument's returns pooled, none across two instruments).
    ``auto``: reward_scale = 1/σ, so Q is in units of one day's return std and the reward unit
    is 1; a number c: reward_scale = c and the reward unit c·σ.

    Raises:
      ConfigError: σ is 0 or not finite (a constant price series).
    """
    closes = [close] if isinstance(close, np.ndarray) else list(close)
    r = np.concatenate([np.diff(np.log(np.asarray(c, dtype=np.float64))) for c in closes])
    sigma = float(np.std(r, ddof=1)) if r.size > 1 else float("nan")
    if not (np.isfinite(sigma) and sigma > 0):
        raise ConfigError(
            "loss.reward_scale: the train split's log returns have no variance "
            f"(std {sigma}); auto cannot scale them"
        )
    if reward_scale == "auto":
        return 1.0 / sigma, 1.0
    return float(reward_scale), float(reward_scale) * sigma


def in_q_units(value: float, reward_unit: float) -> float:
    """A threshold given in reward units (the std of one bar's return) as a Q value."""
    return value * reward_unit


def replay_weighting(cfg: ReplayConfig) -> tuple[float, bool]:
    """``(α, IS weights on)`` of L8: ``replay.prioritised`` off samples uniformly (α = 0) and
    weighs every sample 1."""
    if not cfg.prioritised:
        return 0.0, False
    return cfg.priority_alpha, True


def fused_kernels(setting: str) -> bool:
    """``kernels.fused`` resolved: ``fused`` / ``reference``, or ``auto`` = fused unless JAX
    runs on the CPU (``jax.default_backend()``)."""
    if setting == "auto":
        return jax.default_backend() != "cpu"
    return setting == "fused"


def head_kernels(setting: str, fused_setting: str) -> str:
    """``kernels.heads`` resolved against ``kernels.fused`` (its setting, not its resolution):
    ``auto`` = ``blockdiag`` (the measured default; the others are switches to measure against
    it, bench/RESULTS.md). Where ``kernels.fused=auto`` resolves to the per-branch modules (the
    CPU), each head is its own product already and every setting resolves to ``blockdiag``
    (the setting has nothing to pick; so a run trained on a GPU with another setting is
    evaluated, predicted and exported on the CPU as it stands).

    Raises:
      ConfigError: ``split``, ``pallas`` or ``interpret`` with ``kernels.fused=reference``.
    """
    return _fused_setting("heads", setting, "blockdiag", fused_setting)


def _fused_setting(name: str, setting: str, default: str, fused_setting: str) -> str:
    """``kernels.<name>``, a choice only the fused branches make: ``default`` for ``auto`` or
    without them, an error for another choice under ``kernels.fused=reference``."""
    if setting == "auto" or not fused_kernels(fused_setting):
        if setting not in ("auto", default) and fused_setting == "reference":
            raise ConfigError(
                f"kernels.{name}={setting} needs the fused branches; kernels.fused=reference "
                "computes one module per branch"
            )
        return default
    return setting


def triton_kernels(fused_setting: str) -> bool:
    """Whether a kernel setting's ``auto`` may pick a Triton kernel: JAX runs on a GPU
    (``jax.default_backend()``) and ``kernels.fused`` resolves to the fused branches, the only
    form those kernels compute."""
    return fused_kernels(fused_setting) and jax.default_backend() == "gpu"


def gated_kernels(setting: str, fused_setting: str, acting_setting: str = "auto") -> str:
    """``kernels.gated`` resolved against ``kernels.fused`` (its setting, not its resolution)
    and ``kernels.acting``: ``auto`` = ``gate`` where acting resolves to its ``pallas`` kernel
    (:func:`acting_kernels`; the pair was measured and learning-checked together: acting
    2.5-3.3x faster at 65,536 rows and a 16-member population's iteration -36.5 % on an H100,
    B 94.0 / 96.1 % of the oracle on seeds 0-4 / 5-9, bench/RESULTS.md), else ``reference``
    (``pallas``'s Triton GEMM lost alone and made acting slower, 0.85x on an H100). Where
    ``kernels.fused=auto`` resolves to the per-branch modules (the CPU) every setting
    resolves to ``reference``, as for :func:`head_kernels`.

    Raises:
      ConfigError: any kernel setting with ``kernels.fused=reference``.
    """
    paired = setting == "auto" and acting_kernels(acting_setting, fused_setting) == "pallas"
    return _fused_setting("gated", setting, "gate" if paired else "reference", fused_setting)


def acting_kernels(setting: str, fused_setting: str) -> str:
    """``kernels.acting`` resolved against ``kernels.fused`` (its setting, not its resolution):
    ``auto`` = ``pallas`` on a GPU with the fused branches (:func:`triton_kernels`; the heads
    per action with M7 in their epilogue, with ``kernels.gated`` ``auto`` = ``gate`` beside
    it, measured and learning-checked as that pair, see :func:`gated_kernels`), else
    ``reference``; ``reference`` without the fused branches, as for :func:`head_kernels`.

    Raises:
      ConfigError: ``pallas`` or ``interpret`` with ``kernels.fused=reference``.
    """
    default = "pallas" if setting == "auto" and triton_kernels(fused_setting) else "reference"
    return _fused_setting("acting", setting, default, fused_setting)


def acting_product(setting: str, acting_setting: str, gated_setting: str) -> str:
    """``kernels.acting_product``, checked against the settings (not the resolutions) of
    ``kernels.acting`` and ``kernels.gated``: ``bf16`` changes only the product that acting's
    gate kernel reads, so it needs both kernels asked for, by name or by ``auto`` (on a
    machine where they resolve to the reference, as the CPU's per-branch modules, it then
    changes nothing).

    Raises:
      ConfigError: ``bf16`` without ``kernels.acting`` auto | pallas | interpret and
        ``kernels.gated`` auto | gate | gate_interpret | gate_grad | gate_grad_interpret.
    """
    if setting == "bf16" and (
        acting_setting not in ("auto", "pallas", "interpret")
        or gated_setting not in ("auto", *GATE_KERNELS)
    ):
        raise ConfigError(
            "kernels.acting_product=bf16 is the product acting's gate kernel reads: it needs "
            "kernels.acting=auto, pallas or interpret and kernels.gated=auto, "
            f"{', '.join(GATE_KERNELS)}, got kernels.acting={acting_setting} and "
            f"kernels.gated={gated_setting}"
        )
    return setting


def acting_activations(setting: str, product_setting: str) -> str:
    """``kernels.acting_activations``, checked against ``kernels.acting_product``: ``bf16``
    hands the branches a bfloat16 ``h_m``, which only the bfloat16 product reads.

    Raises:
      ConfigError: ``bf16`` without ``kernels.acting_product=bf16``.
    """
    if setting == "bf16" and product_setting != "bf16":
        raise ConfigError(
            "kernels.acting_activations=bf16 feeds acting's branches bfloat16 features: it "
            f"needs kernels.acting_product=bf16, got kernels.acting_product={product_setting}"
        )
    return setting


def statistics_kernels(setting: str) -> str:
    """``kernels.statistics`` resolved: ``auto`` = ``reference`` (the measured default; the
    Pallas kernel is a switch to measure against it)."""
    return "reference" if setting == "auto" else setting


def loss_head_kernels(setting: str) -> str:
    """``kernels.loss_head`` resolved: ``auto`` = ``reference`` (the jnp passes every run has
    used; the kernels are a switch to measure against them)."""
    return "reference" if setting == "auto" else setting


def target_head_kernels(setting: str) -> str:
    """``kernels.target_head`` resolved: ``auto`` = ``reference`` (the jnp passes and P1 as
    ``kernels.projection`` says; the kernel is a switch to measure against them)."""
    return "reference" if setting == "auto" else setting


def projection_backend(setting: str, deterministic: bool) -> str:
    """``kernels.projection`` resolved: ``auto`` = ``pallas`` (a Triton pull kernel, the hat
    kernel at ≤ 64 padded atoms: one writer per output; the jnp ``dense`` pull where it cannot
    be built) on accelerators under
    ``train.deterministic``, else ``reference`` (the scatter-add, the fastest at the learner's
    16,384 rows: H100 20.0 µs vs the hat kernel's 23.9, H200 22 vs the window kernel's 44,
    dense 85 µs; on the CPU it runs in a fixed order, so it is deterministic there).

    Raises:
      ConfigError: ``reference`` asked for with ``train.deterministic`` on an accelerator.
    """
    accelerator = jax.default_backend() != "cpu"
    if setting == "auto":
        return "pallas" if deterministic and accelerator else "reference"
    if setting == "reference" and deterministic and accelerator:
        raise ConfigError(
            "kernels.projection=reference: its scatter-adds land in a varying order on "
            f"{jax.default_backend()} devices; with train.deterministic use auto, dense or pallas"
        )
    return setting


def projection_fallback(backend: str) -> str:
    """What runs where the Pallas kernel cannot be built: a pull backend falls back to the
    other pull (``dense``: no scatter), never to the scatter-add, so a deterministic choice
    stays deterministic."""
    return "dense" if backend in ("pallas", "dense", "hat", "window") else "reference"


def resolve_kernels(cfg: Config) -> dict[str, str]:
    """What each kernel setting runs on this machine, by the rules above: ``fused``
    (``fused`` | ``per_branch``), ``heads``, ``statistics``, ``gated``, ``acting``,
    ``acting_product``, ``acting_activations``, ``learner_activations`` and P1's
    ``projection``. A run records them
    in its provenance (:mod:`jaxdqn.program.records.provenance`): ``auto`` runs other
    kernels on a GPU than on the CPU.

    Raises:
      ConfigError: as the rules do.
    """
    k = cfg.kernels
    return {
        "fused": "fused" if fused_kernels(k.fused) else "per_branch",
        "heads": head_kernels(k.heads, k.fused),
        "statistics": statistics_kernels(k.statistics),
        "gated": gated_kernels(k.gated, k.fused, k.acting),
        "acting": acting_kernels(k.acting, k.fused),
        "acting_product": acting_product(k.acting_product, k.acting, k.gated),
        "acting_activations": acting_activations(k.acting_activations, k.acting_product),
        "learner_activations": k.learner_activations,
        "loss_head": loss_head_kernels(k.loss_head),
        "target_head": target_head_kernels(k.target_head),
        "projection": projection_backend(k.projection, cfg.train.deterministic),
    }


def resolve(cfg: Config, market: Any, shards: Shards = ONE_DEVICE) -> Resolved:
    """Every decision for ``cfg`` on ``market`` (its train split) with the agent split over
    ``shards``; each by the one function above that owns its rule."""
    device_cfg = make_device_config(cfg, shards.count)
    scale, unit = reward_units(cfg.loss.reward_scale, market.train_closes())
    alpha, weighted = replay_weighting(cfg.replay)
    kernels = resolve_kernels(cfg)  # the rest are Resolved's fields of the same names
    fused, backend = kernels.pop("fused") == "fused", kernels.pop("projection")
    return Resolved(
        cfg=device_cfg,
        learning_starts=cfg.replay.learning_starts,
        reward_scale=scale,
        reward_unit=unit,
        temperature_floor=in_q_units(cfg.acting.tau_floor, unit),
        spread_max_gap=in_q_units(cfg.loss.spread_max_gap, unit),
        gamma_n=cfg.loss.gamma**cfg.loss.n_step,
        replay_alpha=alpha,
        importance_weights=weighted,
        fused=fused,
        projection=Projection(backend, projection_fallback(backend)),
        **kernels,
    )
