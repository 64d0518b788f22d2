"""Orbax's and tensorstore's messages about a failed read, made one line.

A failed restore is reported once, in one line, by
:meth:`jaxdqn.program.checkpoints.checkpoint.Checkpointer.restore`: :func:`one_line` shortens
the exception, and :func:`quiet_failed_reads` drops the echoes of the same failure that orbax's
event loop would otherwise print afterwards.
"""

from __future__ import annotations

import logging
import sys
import warnings
from typing import Any

__all__ = ["one_line", "quiet_failed_reads"]


def one_line(exc: BaseException, limit: int = 220) -> str:
    """``Type: message`` on one line; tensorstore's spec dump is cut and, when still too long,
    the middle is elided (the most specific cause is at the end of tensorstore's messages)."""
    lines = str(exc).strip().splitlines()
    text = (lines[0] if lines else "").split(" [tensorstore_spec", 1)[0]
    msg = f"{type(exc).__name__}: {text}".strip()
    if len(msg) > limit:
        msg = msg[:60] + " ... " + msg[-(limit - 65) :]
    return msg


class _DropAbandonedTensorstoreReads(logging.Filter):
    """Drops asyncio's "exception was never retrieved" report for a failed tensorstore read."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        return not ("exception was never retrieved" in msg and "tensorstore_spec" in msg)


def quiet_failed_reads() -> None:
    """Silence two known, harmless echoes of a failed orbax read (idempotent, process-wide).

    When one tensorstore read fails mid-restore, orbax's event loop closes while sibling reads
    are still in flight. Their completion callbacks then raise "RuntimeError: Event loop is
    closed" (reported through ``sys.unraisablehook``) and their futures, holding the same read
    error, are logged by asyncio with a multi-page tensorstore spec when garbage-collected;
    a metadata coroutine orbax had not awaited yet draws a RuntimeWarning. All three repeat the
    error that the restore already reports in one line; only these messages are dropped,
    everything else passes through.
    """
    warnings.filterwarnings(
        "ignore", message=r"coroutine 'Store\._get_array_metadatas' was never awaited"
    )
    asyncio_log = logging.getLogger("asyncio")
    if not any(isinstance(f, _DropAbandonedTensorstoreReads) for f in asyncio_log.filters):
        asyncio_log.addFilter(_DropAbandonedTensorstoreReads())
    prev = sys.unraisablehook
    if getattr(prev, "_jaxdqn_quiet", False):
        return

    def hook(unraisable: Any) -> None:
        exc = unraisable.exc_value
        if isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed":
            return
        prev(unraisable)

    hook._jaxdqn_quiet = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook
