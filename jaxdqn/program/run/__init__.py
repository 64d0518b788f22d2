"""One training run, host side: the epoch ``loop`` and what it composes: the ``schedule`` set
before each epoch, ``plateau`` detection and its decisions, the ``run_state`` a checkpoint
carries, the ``epoch_log`` record, the deterministic ``walks``, the ``placement`` of the
population on devices, the console ``progress`` and the run's end (``finish``)."""
