"""The run's per-epoch log: ``metrics.jsonl``, TensorBoard event files, notes and progress.

``metrics.jsonl`` is the source of truth: one JSON object per epoch, appended, flushed and
``fsync``'ed before :meth:`RunLogger.log_epoch` returns, so a crash (even SIGKILL) loses nothing
already logged. Epochs are counted from 1 (``epoch`` = the number of epochs completed) and
strictly increase through the file; a run resumed from a checkpoint older than the last logged
epoch first drops the later records with :meth:`RunLogger.truncate_after`.

Values are converted for JSON: numpy and jax scalars and arrays become numbers and (nested)
lists, bools stay bools, and every non-finite float (NaN, ±inf) is written as ``null`` (JSON has
no NaN). With ``S`` seeds a per-seed value is a list of ``S`` entries (seed axis first, e.g.
``q_gap`` ``[S, 4]``).

TensorBoard: every numeric scalar becomes a scalar summary at step = epoch; each element of a
short array (at most :data:`MAX_TB_ELEMENTS` entries) becomes ``name/i`` (``name/i/j`` for 2-D),
bools are 0/1, strings are skipped. With ``num_seeds = S > 1`` a value whose leading axis has
length S is written to a run of its own per seed, ``tb/seed{s}/`` (TensorBoard overlays seeds
under one tag), the others to ``tb/``. Two writers are supported, neither needing TensorFlow:
``tensorboardX`` and ``tensorboard`` (their protos and CRC-32C, pure python; the records are
written synchronously here). When neither is importable a warning is issued once and
TensorBoard is skipped. After a truncation (and on resuming a run that has logged epochs) a new
event file starts with a ``SessionLog.START`` at step ``last epoch + 1``, so TensorBoard hides
the stale events of the abandoned future. ``None`` values are not sent to TensorBoard.

:class:`Progress` shows a ``rich`` progress bar (ETA, val Sharpe, lr, loss, env steps/s) when
its stream is a terminal and one plain line per epoch otherwise.
"""

from __future__ import annotations

import importlib
import json
import math
import operator
import os
import socket
import struct
import sys
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any, NamedTuple, TextIO

import numpy as np

__all__ = [
    "EVENTS_FILE",
    "MAX_TB_ELEMENTS",
    "METRICS_FILE",
    "TB_DIR",
    "LogError",
    "Progress",
    "RunLogger",
    "format_epoch_line",
    "format_fields",
    "read_metrics",
    "tb_scalars",
    "to_jsonable",
]

METRICS_FILE = "metrics.jsonl"
EVENTS_FILE = "events.log"
TB_DIR = "tb"
MAX_TB_ELEMENTS = 64
"""Arrays with more elements than this are kept in metrics.jsonl but not sent to TensorBoard."""


class LogError(ValueError):
    """An unreadable ``metrics.jsonl`` (one-line message naming the file and line)."""


# ---------------------------------------------------------------------------------------------
# JSON conversion and reading
# ---------------------------------------------------------------------------------------------


