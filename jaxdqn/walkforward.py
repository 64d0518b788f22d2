"""``python -m jaxdqn.walkforward [--config PATH] [--run-dir DIR] [--resume DIR] [key=value ...]``

Walk-forward evaluation: the ``walkforward`` section of the config (``walkforward.mode=anchored
|rolling``, ``unit=bars|years``, ``folds``, ``train``, ``val``, ``test``, ``purge``,
``embargo``; :mod:`jaxdqn.market.folds` has the arithmetic) cuts the bars into folds of train |
purge | val | purge | test whose test segments follow each other up to the last bar. Every fold
is trained from scratch by the population program of ``python -m jaxdqn.train`` in
``RUN_DIR/fold_<k>/`` (a normal run directory); the folds' out-of-sample test walks, and the
baselines' walks through the same folds, are stitched into one series. Writes
``RUN_DIR/walkforward.json``, ``walkforward.md`` (with its plots) and ``stitched_test.csv``
(:mod:`jaxdqn.program.walkforward.stitched` has the schema).

On a panel the folds are planned on the panel's calendar and cut every instrument at the same
dates (``data.split = dates`` in each fold's config); an instrument too short for a fold is
refused by name, or dropped from that fold when ``data.min_bars`` > 0. The stitched series is
the equal-weight portfolio of the per-instrument agents; each instrument's test segments are
stitched too (``stitched_instruments_test.csv``, the cross-section in ``walkforward.json``'s
``panel``).

Example (the bundled S&P 500, CPU default config: 4 anchored folds, val and test 1 year each,
5 purged bars; these are also the defaults of the section)::

    python -m jaxdqn.walkforward --run-dir runs/wf walkforward.folds=4 walkforward.val=1 \\
        walkforward.test=1 walkforward.purge=5

``--resume DIR`` continues a walk-forward killed at any point (even by SIGKILL) with the
config saved in DIR: finished folds are skipped, the interrupted fold resumes from its own
latest checkpoint (or starts again when it had none); no overrides are accepted. SIGINT saves
the current fold's checkpoint and exits with code 130. Bad config or data: one line on stderr,
exit code 2. A fold that cannot go on (repeated non-finite losses, no restorable checkpoint):
exit code 1. One process only (no ``jax.distributed``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path

from jaxdqn import config as config_lib
from jaxdqn.config import ConfigError
from jaxdqn.program.launch import cli, runtime


def _num(x) -> str:
    return "nan" if x is None else f"{float(x):.3f}"


def choose_run_dir(run_dir: str | None, root: str = "runs") -> Path:
    """A new walk-forward directory: ``run_dir`` if it does not exist (or is empty), else an
    error; without a name ``runs/walkforward-<timestamp>`` (a numeric suffix if taken)."""
    if run_dir is not None:
        p = Path(run_dir)
        if p.exists() and (not p.is_dir() or any(p.iterdir())):
            raise ConfigError(
                f"--run-dir {p}: already exists and is not empty (use --resume {p} to continue "
                "it, or choose another name)"
            )
        return p
    base = Path(root) / time.strftime("walkforward-%Y%m%d-%H%M%S")
    p, k = base, 1
    while p.exists():
        p = base.with_name(f"{base.name}-{k}")
        k += 1
    return p


def _main(argv: Sequence[str] | None) -> int:
    parser = cli.make_parser(
        "python -m jaxdqn.walkforward",
        "Walk-forward: train every fold from scratch, stitch the out-of-sample test segments.",
    )
    parser.add_argument(
        "--run-dir", metavar="DIR", default=None, help="new directory (default: runs/<stamp>)"
    )
    parser.add_argument(
        "--resume", metavar="DIR", default=None, help="continue the walk-forward in DIR"
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="plain log lines instead of the progress bar"
    )
    runtime.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.resume is not None:
        if args.config is not None or args.run_dir is not None or args.overrides:
            raise ConfigError(
                "--resume: takes the walk-forward's own config and directory; drop --config, "
                "--run-dir and the overrides"
            )
        run_dir = Path(args.resume)
        saved = run_dir / "config.yaml"
        if not saved.exists():
            raise ConfigError(f"--resume {run_dir}: no config.yaml there (not a walk-forward)")
        cfg = config_lib.load(saved)
    else:
        cfg = cli.load_config(args)
        cli.require_test_walk(cfg, "a walk-forward")
        run_dir = choose_run_dir(args.run_dir)
    runtime.configure_from_args(args)

    # Imported here so that --help and config errors answer without loading JAX programs.
    from jaxdqn.program.checkpoints import checkpoint
    from jaxdqn.program.run import loop
    from jaxdqn.program.walkforward import driver as walkforward

    print(f"walk-forward directory: {run_dir}", flush=True)
    try:
        result = walkforward.run_walkforward(
            cfg, run_dir, resume=args.resume is not None, progress=not args.no_progress
        )
    except KeyboardInterrupt:
        print(
            f"interrupted: the current fold's checkpoint is saved; continue with: "
            f"python -m jaxdqn.walkforward --resume {run_dir}",
            file=sys.stderr,
        )
        return 130
    except (loop.TrainingError, checkpoint.CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    st = result["stitched"]
    bh = st["baselines"].get("buy_and_hold", {}).get("sharpe")
    cross = ((result.get("panel") or {}).get("cross_section") or {}).get("test")
    across = ""
    if cross:
        mean, ref = cross["mean"], cross["buy_and_hold"]
        across = (
            f"; across {cross['instruments']} instruments mean test Sharpe "
            f"{_num(mean['sharpe'])} [{_num(mean['low'])}, {_num(mean['high'])}] "
            f"(buy-and-hold {_num(ref['mean'])})"
        )
    what = "equal-weight portfolio's stitched" if cross else "stitched"
    print(
        f"done: {len(result['folds'])} folds, {what} test Sharpe {st['mean']['sharpe']:.3f} "
        f"(buy-and-hold {_num(bh)}) over {st['bars']} bars{across}; "
        f"report: {run_dir / 'walkforward.md'}",
        flush=True,
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return cli.run_main("jaxdqn.walkforward", _main, argv)


if __name__ == "__main__":
    sys.exit(main())
