"""Going on after a fault or a stop: the salts a run folds into its keys when it goes on
from a restored checkpoint, fault recovery, and the errors that end or stop a run.
"""

from __future__ import annotations

from typing import Any

from jaxdqn.agent.state import TrainState, fold_keys
from jaxdqn.config import Config
from jaxdqn.program.run.run_state import RunState

__all__ = ["FAULT_SALT", "REWIND_SALT", "Stopped", "TrainingError", "recover"]

# Salts folded into every seed's key when the run goes on from a restored checkpoint, so that
# it does not replay the trajectory it just abandoned: the k-th rewind folds REWIND_SALT + k,
# the k-th fault recovery FAULT_SALT + k. The offsets differ so that a rewind and a fault
# recovery that restore the same checkpoint never fold the same salt (for < 9,000 rewinds).
# Recorded runs used these values: changing them changes every run that rewinds or faults.
REWIND_SALT = 1_000
FAULT_SALT = 10_000


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. repeated non-finite losses); one-line message."""


class Stopped(RuntimeError):
    """The trainer's ``on_epoch`` stopped the run after an epoch (e.g. a sweep's pruner): its
    checkpoint and log are saved, it was not finished (``--resume`` goes on)."""


def recover(
    state: TrainState, run: RunState, *, cfg: Config, ckpt: Any, log: Any
) -> tuple[TrainState, RunState, dict[str, Any]]:
    """Non-finite loss or parameters: the state is dropped (never checkpointed); restore
    the last good checkpoint, fold a new key, run the epoch again."""
    run.consecutive_faults += 1
    run.fault_events += 1
    if run.consecutive_faults >= cfg.train.max_faults:
        raise TrainingError(
            f"non-finite loss or parameters in {run.consecutive_faults} consecutive epochs "
            f"(last at epoch {run.epoch}); stopping. Lower optim.lr or check the data."
        )
    good, good_json, step = ckpt.restore("latest", state)
    restored = RunState.from_json(good_json)
    # The fault counters and the step counter stay; the rest comes from the good checkpoint.
    restored.consecutive_faults = run.consecutive_faults
    restored.fault_events = run.fault_events
    restored.total_iterations = run.total_iterations
    log.note(
        f"non-finite loss or parameters in epoch {run.epoch + 1}; restored checkpoint "
        f"{step}, folded a new key (fault {run.consecutive_faults}/"
        f"{cfg.train.max_faults} in a row)"
    )
    fault = {"epoch": restored.epoch, "fault": True, "fault_events": run.fault_events}
    return fold_keys(good, FAULT_SALT + run.fault_events), restored, fault