def to_jsonable(value: Any, name: str = "value") -> Any:
    """``value`` as plain JSON types; non-finite floats → None.

    Accepts None, bool, int, float, str, numpy scalars and arrays, anything with
    ``__array__`` (jax arrays), mappings (keys made ``str``), lists, tuples and paths.

    Raises:
      TypeError: an object of another type (``name`` says which entry).
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, np.generic):
        return to_jsonable(value.item(), name)
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v, f"{name}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v, f"{name}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if hasattr(value, "__array__"):
        arr = np.asarray(value)
        if arr.dtype.kind not in "biufUS":
            try:  # e.g. bfloat16, which numpy sees as an opaque dtype
                arr = arr.astype(np.float64)
            except (TypeError, ValueError):
                raise TypeError(f"{name}: cannot log an array of dtype {arr.dtype}") from None
        return to_jsonable(arr.tolist(), name)
    raise TypeError(f"{name}: cannot log a value of type {type(value).__name__}")


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
# TensorBoard
# ---------------------------------------------------------------------------------------------


class _Backend(NamedTuple):
    name: str
    masked_crc32c: Callable[[bytes], int]
    event_pb2: ModuleType
    summary_pb2: ModuleType


_BACKEND_MODULES = {
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


def _find_backend(choice: str) -> _Backend | None:
    """The first importable writer package of ``choice`` ("auto" tries tensorboardX first)."""
    names = list(_BACKEND_MODULES) if choice == "auto" else [choice]
    for name in names:
        crc_mod, event_mod, summary_mod = _BACKEND_MODULES[name]
        try:
            return _Backend(
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

    def __init__(self, backend: _Backend, logdir: Path, purge_step: int | None):
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


def _numeric(value: Any) -> np.ndarray | None:
    """``value`` as a float64 array (None → NaN, bools → 0/1), or None when not numeric."""
    if value is None or isinstance(value, str):
        return None
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        return None
    return arr


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
        arr = _numeric(value)
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
        self._writers: dict[str, _EventWriter] = {}
        self._backend: _Backend | None = None
        if tensorboard:
            choice = "auto" if tensorboard is True else str(tensorboard)
            self._backend = _find_backend(choice)
            if self._backend is None:
                warnings.warn(
                    "TensorBoard logging disabled: neither tensorboardX nor tensorboard is "
                    "importable (metrics.jsonl is still written)",
                    RuntimeWarning,
                    stacklevel=2,
                )
        self.last_epoch: int | None = self._repair()
        # Resuming a run that logged epochs: hide any TensorBoard events past the last one.
        self._purge_step: int | None = None if self.last_epoch is None else self.last_epoch + 1

    @property
    def tensorboard_backend(self) -> str | None:
        """Name of the TensorBoard writer in use, or None."""
        return None if self._backend is None else self._backend.name

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
        if self._backend is not None:
            for run, values in tb_scalars(record, self.num_seeds).items():
                writer = self._writer(run)
                writer.scalars(epoch, values)
                writer.flush()

    def _writer(self, run: str) -> _EventWriter:
        if run not in self._writers:
            assert self._backend is not None
            self._writers[run] = _EventWriter(
                self._backend, self.run_dir / TB_DIR / run, self._purge_step
            )
        return self._writers[run]

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
        for w in self._writers.values():
            w.close()
        self._writers = {}
        self._purge_step = epoch + 1
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
        for w in self._writers.values():
            w.close()
        self._writers = {}

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------
# Progress
# ---------------------------------------------------------------------------------------------


def _fmt(value: Any, spec: str) -> str:
    """A number, or ``mean±std`` of a per-seed list; None and NaN → "nan"."""
    arr = _numeric(value)
    if arr is None:
        return "nan" if value is None else str(value)
    if arr.ndim == 0:
        v = float(arr)
        return "nan" if math.isnan(v) else format(v, spec)
    finite = arr[np.isfinite(arr)]
    if finite.size == 0:
        return "nan"
    mean = format(float(finite.mean()), spec)
    return mean if finite.size == 1 else f"{mean}±{format(float(finite.std()), spec)}"


_LINE_FIELDS = (
    ("val_sharpe", "val_sharpe", ".2f"),
    ("lr", "lr", ".1e"),
    ("loss", "loss", ".3g"),
    ("env_steps_per_s", "env_steps/s", ".1e"),
    ("updates_per_s", "updates/s", ".3g"),
)


def _strings(value: Any) -> list[str]:
    items = value if isinstance(value, (list, tuple)) else [value]
    return [str(v) for v in items if v is not None]


def _event_text(record: Mapping[str, Any]) -> str:
    parts = []
    if "plateau_epochs" in record:
        plateau = _fmt(record["plateau_epochs"], ".0f")
        detectors = sorted(set(_strings(record.get("detector"))) - {"none"})
        parts.append(f"plateau {plateau}" + (f" ({','.join(detectors)})" if detectors else ""))
    actions = sorted(set(_strings(record.get("action"))) - {"none"})
    parts.extend(actions)
    restart = record.get("restart")
    if restart is not None and np.any(np.asarray(restart, dtype=bool)):
        parts.append("sgdr_restart")
    return "  ".join(parts)


def format_fields(record: Mapping[str, Any]) -> str:
    """``val_sharpe 0.41  lr 2.9e-04  loss 3.12  env_steps/s 1.2e+05  updates/s 350  plateau 0``
    (the fields present in ``record``; ``lr`` falls back to ``learning_rate``)."""
    parts = []
    for key, label, spec in _LINE_FIELDS:
        value = record.get(key)
        if key == "lr" and key not in record:
            value = record.get("learning_rate")
            if value is None:
                continue
        elif key not in record:
            continue
        parts.append(f"{label} {_fmt(value, spec)}")
    events = _event_text(record)
    return "  ".join([*parts, events] if events else parts)


def _clock(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "-:--:--"
    s = round(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def format_epoch_line(
    record: Mapping[str, Any], total_epochs: int, elapsed: float, eta: float
) -> str:
    """One plain progress line: ``epoch 3/30  val_sharpe 0.41  lr 2.9e-04  ...  elapsed
    0:01:02  eta 0:09:18``."""
    head = f"epoch {record.get('epoch', '?')}/{total_epochs}"
    fields = format_fields(record)
    tail = f"elapsed {_clock(elapsed)}  eta {_clock(eta)}"
    return "  ".join(p for p in (head, fields, tail) if p)


def _two_line_progress_class() -> type:
    from rich import progress as rp
    from rich.text import Text

    class TwoLine(rp.Progress):
        """The bar on one line, the live fields below it (cut to the terminal's width), so a
        narrow terminal never squeezes the bar away."""

        def get_renderables(self):
            yield self.make_tasks_table(self.tasks)
            for task in self.tasks:
                info = task.fields.get("info", "")
                if info:
                    yield Text(info, no_wrap=True, overflow="ellipsis")

    return TwoLine


class Progress:
    """Epoch progress: a rich bar with ETA and live fields on a terminal, else plain lines.

    Use as a context manager and call :meth:`update` with each epoch's record (its ``epoch``
    = epochs completed, counted from 1). ``start_epoch``: epochs already done (resume).

    Args:
      total_epochs: epochs of the whole run.
      enabled: False prints nothing.
      start_epoch: completed epochs before this process started.
      stream: where to write (default ``sys.stderr``).
      force_terminal: override the terminal detection (None: ``rich``'s detection of
        ``stream``).
    """

    def __init__(
        self,
        total_epochs: int,
        enabled: bool = True,
        *,
        start_epoch: int = 0,
        stream: TextIO | None = None,
        force_terminal: bool | None = None,
    ):
        self.total = int(total_epochs)
        self.enabled = enabled
        self.start_epoch = int(start_epoch)
        self._stream = stream
        self._force_terminal = force_terminal
        self._bar: Any = None
        self._task: Any = None
        self._t0 = time.monotonic()
        self._done = 0

    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stderr

    def __enter__(self) -> Progress:
        self._t0 = time.monotonic()
        self._done = 0
        if not self.enabled:
            return self
        from rich.console import Console

        console = Console(file=self.stream, force_terminal=self._force_terminal)
        if console.is_terminal:
            from rich import progress as rp

            self._bar = _two_line_progress_class()(
                rp.TextColumn("[bold]epoch"),
                rp.BarColumn(),
                rp.MofNCompleteColumn(),
                rp.TimeElapsedColumn(),
                rp.TextColumn("eta"),
                rp.TimeRemainingColumn(),
                console=console,
                # Epochs can take minutes: estimate the speed from the whole run, not the
                # default 30 s window (which would leave the ETA blank).
                speed_estimate_period=1e9,
            )
            self._task = self._bar.add_task("train", total=self.total, info="")
            self._bar.update(self._task, completed=self.start_epoch)
            self._bar.start()
        return self

    def update(self, record: Mapping[str, Any]) -> None:
        """Show the epoch just completed."""
        if not self.enabled:
            return
        self._done += 1
        epoch = int(record.get("epoch", self.start_epoch + self._done))
        if self._bar is not None:
            self._bar.update(self._task, completed=epoch, info=format_fields(record))
            return
        elapsed = time.monotonic() - self._t0
        eta = elapsed / self._done * max(self.total - epoch, 0)
        print(format_epoch_line(record, self.total, elapsed, eta), file=self.stream, flush=True)

    def log(self, message: str) -> None:
        """Print a message (above the bar when one is shown)."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.console.print(message, markup=False, highlight=False)
        else:
            print(message, file=self.stream, flush=True)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
