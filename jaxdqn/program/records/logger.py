"""The run's per-epoch log: ``metrics.jsonl``, TensorBoard event files and notes.

``metrics.jsonl`` is the source of truth: one JSON object per epoch, appended, flushed and
``fsync``'ed before :meth:`RunLogger.log_epoch` returns, so a crash (even SIGKILL) loses nothing
already logged. Epochs are counted from 1 (``epoch`` = the number of epochs completed) and
strictly increase through the file; a run resumed from a checkpoint older than the last logged
epoch first drops the later records with :meth:`RunLogger.truncate_after`. The record's names
and their meaning: :mod:`jaxdqn.program.records.metric_names`.

Values are converted for JSON (:func:`jaxdqn.program.records.formats.to_jsonable`): numpy and jax
scalars and arrays become numbers and (nested) lists, bools stay bools, and every non-finite
float (NaN, ±inf) is written as ``null`` (JSON has no NaN). With ``S`` seeds a per-seed value is
a list of ``S`` entries (seed axis first, e.g. ``q_gap`` ``[S, 4]``).

TensorBoard (:mod:`jaxdqn.program.records.tensorboard`): every numeric value of a record, at step =
epoch, with one run per seed when ``S > 1``. When no writer package is importable a warning is
issued once and TensorBoard is skipped. After a truncation (and on resuming a run that has
logged epochs) new event files start with a ``SessionLog.START`` at step ``last epoch + 1``, so
TensorBoard hides the stale events of the abandoned future. ``None`` values are not sent to
TensorBoard.

The progress display is :class:`jaxdqn.program.run.progress.Progress`.
"""

from __future__ import annotations

import json
import operator
import os
import sys
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from jaxdqn import config as config_lib
from jaxdqn.config import Config
from jaxdqn.program.records import tensorboard as tb
from jaxdqn.program.records.formats import to_jsonable
from jaxdqn.program.records.results import write_text_atomic

__all__ = [
    "EVENTS_FILE",
    "METRICS_FILE",
    "LogError",
    "RunLogger",
    "SilentLogger",
    "open_run_log",
    "read_metrics",
    "write_config",
]

METRICS_FILE = "metrics.jsonl"
EVENTS_FILE = "events.log"


class LogError(ValueError):
    """An unreadable ``metrics.jsonl`` (one-line message naming the file and line)."""


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------


def _metrics_path(path: str | os.PathLike) -> Path:
    p = Path(path)
    return p / METRICS_FILE if p.is_dir() else p


def _parse(lines: list[bytes], path: Path) -> list[dict[str, Any]]:
    records = []
    for i, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise LogError(f"{path}: line {i} is not valid JSON") from None
        if not isinstance(rec, dict) or not isinstance(rec.get("epoch"), int):
            raise LogError(f"{path}: line {i} is not an object with an integer 'epoch'")
        records.append(rec)
    return records


