"""The programs' host side: the only layer that reads and writes files (docs/ARCHITECTURE.md).

Seven rooms, each with one job; imports point down this list and never across a line:

* ``trained``      what one does with a trained run: evaluate, predict, export
* ``walkforward``  walk-forward: the folds' driver, the stitched series, its report
* ``run``          one training run: the epoch loop, its schedule and plateau logic, the walks,
                   the placement on devices and the run's end
* ``report``       the statistics of a finished run and ``report.md`` with its figures
* ``records`` | ``checkpoints`` | ``launch``   (siblings) the files a run writes and how values
                   are written; orbax checkpoints and their integrity; a process's start-up:
                   command line, XLA flags and the compile cache, ``jax.distributed``
"""
