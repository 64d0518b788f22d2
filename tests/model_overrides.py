"""Overrides that switch network components off, for the tests whose subject does not pass
through them (their programs then compile in about half to two thirds of the time). The model's
own tests (``tests/test_network.py``) and the end-to-end runs keep every component on."""

from jaxdqn.config import SWITCHES


def model_off(keep: tuple[str, ...] = ()) -> tuple[str, ...]:
    """``model.K=false`` for every model switch K (``config.SWITCHES["model"]``) not in ``keep``."""
    return tuple(f"model.{k}=false" for k in SWITCHES["model"] if k not in keep)


# Every network component (M2, M4, M5, M8-M13) off.
MODEL_OFF = model_off()

# The sharded iteration's, shared by ``tests/scale_worker.py`` and ``tests/test_scale.py`` (the
# sharded kill −9 and resume loads the worker's compiled iteration from the session's cache only
# if both build it from the same overrides). The components that act on each sample alone shard
# like any per-sample layer: their gradients are averaged over the devices with the rest, which
# the worker's one-update check (every component on) compares with one device. On stay every
# component with batch-wide statistics or state of its own: M8 (the Q-mean over the global
# batch), M13 (the xLSTM context carried in the train state and checkpointed), and every
# learner, dynamics and acting component.
PER_SAMPLE_MODEL_OFF = model_off(keep=("q_centering", "xlstm"))