def _complete_lines(data: bytes) -> tuple[list[bytes], int]:
    """The newline-terminated lines of ``data`` and their byte length (a torn tail is left)."""
    end = data.rfind(b"\n") + 1
    return data[:end].splitlines(), end


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` (or of the run directory holding one), in order.

    A final line without its newline (a write torn by a crash) is ignored; ``null`` stays
    None. A missing file gives ``[]``.

    Raises:
      LogError: a complete line that is not a JSON object with an integer ``epoch``.
    """
    p = _metrics_path(path)
    if not p.exists():
        return []
    lines, _ = _complete_lines(p.read_bytes())
    return _parse(lines, p)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # directories cannot be opened on some platforms; the rename is done
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------
# RunLogger
# ---------------------------------------------------------------------------------------------


class RunLogger:
    """Append-only per-epoch log of one run directory (see the module docstring).

    Args:
      run_dir: the run directory (created if missing).
      tensorboard: True: write TensorBoard events with the first importable writer
        (tensorboardX, then tensorboard); False: none; ``"tensorboardX"`` or
        ``"tensorboard"``: that writer only.
      console: print :meth:`note` messages to stderr (they always go to ``events.log``).
      num_seeds: S, the length of the leading seed axis of per-seed values (TensorBoard runs).

    Opening a directory whose ``metrics.jsonl`` ends in a torn line (a crash mid-write) cuts
    that line off; the last complete epoch is :attr:`last_epoch`.

    Raises:
      LogError: an existing ``metrics.jsonl`` is corrupt before its last line.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        *,
        tensorboard: bool | str = True,
        console: bool = True,
        num_seeds: int = 1,
    ):
        if tensorboard not in (True, False, "tensorboardX", "tensorboard"):
            raise ValueError(f"tensorboard: expected a bool or a writer name, got {tensorboard!r}")
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        self.console = console
        self.num_seeds = int(num_seeds)
        backend = None
        if tensorboard:
            choice = "auto" if tensorboard is True else str(tensorboard)
            backend = tb.find_backend(choice)
            if backend is None:
                warnings.warn(
                    "TensorBoard logging disabled: neither tensorboardX nor tensorboard is "
                    "importable (metrics.jsonl is still written)",
                    RuntimeWarning,
                    stacklevel=2,
                )
        self.last_epoch: int | None = self._repair()
        # Resuming a run that logged epochs: hide any TensorBoard events past the last one.
        purge = None if self.last_epoch is None else self.last_epoch + 1
        self._tb = None
        if backend is not None:
            self._tb = tb.TensorBoard(backend, self.run_dir / tb.TB_DIR, self.num_seeds, purge)

    @property
    def tensorboard_backend(self) -> str | None:
        """Name of the TensorBoard writer in use, or None."""
        return None if self._tb is None else self._tb.backend.name

    def _repair(self) -> int | None:
        if not self.path.exists():
            return None
        data = self.path.read_bytes()
        lines, end = _complete_lines(data)
        records = _parse(lines, self.path)
        if end < len(data):
            with open(self.path, "r+b") as f:
                f.truncate(end)
                f.flush()
                os.fsync(f.fileno())
        return records[-1]["epoch"] if records else None

    def write_file(self, name: str, text: str) -> None:
        """Write ``text`` to ``name`` in the run directory (e.g. the resolved config), atomically:
        a crash leaves the old file or the new one, never half of one."""
        write_text_atomic(self.run_dir / name, text)

    def log_epoch(self, record: Mapping[str, Any]) -> None:
        """Append ``record`` (must hold an integer ``epoch`` > :attr:`last_epoch`) and send its
        numeric values to TensorBoard. Durable (fsync'ed) when this returns.

        Raises:
          ValueError: no integer ``epoch``, or an epoch not after the last logged one.
          TypeError: a value that cannot be converted (see :func:`to_jsonable`).
        """
        raw = record.get("epoch")
        try:  # int, numpy or jax integer scalars
            epoch = None if isinstance(raw, (bool, np.bool_)) else operator.index(raw)
        except TypeError:
            epoch = None
        if epoch is None:
            raise ValueError(f"log_epoch: record needs an integer 'epoch', got {raw!r}")
        if self.last_epoch is not None and epoch <= self.last_epoch:
            raise ValueError(
                f"log_epoch: epoch {epoch} is not after the last logged epoch {self.last_epoch} "
                "(call truncate_after first when resuming from an earlier checkpoint)"
            )
        record = {**record, "epoch": epoch}
        line = json.dumps(to_jsonable(record, "record"), allow_nan=False) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self.last_epoch = epoch
        if self._tb is not None:
            self._tb.write(epoch, record)

    def truncate_after(self, epoch: int) -> int:
        """Drop every record with ``epoch`` greater than the given one; returns how many.

        Used when resuming from a checkpoint of epoch ``epoch`` older than the last logged
        epoch. The file is replaced atomically; TensorBoard writers are reopened with a purge
        at step ``epoch + 1``.
        """
        records = read_metrics(self.path)
        keep = [r for r in records if r["epoch"] <= epoch]
        dropped = len(records) - len(keep)
        if self.path.exists():
            tmp = self.path.with_name(self.path.name + ".tmp")
            with open(tmp, "w", encoding="utf-8") as f:
                for r in keep:
                    f.write(json.dumps(r, allow_nan=False) + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            _fsync_dir(self.run_dir)
        self.last_epoch = keep[-1]["epoch"] if keep else None
        if self._tb is not None:
            self._tb.restart(purge_step=epoch + 1)
        return dropped

    def note(self, message: str) -> None:
        """Record a one-line event (resume, rewind, fault, ...) in ``events.log`` with a UTC
        timestamp, and print it to stderr when ``console``."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        with open(self.run_dir / EVENTS_FILE, "a", encoding="utf-8") as f:
            f.write(f"{stamp} {message}\n")
            f.flush()
            os.fsync(f.fileno())
        if self.console:
            print(f"[jaxdqn] {message}", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Flush and close the TensorBoard writers (metrics.jsonl is always closed)."""
        if self._tb is not None:
            self._tb.close()

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SilentLogger:
    """The logger of a process that writes nothing (every process but 0 under
    ``jax.distributed``): the :class:`RunLogger` calls of the loop, without effect."""

    last_epoch = None
    tensorboard_backend = None

    def note(self, message: str) -> None:
        pass

    def log_epoch(self, record: Mapping[str, Any]) -> None:
        pass

    def write_file(self, name: str, text: str) -> None:
        pass

    def truncate_after(self, epoch: int) -> int:
        return 0

    def close(self) -> None:
        pass


def write_config(log: Any, run_dir: str | os.PathLike, cfg: Config, *, resumed: bool) -> None:
    """``config.yaml`` through ``log`` (a :class:`RunLogger` writes, a :class:`SilentLogger`
    does not): written when a run starts; on resume rewritten, with a note, when the config
    changed (a longer ``train.epochs``), so the directory and its report say what it trains."""
    path = Path(run_dir) / "config.yaml"
    if not resumed:
        log.write_file("config.yaml", config_lib.dump(cfg))
        return
    changed = config_lib.differences(config_lib.load(path), cfg) if path.exists() else []
    if changed:
        log.write_file("config.yaml", config_lib.dump(cfg))
        log.note(
            "config.yaml updated on resume: "
            + ", ".join(f"{k} {old} -> {new}" for k, old, new in changed)
        )


def open_run_log(run_dir: str | os.PathLike, num_seeds: int, *, write: bool = True):
    """The run's :class:`RunLogger`, or a :class:`SilentLogger` where ``write`` is False."""
    return RunLogger(run_dir, num_seeds=num_seeds) if write else SilentLogger()
