"""``python -m jaxdqn.sweep SWEEP.yaml [--dir DIR] [--storage URL] [--workers K] [--resume]``

A search beyond one program (shapes, architectures, feature windows; issue 32) on Optuna: every
trial is an ordinary run in ``DIR/trials/trial_<n>`` (its own report, ``eval.walk_test=false``:
trials are never walked on test) that reports its val score, and the study lives in an RDB
storage: a SQLite file ``DIR/study.db`` by default (one machine, ``--workers K`` processes),
or any SQLAlchemy URL (``postgresql://user:pw@host/db``) for workers on many machines, each
running this same command (``DIR`` on a shared filesystem). The sweep file is described in
:mod:`jaxdqn.program.sweep.space`; a trial may itself be a population (``population.*`` in its
``overrides``).

A worker killed mid-trial (SIGKILL, a lost machine) leaves its trial running until its
heartbeat (``--heartbeat`` seconds) is two beats old; then any worker marks it failed and
requeues it, and the next worker resumes its run from the last checkpoint. ``--resume``
continues a study that stopped (every worker gone; ``--trials N`` raises its budget).

With the sweep file's ``pruner`` a trial may be stopped after an epoch (pruned: its run is left
unfinished and resumable, and counts toward the budget and in N).

When the study has its finished trials, the last worker selects the winner on val, walks its
best checkpoint on test once into ``DIR/winner/``, and writes ``DIR/sweep.json`` and
``DIR/sweep.md`` with the Deflated Sharpe Ratio over every val Sharpe the search compared
(members × seeds × checkpoints of every run; :mod:`jaxdqn.program.sweep.finale`).

Bad sweep file, config or storage: one line on stderr, exit code 2. Too many failed trials:
exit code 1. SIGINT: the running trial saves a checkpoint and is requeued, exit code 130.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from jaxdqn.config import ConfigError
from jaxdqn.program.launch import cli, runtime


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m jaxdqn.sweep",
        description="Search hyperparameters with Optuna: every trial a run, selected on val, "
        "the winner walked on test once, the DSR over every trial the search saw.",
    )
    parser.add_argument("sweep", help="the sweep file (YAML: study, space, trials, ...)")
    parser.add_argument("--dir", default=None, help="sweep directory (default sweeps/<study>)")
    parser.add_argument(
        "--storage", default=None, help="SQLAlchemy URL of the study (default sqlite DIR/study.db)"
    )
    parser.add_argument(
        "--workers", type=int, default=1, help="worker processes on this machine (default 1)"
    )
    parser.add_argument("--resume", action="store_true", help="continue an existing study")
    parser.add_argument("--trials", type=int, default=None, help="replace the file's trials")
    parser.add_argument(
        "--heartbeat",
        type=int,
        default=10,
        help="seconds between a running trial's heartbeats; a trial silent for two is failed "
        "and requeued (default 10)",
    )
    runtime.add_arguments(parser)
    return parser


def _say(line: str) -> None:
    print(line, flush=True)


def _spawn(args: argparse.Namespace, sweep_dir: Path, url: str) -> list[subprocess.Popen]:
    """``args.workers - 1`` more workers of this command, joining the study this process
    opened (the same sweep file, directory, storage, budget and runtime options)."""
    cmd = [sys.executable, "-m", "jaxdqn.sweep", args.sweep, "--dir", str(sweep_dir)]
    cmd += ["--storage", url, "--resume", "--heartbeat", str(args.heartbeat)]
    if args.trials is not None:
        cmd += ["--trials", str(args.trials)]
    cmd += runtime.arguments_of(args)
    return [subprocess.Popen(cmd) for _ in range(args.workers - 1)]


def _main(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(argv)
    runtime.configure_from_args(args)
    from jaxdqn.program.checkpoints.contents import CheckpointError
    from jaxdqn.program.sweep import finale, space, study, worker

    if args.workers < 1 or args.heartbeat < 1:
        raise ConfigError("--workers and --heartbeat: must be >= 1")
    spec = space.load_spec(args.sweep, trials=args.trials)
    sweep_dir = Path(args.dir or Path("sweeps") / spec.study)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    url = args.storage or study.default_storage(sweep_dir)
    st = study.open_study(spec, url, resume=args.resume, heartbeat_s=args.heartbeat)
    _say(f"study {spec.study!r} in {study.redact(url)}; runs in {sweep_dir / worker.TRIALS}")
    children = _spawn(args, sweep_dir, url) if args.workers > 1 else []
    try:
        worker.work(st, spec, sweep_dir, say=_say)
        done = _already_written(sweep_dir, st)
        payload = done or finale.finale(st, spec, sweep_dir, url)
    except KeyboardInterrupt:
        print(
            f"interrupted (a running trial saved a checkpoint and is requeued); continue "
            f"with: python -m jaxdqn.sweep {args.sweep} --dir {sweep_dir} --resume",
            file=sys.stderr,
        )
        return 130
    except (study.SweepError, CheckpointError) as e:  # the search, or the winner's checkpoint
        print(f"python -m jaxdqn.sweep: error: {e}", file=sys.stderr)
        return 1
    finally:
        codes = [c.wait() for c in children]
    if payload is None and children:  # one of this command's own workers wrote the finale
        payload = _already_written(sweep_dir, st)
    if payload is None:
        _say(f"the finale is written by another worker: {sweep_dir / finale.SWEEP_MD}")
    else:
        w, stats = payload["winner"], payload["statistics"]
        dsr = ", ".join(f"{s['dsr']:.3f}" if s["dsr"] is not None else "nan" for s in
                        stats["seeds"])  # fmt: skip
        _say(
            f"winner: trial {w['trial']} {w['params']}: val {spec.metric} {w['value']:.4f}; "
            f"test sharpe {payload['test']['sharpe']:.3f}; DSR per seed {dsr} over N = "
            f"{payload['dsr_trials']['num_trials']}; report: {sweep_dir / finale.SWEEP_MD}"
        )
    return max([0, *codes])


def _already_written(sweep_dir: Path, st) -> dict | None:
    """``sweep.json`` when it was written for the study as it stands (the same trials)."""
    from jaxdqn.program.sweep import finale, study

    path = sweep_dir / finale.SWEEP_JSON
    if not path.exists():
        return None
    payload = json.loads(path.read_text())
    now = {"optuna_trials": len(st.get_trials(deepcopy=False)), **study.counts(st)._asdict()}
    same = all(payload.get("counts", {}).get(k) == v for k, v in now.items())
    return payload if same else None


def main(argv: Sequence[str] | None = None) -> int:
    return cli.run_main("jaxdqn.sweep", _main, argv)


if __name__ == "__main__":
    sys.exit(main())
