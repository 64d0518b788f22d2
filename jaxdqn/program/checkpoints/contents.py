"""What a checkpoint stores of the train state, and the integrity checks made on restore.

The state pytree is flattened to its leaves in ``jax.tree_util`` order. Orbax stores them as a
flat dict by leaf index, ``{"000000": leaf, "000001": leaf, ...}``, without the zero-size
leaves (orbax refuses them; they hold no data and are recreated from the target), so the
on-disk layout does not depend on how each pytree node type flattens. Beside it the ``meta``
item describes every leaf::

    {"format": 1, "metric": float,
     "leaves": [[path, shape, dtype, crc32 | null], ...]}   # one entry per leaf, in order

``path`` is ``jax.tree_util.keystr`` of the leaf, ``shape`` a list of ints, ``dtype`` the numpy
name, ``crc32`` the CRC-32 of the leaf's C-order bytes (null when saved without verification).

On restore :func:`check_meta` compares the description with the target's leaves (count, shape,
dtype: a mismatch is a user error, :class:`CheckpointError`) and :func:`check_crc` the restored
bytes with the recorded CRC-32 (a mismatch is corruption, :class:`Corrupt`).

State leaves must be arrays: ``jax.Array`` (any sharding), NumPy arrays or NumPy scalars,
including 0-d arrays, ``bool`` and ``uint32`` PRNG keys from ``jax.random.PRNGKey``. Typed key
arrays (``jax.random.key``) are rejected: store ``jax.random.key_data(k)`` instead.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

__all__ = [
    "FORMAT",
    "CheckpointError",
    "Corrupt",
    "abstract",
    "check_crc",
    "check_meta",
    "crc32",
    "flat",
    "leaves",
    "spec",
    "unflat",
]

PyTree = Any
Spec = tuple[list[int], str]
FORMAT = 1


class CheckpointError(Exception):
    """No restorable checkpoint, a target that does not match, or an invalid save request."""


class Corrupt(Exception):
    """A step's files cannot be read back as saved."""


def leaves(tree: PyTree, what: str) -> tuple[list[str], list[Any]]:
    """The ``(paths, leaves)`` of ``tree``; ``what`` ("state" or "target") names it in errors.

    A target may also hold ``jax.ShapeDtypeStruct`` leaves.

    Raises:
      CheckpointError: a typed PRNG key array or a leaf that is not an array.
    """
    flat_leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    kinds = (jax.Array, np.ndarray, np.generic)
    if what == "target":
        kinds += (jax.ShapeDtypeStruct,)
    paths, out = [], []
    for path, x in flat_leaves:
        name = jax.tree_util.keystr(path) or "<root>"
        dtype = getattr(x, "dtype", None)
        if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
            raise CheckpointError(
                f"{what} leaf {name} is a typed PRNG key array; store jax.random.key_data(k)"
            )
        if not isinstance(x, kinds):
            raise CheckpointError(
                f"{what} leaf {name} is a {type(x).__name__}; checkpoints hold arrays only"
            )
        paths.append(name)
        out.append(x)
    return paths, out


def spec(x: Any) -> Spec:
    """``(shape as a list, numpy dtype name)`` of a leaf."""
    return [int(d) for d in x.shape], np.dtype(x.dtype).name


def _describe(s: Sequence[Any]) -> str:
    shape, dtype = s
    return f"{dtype}[{','.join(str(d) for d in shape)}]"


def crc32(a: np.ndarray) -> int:
    """CRC-32 of the array's bytes in C order."""
    return zlib.crc32(np.ascontiguousarray(a).reshape(-1).view(np.uint8))


def _key(i: int) -> str:
    return f"{i:06d}"


def flat(xs: Sequence[Any]) -> dict[str, Any]:
    """The leaves orbax stores: a flat dict by leaf index, without zero-size leaves."""
    return {_key(i): x for i, x in enumerate(xs) if math.prod(x.shape) > 0}


def unflat(stored: dict[str, Any], abstract_leaves: Sequence[Any]) -> list[Any]:
    """Inverse of :func:`flat` given the target's abstract leaves (zero-size leaves recreated
    with the target's sharding)."""
    out = []
    for i, a in enumerate(abstract_leaves):
        if math.prod(a.shape) > 0:
            out.append(stored[_key(i)])
        elif isinstance(a, jax.ShapeDtypeStruct):
            out.append(jax.device_put(np.zeros(a.shape, a.dtype), a.sharding))
        else:
            out.append(np.zeros(a.shape, a.dtype))
    return out


def abstract(x: Any) -> Any:
    """The restore target of a leaf: a ``ShapeDtypeStruct`` with the leaf's sharding (the
    default device when it has none), or a NumPy array for a NumPy leaf."""
    if isinstance(x, jax.ShapeDtypeStruct):
        if getattr(x, "sharding", None) is None:
            device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device)
        return x
    if isinstance(x, jax.Array):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
    return np.asarray(x)


def meta(paths: list[str], xs: list[Any], metric: float, verify: bool) -> dict[str, Any]:
    """The ``meta`` item of a save (CRC-32s only with ``verify``: one device-to-host copy)."""
    specs = [spec(x) for x in xs]
    # Under jax.distributed no process holds every shard: no CRC there (orbax's own checks).
    verify = verify and all(getattr(x, "is_fully_addressable", True) for x in xs)
    crcs = [crc32(np.asarray(a)) for a in jax.device_get(xs)] if verify else [None] * len(xs)
    return {
        "format": FORMAT,
        "metric": metric,
        "leaves": [
            [p, shape, dtype, crc]
            for p, (shape, dtype), crc in zip(paths, specs, crcs, strict=True)
        ],
    }


def check_meta(
    saved_meta: Any, step: int, directory: Path, paths: list[str], specs: list[Spec]
) -> list[Any]:
    """The recorded CRC-32s, once ``saved_meta`` is checked against the target's leaves.

    Args:
      saved_meta: the ``meta`` item as read.
      step, directory: the checkpoint, named in errors.
      paths, specs: the target's leaf paths and :func:`spec`s.

    Raises:
      Corrupt: ``saved_meta`` is not a checkpoint description.
      CheckpointError: a different number of leaves, shape or dtype.
    """
    if (
        not isinstance(saved_meta, dict)
        or saved_meta.get("format") != FORMAT
        or not isinstance(saved_meta.get("leaves"), list)
        or not all(isinstance(r, list) and len(r) == 4 for r in saved_meta["leaves"])
    ):
        raise Corrupt("meta item is not a checkpoint description")
    saved = saved_meta["leaves"]
    if len(saved) != len(specs):
        raise CheckpointError(
            f"checkpoint step {step} in {directory} has {len(saved)} state leaves, "
            f"the target has {len(specs)} (different config or code?)"
        )
    for path, s, (saved_path, shape, dtype, _) in zip(paths, specs, saved, strict=True):
        if [list(s[0]), s[1]] != [shape, dtype]:
            raise CheckpointError(
                f"checkpoint step {step} does not match the target at {path}: saved "
                f"{_describe((shape, dtype))} (as {saved_path}), target {_describe(s)}"
            )
    return [r[3] for r in saved]


def check_crc(values: list[Any], paths: list[str], crcs: list[Any]) -> None:
    """Compare restored leaves with their recorded CRC-32s (None: not recorded).

    Raises:
      Corrupt: a leaf whose bytes differ from those saved.
    """
    if all(crc is None for crc in crcs):
        return
    values = jax.device_get(values)
    for path, value, crc in zip(paths, values, crcs, strict=True):
        if crc is not None and crc32(np.asarray(value)) != crc:
            raise Corrupt(f"leaf {path} does not match its checksum")
