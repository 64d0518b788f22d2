"""Checkpoints of the complete train state and the host loop state, with orbax (O6).

One :class:`Checkpointer` manages ``directory``; every saved step is a sub-directory
``<directory>/<step>/`` written by an orbax ``CheckpointManager`` with four items:

* ``state``   the train-state pytree (``StandardSave``: arrays in tensorstore/OCDBT);
* ``host``    the host-side loop state, a JSON dict (epoch, plateau counters, SGDR position, ...);
* ``meta``    per-leaf shape, dtype and CRC-32 of the saved bytes (JSON);
* ``metrics`` orbax's metrics item, ``{"val_sharpe": metric}``.

Saving is synchronous (``enable_async_checkpointing=False``): orbax writes into a temporary
directory and renames it to ``<step>`` before :meth:`Checkpointer.save` returns, so a SIGKILL
after ``save`` returns leaves a complete checkpoint and a SIGKILL during ``save`` leaves only a
temporary directory, which is ignored and removed when the directory is next opened.

Retention (orbax preservation policy): a step is kept when it is among the ``keep_latest`` most
recent steps OR among the ``keep_best`` best by metric —
``AnyPreservationPolicy([LatestN(keep_latest), BestN(score, n=keep_best)])``. The metric is the
validation Sharpe; ``score(m) = m`` for finite ``m`` and ``−inf`` otherwise, so a NaN (or
infinite) Sharpe is never preferred to a finite one. Ties go to the later step. A population of
``members`` members (issue 32) saves each member's metric too (``"members"`` in the metrics
item: its seeds' mean val Sharpe) and also keeps each member's best step (``BestN(score_m,
n=1)`` per member), so every member can be walked at its own best epoch
(``restore("best", member=m)``): at most ``members`` more checkpoints on disk.

Restoring reads ``meta`` first and compares it with the target's leaves: a different number of
leaves, shape or dtype is a user error (e.g. resuming with another config) and raises
:class:`CheckpointError` at once. Any failure to read the chosen step — a missing or truncated
file, undecodable JSON, a tensorstore read error, or bytes whose CRC-32 differs from the one
recorded at save time — marks it corrupt: a one-line warning is logged, the step directory is
renamed to ``<step>.corrupt`` (so retention and a later save of the same step are not blocked
by it; orbax ignores that name) and the next candidate is tried (the next older step for
``"latest"`` or an explicit step, the next best for ``"best"``). When no candidate is left,
:class:`CheckpointError` is raised. A step whose ``metrics`` file is undecodable is moved aside
the same way when the directory is opened (orbax reads every metrics file on start-up).

State leaves must be arrays (the stored layout, the ``meta`` item and the leaf types accepted:
:mod:`jaxdqn.program.checkpoints.contents`). The pytree may hold flax.struct dataclasses,
NamedTuples, dicts, lists and tuples, and may carry a leading seed axis; restore returns the
target's exact structure, shapes and dtypes. The host dict goes through JSON: tuples come back
as lists, dict keys as strings, NaN as NaN.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint.checkpoint_manager import StepAlreadyExistsError

from jaxdqn.program.checkpoints import contents as fmt
from jaxdqn.program.checkpoints import retention
from jaxdqn.program.checkpoints.contents import CheckpointError, Corrupt
from jaxdqn.program.checkpoints.orbax_echoes import one_line, quiet_failed_reads
from jaxdqn.program.checkpoints.retention import score

__all__ = ["CheckpointError", "Checkpointer", "score"]

PyTree = Any
log = logging.getLogger(__name__)

_ITEMS = ("state", "host", "meta")
_STEP_RE = re.compile(r"^(0|[1-9]\d*)$")


class Checkpointer:
    """Orbax checkpoints of ``(state, host, metric)`` with latest-N ∪ best-N retention.

    Args:
      directory: checkpoint directory (created if missing; may hold earlier checkpoints, which
        are picked up — that is how a run resumes).
      keep_latest: number of most recent steps kept (≥ 1).
      keep_best: number of best steps by metric kept (≥ 1).
      members: a population's member count: each member's best step is kept too (0: none).
      verify: record CRC-32 of every leaf at save time and check it at restore time (costs one
        device-to-host copy of the state per save and one pass over the bytes).
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        keep_latest: int,
        keep_best: int,
        members: int = 0,
        verify: bool = True,
    ):
        if keep_latest < 1 or keep_best < 1:
            raise CheckpointError(
                f"keep_latest and keep_best must be >= 1 (got {keep_latest}, {keep_best})"
            )
        self._dir = Path(directory).expanduser().resolve()
        self._verify, self._keep = verify, (keep_latest, keep_best, members)
        self._dir.mkdir(parents=True, exist_ok=True)
        quiet_failed_reads()
        self._quarantine_undecodable_metrics()
        options = ocp.CheckpointManagerOptions(
            enable_async_checkpointing=False,
            best_fn=retention.metrics_score,
            best_mode="max",
            preservation_policy=retention.policy(keep_latest, keep_best, members),
            cleanup_tmp_directories=True,
            create=True,
        )
        try:
            self._mngr = ocp.CheckpointManager(self._dir, item_names=_ITEMS, options=options)
        except Exception as e:  # any failure here means an unusable directory
            raise CheckpointError(f"cannot open checkpoints in {self._dir}: {one_line(e)}") from e
        saved = {s: self._mngr.metrics(s) for s in self._mngr.all_steps()}
        self._metrics: dict[int, float] = {s: retention.saved_metric(m) for s, m in saved.items()}
        self._member_metrics = {s: retention.saved_members(m) for s, m in saved.items()}

    # -- queries ----------------------------------------------------------------------------

    @property
    def directory(self) -> Path:
        """The managed directory (absolute)."""
        return self._dir

    def steps(self) -> list[int]:
        """Saved steps, ascending."""
        return sorted(self._mngr.all_steps())

    def count(self) -> int:
        """Number of checkpoints currently kept."""
        return len(self.steps())

    def latest_step(self) -> int | None:
        """The most recent step, or ``None``."""
        steps = self.steps()
        return steps[-1] if steps else None

    def metrics(self) -> dict[int, float]:
        """Metric of every kept step, as saved (NaN stays NaN; NaN also if it is missing)."""
        return {s: self._metrics.get(s, math.nan) for s in self.steps()}

    def member_metrics(self, member: int) -> dict[int, float]:
        """Member ``member``'s metric of every kept step (NaN where it has none)."""
        got = lambda s: self._member_metrics.get(s, [])
        return {s: got(s)[member] if member < len(got(s)) else math.nan for s in self.steps()}

    def _ranked(self, member: int | None = None) -> list[int]:
        """Steps from best to worst by ``(score(metric), step)`` (a member's own metric)."""
        return retention.best_first(
            self.metrics() if member is None else self.member_metrics(member)
        )

    def best_step(self, member: int | None = None) -> int | None:
        """The step with the best metric (NaN is worst; ties go to the later step), or ``None``;
        ``member``: by that population member's metric."""
        ranked = self._ranked(member)
        return ranked[0] if ranked else None

    def kept_after(self, step: int, metric: float, members: Sequence[float] = ()) -> list[int]:
        """The steps on disk once ``step`` is saved with ``metric`` (and ``members``): the
        retention of the module docstring, known before the save (the epoch's log line, written
        first, reports it)."""
        keep_latest, keep_best, num_members = self._keep
        return retention.kept(
            [*self.steps(), step],
            {**self.metrics(), step: metric},
            [
                {**self.member_metrics(m), step: members[m] if members else math.nan}
                for m in range(num_members)
            ],
            keep_latest,
            keep_best,
        )

    def save(
        self,
        step: int,
        state: PyTree,
        host: dict[str, Any],
        metric: float,
        members: Sequence[float] = (),
    ) -> None:
        """Write ``state``, ``host`` and ``metric`` as checkpoint ``step``; return when complete.
        ``members``: a population's per-member metrics (default: none, or NaN for each of the
        checkpointer's ``members``).

        ``step`` must be larger than every step saved in this directory (retention counts
        recency by step number), and no ``<step>`` directory may exist: nothing is overwritten.
        Retention is applied right after the write.
        """
        step = int(step)
        latest = self.latest_step()
        if latest is not None and step <= latest:
            raise CheckpointError(
                f"checkpoint step {step} must be larger than the latest saved step {latest}"
            )
        if (self._dir / str(step)).exists():
            raise CheckpointError(
                f"checkpoint step {step} already exists in {self._dir}; it is never overwritten"
            )
        if not isinstance(host, dict):
            raise CheckpointError(f"host state must be a dict, got {type(host).__name__}")
        try:
            json.dumps(host)
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"host state is not JSON-serialisable: {one_line(e)}") from e
        metric = float(metric)
        num_members = self._keep[2]
        if members and len(members) != num_members:
            raise CheckpointError(f"{len(members)} member metrics for {num_members} members")
        member_metrics = [float(v) for v in members] or [math.nan] * num_members
        saved = retention.metrics_item(metric, member_metrics if num_members else None)

        paths, leaves = fmt.leaves(state, "state")
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(fmt.flat(leaves)),
            host=ocp.args.JsonSave(host),
            meta=ocp.args.JsonSave(fmt.meta(paths, leaves, metric, self._verify)),
        )
        try:
            self._mngr.save(step, args=args, metrics=saved, force=True)
            self._mngr.wait_until_finished()
        except StepAlreadyExistsError as e:
            raise CheckpointError(f"checkpoint step {step} already exists in {self._dir}") from e
        self._metrics[step] = metric
        self._member_metrics[step] = member_metrics if num_members else []
        kept = set(self._mngr.all_steps())
        self._metrics = {s: v for s, v in self._metrics.items() if s in kept}
        self._member_metrics = {s: v for s, v in self._member_metrics.items() if s in kept}

    # -- restore ----------------------------------------------------------------------------

    def restore(
        self, which: str | int = "latest", target: PyTree = None, *, member: int | None = None
    ) -> tuple[PyTree, dict[str, Any], int]:
        """Restore ``(state, host, step)`` from the chosen checkpoint.

        Args:
          which: ``"latest"``, ``"best"`` (best metric) or a step number. If that checkpoint
            cannot be read, a warning is logged and the next candidate is tried: for
            ``"latest"`` and a step number the next older step, for ``"best"`` the next best.
          member: with ``"best"``, the best by this population member's metric.
          target: a pytree with the saved structure — concrete arrays (their shardings are
            used) or ``jax.ShapeDtypeStruct`` leaves (sharding ``None`` means the default
            device); NumPy leaves restore as NumPy arrays.

        Returns:
          The state with the target's structure, shapes and dtypes (bit-exact values), the host
          dict and the step actually restored.

        Raises:
          CheckpointError: no checkpoint, an unknown step, a target that does not match the
            saved leaves, or no candidate readable.
        """
        if target is None:
            raise TypeError("restore: target (abstract or example state) is required")
        paths, leaves = fmt.leaves(target, "target")
        treedef = jax.tree_util.tree_structure(target)
        abstract = [fmt.abstract(x) for x in leaves]
        specs = [fmt.spec(x) for x in leaves]

        candidates = self._candidates(which, member)
        tried = []
        for step in candidates:
            tried.append(step)
            try:
                meta = self._mngr.restore(
                    step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())
                )["meta"]
                crcs = fmt.check_meta(meta, step, self._dir, paths, specs)
                out = self._mngr.restore(
                    step,
                    args=ocp.args.Composite(
                        state=ocp.args.StandardRestore(fmt.flat(abstract)),
                        host=ocp.args.JsonRestore(),
                    ),
                )
                host = out["host"]
                if not isinstance(host, dict):
                    raise Corrupt(f"host item is a {type(host).__name__}, not a dict")
                values = fmt.unflat(out["state"], abstract)
                if self._verify:
                    fmt.check_crc(values, paths, crcs)
                state = jax.tree_util.tree_unflatten(treedef, values)
            except (Corrupt, OSError, ValueError, KeyError, EOFError) as e:
                reason = one_line(e)
            else:
                return state, host, step
            self._quarantine(step, reason)
        raise CheckpointError(
            f"no restorable checkpoint in {self._dir} (tried steps "
            f"{', '.join(map(str, tried))}; all unreadable)"
        )

    def _candidates(self, which: str | int, member: int | None = None) -> list[int]:
        steps = self.steps()
        if not steps:
            raise CheckpointError(f"no checkpoints in {self._dir}")
        if which == "latest":
            return steps[::-1]
        if which == "best":
            return self._ranked(member)
        if isinstance(which, (int, np.integer)) and not isinstance(which, bool):
            if int(which) not in steps:
                raise CheckpointError(
                    f"no checkpoint for step {which} in {self._dir} (have {steps})"
                )
            return [s for s in steps[::-1] if s <= int(which)]
        raise CheckpointError(
            f"checkpoint must be 'latest', 'best' or a step number, not {which!r}"
        )

    # -- corrupt steps ----------------------------------------------------------------------

    def _move_aside(self, step: int) -> Path | None:
        src = self._dir / str(step)
        dst = self._dir / f"{step}.corrupt"
        k = 1
        while dst.exists():
            dst = self._dir / f"{step}.corrupt{k}"
            k += 1
        try:
            os.rename(src, dst)
        except OSError:
            return None
        return dst

    def _quarantine(self, step: int, reason: str) -> None:
        dst = self._move_aside(step)
        where = f"moved to {dst.name}" if dst else "could not move it aside"
        log.warning(
            "checkpoint step %d in %s is unreadable (%s); %s; trying the next checkpoint",
            step,
            self._dir,
            reason,
            where,
        )
        self._metrics.pop(step, None)
        if dst is not None:
            self._mngr.reload()

    def _quarantine_undecodable_metrics(self) -> None:
        for child in sorted(self._dir.iterdir()):
            if not (_STEP_RE.match(child.name) and child.is_dir()):
                continue
            f = child / "metrics" / "metrics"
            if not f.exists():
                continue
            try:
                json.loads(f.read_text())
            except (OSError, ValueError) as e:
                dst = self._move_aside(int(child.name))
                where = f"moved to {dst.name}" if dst else "could not move it aside"
                log.warning(
                    "checkpoint step %s in %s is unreadable (metrics: %s); %s",
                    child.name,
                    self._dir,
                    one_line(e),
                    where,
                )

    # -- lifetime ---------------------------------------------------------------------------

    def close(self) -> None:
        """Wait for pending work and release orbax's resources."""
        self._mngr.wait_until_finished()
        # orbax (0.12) removes unfinished temporary directories in a background thread started
        # when the manager opens and awaits it only before a save: a program that opened the
        # checkpoints only to read them (evaluate, predict, a refused --checkpoint) could exit
        # while it ran, and the thread then printed a traceback after the one-line error.
        await_cleanup = getattr(self._mngr, "_maybe_await_cleanup_tmp_directory", None)
        if await_cleanup is not None:
            await_cleanup()
        self._mngr.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
