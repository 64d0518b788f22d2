"""The configuration of the sharded iteration, shared by ``tests/scale_worker.py`` and
``tests/test_scale.py`` (the sharded kill −9 and resume loads the worker's compiled iteration
from the session's cache only if both build it from the same overrides)."""

from jaxdqn.config import SWITCHES

# The network components that act on each sample alone (M2-M6, M9-M12) shard like any
# per-sample layer: their gradients are averaged over the devices with the rest, which the
# worker's one-update check (every component on) compares with one device. Off in the sharded
# iteration and run, whose programs then compile in about two thirds of the time. On stay every
# component with batch-wide statistics or state of its own: M8 (the Q-mean over the global
# batch), M13 (the xLSTM context carried in the train state and checkpointed), and every
# learner, dynamics and acting component.
PER_SAMPLE_MODEL_OFF = tuple(
    f"model.{k}=false" for k in SWITCHES["model"] if k not in ("q_centering", "xlstm")
)
