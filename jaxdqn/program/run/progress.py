"""Epoch progress on the console: a ``rich`` bar on a terminal, one plain line per epoch
otherwise.

The live fields (:func:`format_fields`) are the validation Sharpe, learning rate, loss and
throughput of the epoch just completed, then its plateau state (O5) and what it triggered (O4
branch reset, O6 rewind, O2 SGDR restart). A per-seed value (a list of ``S`` entries) shows as
``mean±std`` over its finite entries (std with ddof 0).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any, TextIO

import numpy as np

from jaxdqn.program.records import metric_names
from jaxdqn.program.records.formats import clock, numeric

__all__ = ["Progress", "format_epoch_line", "format_fields"]


def _fmt(value: Any, spec: str) -> str:
    """A number, or ``mean±std`` of a per-seed list; None and NaN → "nan"."""
    arr = numeric(value)
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
"""(metric, label, format) of the live fields, in order."""
_PLATEAU, _DETECTOR, _ACTION, _RESTART = metric_names.require(
    "plateau_epochs", "detector", "action", "restart"
)
metric_names.require(*(key for key, _, _ in _LINE_FIELDS))


def _strings(value: Any) -> list[str]:
    items = value if isinstance(value, (list, tuple)) else [value]
    return [str(v) for v in items if v is not None]


def _event_text(record: Mapping[str, Any]) -> str:
    parts = []
    if _PLATEAU in record:
        plateau = _fmt(record[_PLATEAU], ".0f")
        detectors = sorted(set(_strings(record.get(_DETECTOR))) - {"none"})
        parts.append(f"plateau {plateau}" + (f" ({','.join(detectors)})" if detectors else ""))
    actions = sorted(set(_strings(record.get(_ACTION))) - {"none"})
    parts.extend(actions)
    restart = record.get(_RESTART)
    if restart is not None and np.any(np.asarray(restart, dtype=bool)):
        parts.append("sgdr_restart")
    return "  ".join(parts)


def format_fields(record: Mapping[str, Any]) -> str:
    """``val_sharpe 0.41  lr 2.9e-04  loss 3.12  env_steps/s 1.2e+05  updates/s 350  plateau 0``
    (the fields present in ``record``)."""
    parts = [
        f"{label} {_fmt(record[key], spec)}" for key, label, spec in _LINE_FIELDS if key in record
    ]
    events = _event_text(record)
    return "  ".join([*parts, events] if events else parts)


def format_epoch_line(
    record: Mapping[str, Any], total_epochs: int, elapsed: float, eta: float
) -> str:
    """One plain progress line: ``epoch 3/30  val_sharpe 0.41  lr 2.9e-04  ...  elapsed
    0:01:02  eta 0:09:18``."""
    head = f"epoch {record.get('epoch', '?')}/{total_epochs}"
    fields = format_fields(record)
    tail = f"elapsed {clock(elapsed)}  eta {clock(eta)}"
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
