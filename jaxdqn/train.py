"""``python -m jaxdqn.train [--config PATH] [--run-dir DIR] [--resume DIR] [key=value ...]``

Trains the agent (default: the CPU-sized config on the bundled S&P 500 bars) and writes a run
directory: ``config.yaml``, ``metrics.jsonl``, TensorBoard files under ``tb/``,
``checkpoints/``, ``eval_val.csv``, ``eval_test.csv``, ``baselines_test.csv``,
``summary.json`` and ``report.md`` with its plots.

JAX's persistent compilation cache is on (``--compile-cache DIR``, ``--no-compile-cache``) and
the GPU XLA flags are added (``--no-xla-flags``): :mod:`jaxdqn.program.launch.runtime`.

Many processes (``jax.distributed``): ``--coordinator HOST:PORT --num-processes N --process-id
I``, or a cluster launcher JAX detects (SLURM ``srun``, Open MPI, Kubernetes JobSet); every
process runs the same command and only process 0 writes (:mod:`jaxdqn.program.launch.distributed`).

``--resume DIR`` continues a run from its latest checkpoint with the config saved in the run
(``train.epochs=N`` may be raised to train longer; ``--config`` and overrides that restate the
run's own values are accepted, so the original command with ``--resume`` added works, and any
other change is refused). SIGINT saves a
checkpoint and exits with code 130. Bad config or data: one line on stderr, exit code 2. A run
that cannot go on (repeated non-finite losses, no restorable checkpoint): exit code 1.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path

from jaxdqn import config as config_lib
from jaxdqn.config import ConfigError
from jaxdqn.program.launch import cli, distributed, runtime

RESUMABLE_KEYS = ("train.epochs",)


def choose_run_dir(run_dir: str | None, root: str = "runs") -> Path:
    """A new run directory: ``run_dir`` if it does not exist (or is empty), else an error;
    without a name, ``runs/<timestamp>`` with a numeric suffix if that is taken."""
    if run_dir is not None:
        p = Path(run_dir)
        if p.exists() and (not p.is_dir() or any(p.iterdir())):
            raise ConfigError(
                f"--run-dir {p}: already exists and is not empty (use --resume {p} to continue "
                "it, or choose another name)"
            )
        return p
    # (under jax.distributed every process names the same directory: process 0's clock)
    stamp = time.localtime(distributed.same_on_all(int(time.time())))
    base = Path(root) / time.strftime("%Y%m%d-%H%M%S", stamp)
    p, k = base, 1
    while p.exists():
        p = base.with_name(f"{base.name}-{k}")
        k += 1
    return p


def _resume_config(
    run_dir: Path, overrides: Sequence[str], config_path: str | None = None
) -> config_lib.Config:
    """The config of ``--resume run_dir``: the run's own ``config.yaml`` with ``overrides``.

    Only :data:`RESUMABLE_KEYS` may change; an override (or a ``--config`` file) that gives
    another key the value the run already has is accepted, so the original command with
    ``--resume`` added resumes the run."""
    saved_path = run_dir / "config.yaml"
    if not saved_path.exists():
        raise ConfigError(f"--resume {run_dir}: no config.yaml there (not a jaxdqn run directory)")
    saved = config_lib.load(saved_path)
    wanted = config_lib.load(config_path or saved_path, overrides)
    for key, old, new in config_lib.differences(saved, wanted):
        if key not in RESUMABLE_KEYS:
            raise ConfigError(
                f"{key}: cannot be changed when resuming (only {', '.join(RESUMABLE_KEYS)}); "
                f"the run has {old!r}, this command gives {new!r}"
            )
    return wanted


def _main(argv: Sequence[str] | None) -> int:
    parser = cli.make_parser("python -m jaxdqn.train", "Train the branching C51 DQN trading agent.")
    parser.add_argument(
        "--run-dir",
        metavar="DIR",
        default=None,
        help="new run directory (default: runs/<timestamp>)",
    )
    parser.add_argument(
        "--resume",
        metavar="DIR",
        default=None,
        help="continue the run in DIR from its latest checkpoint",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="plain log lines instead of the progress bar"
    )
    runtime.add_arguments(parser)
    distributed.add_arguments(parser)
    args = parser.parse_args(argv)
    runtime.configure_from_args(args)
    distributed.initialize(args)

    if args.resume is not None:
        run_dir = Path(args.resume)
        if args.run_dir is not None and Path(args.run_dir).resolve() != run_dir.resolve():
            raise ConfigError("--resume: continues the run in its own directory; drop --run-dir")
        cfg = _resume_config(run_dir, args.overrides, args.config)
    else:
        cfg = cli.load_config(args)
        run_dir = choose_run_dir(args.run_dir)
    # Imported once the config is good, so that --help and config errors answer without
    # loading the training program's modules (2 of a config error's 4 s on a 2-core EPYC).
    from jaxdqn.program.checkpoints import checkpoint
    from jaxdqn.program.run import loop

    # Every process has checked the directory before any writes into it.
    distributed.sync("jaxdqn-run-dir")
    primary = distributed.is_primary()
    try:
        trainer = loop.Trainer(
            cfg, run_dir, resume=args.resume is not None, progress=not args.no_progress
        )
        if primary:
            print(f"run directory: {run_dir}", flush=True)
        summary = trainer.run()
    except KeyboardInterrupt:
        print(
            f"interrupted: checkpoint saved in {run_dir / 'checkpoints'}; "
            f"continue with: python -m jaxdqn.train --resume {run_dir}",
            file=sys.stderr,
        )
        return 130
    except (loop.TrainingError, checkpoint.CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if summary is None:  # a process other than 0 under jax.distributed: it writes nothing
        return 0
    split = "test" if "test" in summary else "val"  # eval.walk_test=false: val only
    bh = summary["baselines"].get("buy_and_hold", {}).get(split, {})
    print(
        f"done: best epoch {summary['best_epoch']}, {split} Sharpe "
        f"{summary[split]['sharpe']:.3f} (buy-and-hold {bh.get('sharpe', float('nan')):.3f}); "
        f"report: {run_dir / 'report.md'}",
        flush=True,
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return cli.run_main("jaxdqn.train", _main, argv)


if __name__ == "__main__":
    sys.exit(main())
