"""TensorBoard event files of the per-epoch log (written without TensorFlow).

Every numeric scalar of an epoch record becomes a scalar summary at step = epoch; each element
of a short array (at most :data:`MAX_TB_ELEMENTS` entries) becomes ``name/i`` (``name/i/j`` for
2-D), bools are 0/1, strings and ``None`` are skipped. With ``num_seeds = S > 1`` a value whose
leading axis has length S is written to a run of its own per seed, ``tb/seed{s}/`` (TensorBoard
overlays seeds under one tag), the others to ``tb/``.

Two writer packages are supported, neither needing TensorFlow: ``tensorboardX`` and
``tensorboard`` (their protos and CRC-32C, pure python). The records are written synchronously
here. A new event file may start with a ``SessionLog.START`` at a purge step, so TensorBoard
hides the stale events of an abandoned future (after a truncation of the log, on resuming).
"""

from __future__ import annotations

import importlib
import os
import socket
import struct
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from jaxdqn.program.records.formats import numeric

__all__ = [
    "BACKEND_MODULES",
    "MAX_TB_ELEMENTS",
    "TB_DIR",
    "TensorBoard",
    "find_backend",
    "tb_scalars",
]

TB_DIR = "tb"
MAX_TB_ELEMENTS = 64
"""Arrays with more elements than this are kept in metrics.jsonl but not sent to TensorBoard."""


class Backend(NamedTuple):
    """One writer package: its name, masked CRC-32C and the Event and Summary protos."""

    name: str
    masked_crc32c: Callable[[bytes], int]
    event_pb2: ModuleType
    summary_pb2: ModuleType


BACKEND_MODULES = {
    "tensorboardX": (
        "tensorboardX.record_writer",
        "tensorboardX.proto.event_pb2",
        "tensorboardX.proto.summary_pb2",
    ),
    "tensorboard": (
        "tensorboard.compat.tensorflow_stub.pywrap_tensorflow",
        "tensorboard.compat.proto.event_pb2",
        "tensorboard.compat.proto.summary_pb2",
    ),
}
"""Per writer package: the module with its ``masked_crc32c``, the Event and Summary protos."""


def find_backend(choice: str) -> Backend | None:
    """The first importable writer package of ``choice`` ("auto" tries tensorboardX first)."""
    names = list(BACKEND_MODULES) if choice == "auto" else [choice]
    for name in names:
        crc_mod, event_mod, summary_mod = BACKEND_MODULES[name]
        try:
            return Backend(
                name,
                importlib.import_module(crc_mod).masked_crc32c,
                importlib.import_module(event_mod),
                importlib.import_module(summary_mod),
            )
        except Exception:  # ImportError, or a broken install (e.g. protobuf mismatch)
            continue
    return None


class _EventWriter:
    """One TensorBoard run directory: a TFRecord file of ``Event`` protos, written
    synchronously (the packages' own writers queue events on a thread, so a flush would not
    make the epoch durable). Record framing: uint64 length, masked CRC-32C of the length,
    payload, masked CRC-32C of the payload (little-endian).

    The file starts with the version event; ``purge_step`` adds a ``SessionLog.START`` at that
    step, which makes TensorBoard drop earlier files' events at steps ≥ ``purge_step``.
    """

    def __init__(self, backend: Backend, logdir: Path, purge_step: int | None):
        logdir.mkdir(parents=True, exist_ok=True)
        self._backend = backend
        pb = backend.event_pb2
        # Unique per writer: the pid and a nanosecond clock disambiguate files opened within
        # the same second (a truncation, a resumed process).
        name = (
            f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}"
            f".{os.getpid()}.{time.monotonic_ns()}"
        )
        self._file = open(logdir / name, "wb")  # noqa: SIM115 (open for the writer's life)
        self._write(pb.Event(wall_time=time.time(), file_version="brain.Event:2"))
        if purge_step is not None:
            start = pb.SessionLog(status=pb.SessionLog.START)
            self._write(pb.Event(wall_time=time.time(), step=purge_step, session_log=start))
        self.flush()

    def _write(self, event: Any) -> None:
        data = event.SerializeToString()
        header = struct.pack("<Q", len(data))
        crc = self._backend.masked_crc32c
        self._file.write(
            header + struct.pack("<I", crc(header)) + data + struct.pack("<I", crc(data))
        )

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        s = self._backend.summary_pb2
        summary = s.Summary(
            value=[s.Summary.Value(tag=t, simple_value=v) for t, v in values.items()]
        )
        self._write(
            self._backend.event_pb2.Event(wall_time=time.time(), step=step, summary=summary)
        )

    def flush(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if not self._file.closed:
            self.flush()
            self._file.close()


def _flatten(prefix: str, arr: np.ndarray, out: dict[str, float]) -> None:
    if arr.ndim == 0:
        out[prefix] = float(arr)
        return
    for idx in np.ndindex(arr.shape):
        out[prefix + "/" + "/".join(map(str, idx))] = float(arr[idx])


def tb_scalars(record: Mapping[str, Any], num_seeds: int = 1) -> dict[str, dict[str, float]]:
    """The TensorBoard scalars of one record, by run sub-directory (``""`` = ``tb/`` itself).

    ``epoch`` is the step, not a scalar; nested mappings give ``key/sub`` tags; arrays larger
    than :data:`MAX_TB_ELEMENTS` and strings are skipped. With ``num_seeds > 1`` an array whose
    leading axis has length ``num_seeds`` is split over runs ``seed0``, ``seed1``, ...
    """
    runs: dict[str, dict[str, float]] = {"": {}}

    def visit(name: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                visit(f"{name}/{k}", v)
            return
        arr = numeric(value)
        if arr is None or arr.size > MAX_TB_ELEMENTS or arr.size == 0:
            return
        if num_seeds > 1 and arr.ndim >= 1 and arr.shape[0] == num_seeds:
            for s in range(num_seeds):
                _flatten(name, arr[s], runs.setdefault(f"seed{s}", {}))
        else:
            _flatten(name, arr, runs[""])

    for key, value in record.items():
        if key != "epoch":
            visit(str(key), value)
    return {run: vals for run, vals in runs.items() if vals}


class TensorBoard:
    """The TensorBoard runs of one run directory: ``root`` (``tb/``) and ``root/seed{s}/``.

    Args:
      backend: the writer package (:func:`find_backend`).
      root: the ``tb`` directory.
      num_seeds: S, the length of the leading seed axis of per-seed values.
      purge_step: a ``SessionLog.START`` at this step opens every new event file (None: none).

    An event file is opened per run on its first scalars and flushed (fsync'ed) every epoch.
    """

    def __init__(self, backend: Backend, root: Path, num_seeds: int, purge_step: int | None):
        self.backend = backend
        self.root = root
        self.num_seeds = num_seeds
        self._purge_step = purge_step
        self._writers: dict[str, _EventWriter] = {}

    def write(self, epoch: int, record: Mapping[str, Any]) -> None:
        """The scalars of ``record`` (:func:`tb_scalars`) at step ``epoch``, flushed."""
        for run, values in tb_scalars(record, self.num_seeds).items():
            if run not in self._writers:
                self._writers[run] = _EventWriter(self.backend, self.root / run, self._purge_step)
            writer = self._writers[run]
            writer.scalars(epoch, values)
            writer.flush()

    def restart(self, purge_step: int) -> None:
        """Close the event files; the next ones hide earlier events at steps ≥ ``purge_step``."""
        self.close()
        self._purge_step = purge_step

    def close(self) -> None:
        for w in self._writers.values():
            w.close()
        self._writers = {}
