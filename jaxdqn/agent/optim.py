"""Optimisers and training-dynamics helpers (O1–O4) as pure functions over optax state.

O1: one optax transformation over the whole parameter tree,

    chain(
        masked(clip_by_global_norm(clip_norm), main),         # one norm over trunk + branches
        multi_transform({
            "trunk":    inject_hyperparams(adam)(lr),          # main Adam, injected lr
            "branches": inject_hyperparams(adam)(lr),          # same, its own moments and count
            "aux":      adam(aux_lr),                          # denoiser, selectivity, coordination
            "xlstm":    sgd(xlstm_lr),
        }, labels),
    )

where ``main`` = the ``trunk`` and ``branches`` partitions. With ``flat`` (``optim.flat``)
each partition's transformation runs on its leaves raveled into one vector
(``optax.flatten``): the same elementwise Adam/SGD arithmetic, so the same updates (to float
rounding: XLA vectorises a long vector differently), in a few large kernels instead of some per
leaf; its moments are then one vector per partition (a checkpoint holds one layout or the
other), and the clip's norm is summed over one raveled vector of the main gradients
(:func:`clip_by_joint_norm`: one reduction, not one per leaf). The global-norm clip is taken
over the main parameters jointly (as if they were one Adam), before the partitions' updates;
the auxiliary partitions are not clipped. ``branches`` has its own Adam state so that O4 can
reset its moments and step count without touching the trunk.

O2 (SGDR, Loshchilov & Hutter 2017): ``lr(e) = base · (floor + (1 − floor) · ½(1 + cos(π ·
(e mod T) / T)))`` — cosine from ``base`` at the start of a cycle towards ``floor · base`` at its
end, restarting at ``base`` every ``T`` epochs. :func:`set_learning_rate` writes a float32 array
into the injected hyperparameters of both main partitions, so a jitted update sees the same
abstract state (no recompilation).

O3: :func:`scale_adam_moments` multiplies ``mu`` and ``nu`` of the main Adam states by a factor
(0.5 at every SGDR restart). O4: :func:`reset_branch_moments` zeroes ``mu``, ``nu`` and the step
counts of the ``branches`` partition only, so its next update is a fresh Adam's first step.

The helpers find the partitions by traversing the state for optax's ``MultiTransformState`` and,
inside a partition, the ``ScaleByAdamState`` / injected-hyperparameter states by type — never by
fixed tuple indices — so they survive changes of the surrounding chain.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax

__all__ = [
    "MAIN",
    "PARTITIONS",
    "clip_by_joint_norm",
    "get_learning_rate",
    "is_restart",
    "label_by_path",
    "make_optimizer",
    "reset_branch_moments",
    "scale_adam_moments",
    "set_learning_rate",
    "sgdr_learning_rate",
]

PyTree = Any
PARTITIONS = ("trunk", "branches", "aux", "xlstm")
MAIN = ("trunk", "branches")
_INJECTED = (optax.InjectStatefulHyperparamsState, optax.InjectHyperparamsState)


def label_by_path(
    rules: Sequence[tuple[str, str]], default: str = "trunk"
) -> Callable[[PyTree], PyTree]:
    """A labelling function for :func:`make_optimizer` from regular expressions on key paths.

    Each parameter's path is joined with ``/`` (e.g. ``"main/branch_direction/kernel"``); the
    label of the first rule whose pattern ``re.search``-matches it is used, else ``default``.

    Args:
      rules: ``(pattern, label)`` pairs, label in :data:`PARTITIONS`.
      default: label of unmatched parameters.

    Returns:
      ``params -> label tree`` (same structure, a string per leaf).
    """
    compiled = [(re.compile(pattern), label) for pattern, label in rules]
    for _, label in rules:
        if label not in PARTITIONS:
            raise ValueError(f"optimiser label {label!r} is not one of {PARTITIONS}")

    def labels(params: PyTree) -> PyTree:
        def label(path, _):
            name = jax.tree_util.keystr(path, simple=True, separator="/")
            return next((lab for pattern, lab in compiled if pattern.search(name)), default)

        return jax.tree_util.tree_map_with_path(label, params)

    return labels


def make_optimizer(
    labels: PyTree | Callable[[PyTree], PyTree],
    *,
    lr: float,
    clip_norm: float,
    aux_lr: float = 1e-4,
    xlstm_lr: float = 1e-4,
    flat: bool = False,
) -> optax.GradientTransformation:
    """O1: the single optax transformation over the parameter tree (see the module docstring).

    Args:
      labels: a tree of partition names matching the parameters, or a function
        ``params -> label tree`` (e.g. :func:`label_by_path`); names in :data:`PARTITIONS`.
      lr: initial learning rate of the main (trunk and branches) Adam.
      clip_norm: global-norm clip of the main gradients (taken jointly over trunk + branches).
      aux_lr: Adam learning rate of the ``aux`` partition.
      xlstm_lr: SGD learning rate of the ``xlstm`` partition.
      flat: run each partition's transformation over one raveled vector of its leaves.
    """

    def is_main(label_tree: PyTree) -> PyTree:
        return jax.tree.map(lambda label: label in MAIN, label_tree)

    main_mask = (lambda params: is_main(labels(params))) if callable(labels) else is_main(labels)
    main_adam = optax.inject_hyperparams(optax.adam, hyperparam_dtype=jnp.float32)
    lr32 = jnp.asarray(lr, jnp.float32)
    parts = {
        "trunk": main_adam(learning_rate=lr32),
        "branches": main_adam(learning_rate=lr32),
        "aux": optax.adam(aux_lr),
        "xlstm": optax.sgd(xlstm_lr),
    }
    clip = optax.clip_by_global_norm(clip_norm)
    if flat:
        parts = {label: _flatten(tx) for label, tx in parts.items()}
        clip = clip_by_joint_norm(clip_norm)
    return optax.chain(
        optax.masked(clip, main_mask),
        optax.multi_transform(parts, labels),
    )


def _flatten(tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """``optax.flatten(tx)``, or ``tx`` itself on a partition with no parameters (a component
    that is off leaves its partition empty, and optax cannot ravel an empty tree). Whether a
    tree has leaves is static, so the choice is made when the update is traced."""
    flat = optax.flatten(tx)

    def init_fn(params):
        return (flat if jax.tree.leaves(params) else tx).init(params)

    def update_fn(updates, state, params=None):
        return (flat if jax.tree.leaves(updates) else tx).update(updates, state, params)

    return optax.GradientTransformation(init_fn, update_fn)


def clip_by_joint_norm(max_norm: float) -> optax.GradientTransformation:
    """``optax.clip_by_global_norm`` with the norm taken over one raveled vector of the leaves.

    ``‖g‖ = sqrt(Σ_i g_i²)`` over the concatenation of every leaf (``[N]``, N the leaves' total
    size), then each leaf ``t ↦ t`` if ``‖g‖ < max_norm`` else ``(t / ‖g‖) · max_norm``, as
    optax does. The same norm to float rounding (one summation order instead of per-leaf sums
    added up), but one reduction instead of one per leaf: on a GPU each per-leaf sum is its own
    ~2.4 µs kernel (36, one per leaf, in the all-off update: bench/RESULTS.md). Used with
    ``flat``.
    """

    def update_fn(updates, state, params=None):
        del params
        leaves = jax.tree.leaves(updates)
        if not leaves:
            return updates, state
        joint = jnp.concatenate([jnp.ravel(t) for t in leaves])
        g_norm = jnp.sqrt(jnp.sum(jnp.square(joint)))
        trigger = g_norm < max_norm

        def clip(t):
            return jax.lax.select(trigger, t, (t / g_norm.astype(t.dtype)) * max_norm)

        return jax.tree.map(clip, updates), state

    return optax.GradientTransformation(optax.init_empty_state, update_fn)


def _map_type(tree: PyTree, cls: type | tuple[type, ...], fn: Callable[[Any], Any]) -> PyTree:
    """Apply ``fn`` to every node of type ``cls`` in ``tree``; everything else is unchanged."""
    return jax.tree.map(
        lambda node: fn(node) if isinstance(node, cls) else node,
        tree,
        is_leaf=lambda node: isinstance(node, cls),
    )


def _map_partitions(
    opt_state: PyTree, labels: Sequence[str], fn: Callable[[PyTree], PyTree]
) -> PyTree:
    """Apply ``fn`` to the state of each named partition of the (nested) multi_transform."""
    found = []

    def visit(node: optax.MultiTransformState) -> optax.MultiTransformState:
        inner = dict(node.inner_states)
        missing = [label for label in labels if label not in inner]
        if missing:
            raise ValueError(f"optimiser state has no partition {missing[0]!r}")
        for label in labels:
            inner[label] = fn(inner[label])
        found.append(True)
        return node._replace(inner_states=inner)

    new_state = _map_type(opt_state, optax.MultiTransformState, visit)
    if not found:
        raise ValueError("optimiser state holds no multi_transform state (use make_optimizer)")
    return new_state


def set_learning_rate(opt_state: PyTree, lr: Any) -> PyTree:
    """O2: write ``lr`` (as a float32 array) into the trunk's and branches' injected lr.

    The abstract value of the state (shape, dtype, weak type) is unchanged, so a jitted update
    taking the state as an argument is not retraced.
    """
    lr = jnp.asarray(lr, jnp.float32)

    def write(state):
        hyper = dict(state.hyperparams)
        # A buffer of its own per partition: a train state that is donated to a jitted
        # iteration cannot hold one buffer twice.
        hyper["learning_rate"] = jnp.array(lr, copy=True)
        return state._replace(hyperparams=hyper)

    return _map_partitions(opt_state, MAIN, lambda part: _map_type(part, _INJECTED, write))


def get_learning_rate(opt_state: PyTree) -> jax.Array:
    """The trunk's injected learning rate (float32 ``[]``; the branches' is kept equal)."""
    rates = []

    def read(state):
        rates.append(state.hyperparams["learning_rate"])
        return state

    _map_partitions(opt_state, ("trunk",), lambda part: _map_type(part, _INJECTED, read))
    return rates[0]


def sgdr_learning_rate(epoch: int, base: float, period: int = 20, floor: float = 0.1) -> float:
    """O2: SGDR cosine learning rate of ``epoch`` (host-side, a Python float).

    ``base · (floor + (1 − floor) · ½(1 + cos(π · (epoch mod period) / period)))``.
    """
    phase = (epoch % period) / period
    return base * (floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * phase)))


def is_restart(epoch: int, period: int = 20) -> bool:
    """Whether ``epoch`` starts a new SGDR cycle (not the first): where O3 applies."""
    return epoch > 0 and epoch % period == 0


def scale_adam_moments(opt_state: PyTree, factor: Any) -> PyTree:
    """O3: multiply ``mu`` and ``nu`` of the trunk's and branches' Adam states by ``factor``."""

    def scale(state: optax.ScaleByAdamState) -> optax.ScaleByAdamState:
        mul = lambda x: x * jnp.asarray(factor, x.dtype)
        return state._replace(mu=jax.tree.map(mul, state.mu), nu=jax.tree.map(mul, state.nu))

    return _map_partitions(
        opt_state, MAIN, lambda part: _map_type(part, optax.ScaleByAdamState, scale)
    )


def reset_branch_moments(opt_state: PyTree) -> PyTree:
    """O4: zero ``mu``, ``nu`` and the step counts of the ``branches`` partition only.

    The branches' next update is then exactly a fresh Adam's first step (bias correction
    restarts at count 1); their learning rate is kept.
    """

    def reset_adam(state: optax.ScaleByAdamState) -> optax.ScaleByAdamState:
        return optax.ScaleByAdamState(
            count=jnp.zeros_like(state.count),
            mu=jax.tree.map(jnp.zeros_like, state.mu),
            nu=jax.tree.map(jnp.zeros_like, state.nu),
        )

    def reset(part: PyTree) -> PyTree:
        part = _map_type(part, optax.ScaleByAdamState, reset_adam)
        return _map_type(part, _INJECTED, lambda s: s._replace(count=jnp.zeros_like(s.count)))

    return _map_partitions(opt_state, ("branches",), reset)
