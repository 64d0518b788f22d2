"""Many processes, one program: JAX's multi-process runtime (``jax.distributed``).

Every process runs the same ``python -m jaxdqn.train`` command; together they see every
process's devices (``jax.devices()``), over which ``train.mesh`` lays out the population
(:mod:`jaxdqn.agent.mesh`). Only process 0 writes the run's files (log, TensorBoard, report,
summary); orbax writes the checkpoints from every process into the shared run directory.

Started (:func:`initialize`) when

* ``--coordinator HOST:PORT --num-processes N --process-id I`` are given (plain arguments;
  also ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``), or
* the program runs under a cluster launcher that JAX detects itself: SLURM ``srun`` with more
  than one task (``SLURM_NTASKS``), Open MPI ``mpirun`` (``OMPI_COMM_WORLD_SIZE``), or a
  Kubernetes JobSet (``JOBSET_NAME``).

On the CPU the processes talk through gloo collectives.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping

from jaxdqn.config import ConfigError

__all__ = ["add_arguments", "initialize", "is_primary", "launcher", "same_on_all", "sync"]

_LAUNCHERS = (("SLURM_NTASKS", "SLURM srun"), ("OMPI_COMM_WORLD_SIZE", "Open MPI"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--coordinator``, ``--num-processes``, ``--process-id``."""
    group = parser.add_argument_group("many processes (jax.distributed)")
    group.add_argument(
        "--coordinator",
        metavar="HOST:PORT",
        default=None,
        help="address of process 0's coordinator (with --num-processes and --process-id)",
    )
    group.add_argument("--num-processes", type=int, default=None, metavar="N")
    group.add_argument("--process-id", type=int, default=None, metavar="I")


def launcher(environ: Mapping[str, str] | None = None) -> str | None:
    """The cluster launcher JAX will detect, or None (one process)."""
    env = os.environ if environ is None else environ
    for var, name in _LAUNCHERS:
        try:
            if int(env.get(var, "1")) > 1:
                return name
        except ValueError:
            continue
    if env.get("JOBSET_NAME"):
        return "Kubernetes JobSet"
    return None


def _explicit(args: argparse.Namespace, env: Mapping[str, str]) -> tuple | None:
    address = args.coordinator or env.get("JAX_COORDINATOR_ADDRESS")
    count = args.num_processes if args.num_processes is not None else env.get("JAX_NUM_PROCESSES")
    index = args.process_id if args.process_id is not None else env.get("JAX_PROCESS_ID")
    given = [v is not None for v in (address, count, index)]
    if not any(given):
        return None
    if not all(given):
        raise ConfigError(
            "--coordinator, --num-processes and --process-id go together (or their JAX_* "
            "environment variables)"
        )
    try:
        count, index = int(count), int(index)
    except ValueError:
        raise ConfigError("--num-processes and --process-id: integers") from None
    if count < 1 or not 0 <= index < count:
        raise ConfigError(f"--process-id {index}: must be in [0, {count}) for {count} processes")
    if ":" not in str(address):
        raise ConfigError(f"--coordinator {address}: expected HOST:PORT")
    return str(address), count, index


def initialize(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> bool:
    """Start ``jax.distributed`` when asked to (see the module docstring); returns whether it
    did. Call before the first JAX computation of the process."""
    env = os.environ if environ is None else environ
    explicit = _explicit(args, env)
    if explicit is None and launcher(env) is None:
        return False
    import jax

    if "cpu" in env.get("JAX_PLATFORMS", "").split(","):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if explicit is None:
        jax.distributed.initialize()
    else:
        address, count, index = explicit
        jax.distributed.initialize(
            coordinator_address=address, num_processes=count, process_id=index
        )
    return True


def is_primary() -> bool:
    """Whether this process writes the run's files (process 0; the only one without
    ``jax.distributed``)."""
    import jax

    return jax.process_index() == 0


def sync(name: str) -> None:
    """Wait until every process reaches this point (nothing on one process)."""
    import jax

    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def same_on_all(value: int) -> int:
    """Process 0's ``value`` on every process (itself on one process)."""
    import jax

    if jax.process_count() == 1:
        return int(value)
    import numpy as np
    from jax.experimental import multihost_utils

    return int(multihost_utils.broadcast_one_to_all(np.asarray(value, np.int64)))
