"""A program's start-up: ``cli`` (the entry points' shared command line and one-line errors),
``runtime`` (XLA flags and the persistent compilation cache) and ``distributed``
(``jax.distributed`` for many processes)."""
