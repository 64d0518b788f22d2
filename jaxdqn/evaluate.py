"""``python -m jaxdqn.evaluate RUN_DIR [--split val|test] [--checkpoint best|latest|STEP] [k=v]``

Walks a saved agent deterministically over a split (:func:`jaxdqn.evaluation.walk.walk`) and
writes ``RUN_DIR/eval/eval_<split>.csv`` and ``metrics_<split>.json``: each seed's metrics and
``statistics``, the population statistics of the split against the baselines walked on the same
bars (bootstrap intervals, PSR, DSR over the run's val trials in ``metrics.jsonl``, SPA;
:mod:`jaxdqn.program.report.run_statistics`). Data, env (costs) and eval keys may be overridden
(evaluate on another instrument, or on another panel); the network must match the checkpoint.
On a panel the log has an ``instrument`` column, the statistics are those of the equal-weight
portfolios, and ``metrics_<split>.json`` adds ``instruments`` (each instrument's agent and
baseline metrics) and ``panel`` (the cross-section; :mod:`jaxdqn.program.report.panel_results`), and
``portfolio_<split>.csv`` and ``baselines_instruments_<split>.csv`` are written too.

``RUN_DIR`` may be a panel's walk-forward (``python -m jaxdqn.walkforward``): every fold's
checkpoint is evaluated on its own test dates with the same overrides (e.g. instruments no fold
trained on: ``data.instruments=[...]``) into ``OUT/fold_<k>/``, and the folds are stitched
instrument by instrument into ``OUT/metrics_test.json`` and ``stitched_instruments_test.csv``
(:mod:`jaxdqn.program.trained.evaluate`). Bad config or data: one line on stderr, exit code 2; a
checkpoint that cannot be restored: exit code 1.
"""

from __future__ import annotations


def _main(argv) -> int:
    import argparse
    import sys
    from pathlib import Path

    from jaxdqn import config as config_lib
    from jaxdqn.program.checkpoints import checkpoint
    from jaxdqn.program.launch import cli, runtime
    from jaxdqn.program.report import run_statistics
    from jaxdqn.program.trained import evaluate as evaluate_run

    parser = argparse.ArgumentParser(
        prog="python -m jaxdqn.evaluate",
        description="Walk a saved agent deterministically over a split and write its per-bar "
        "log and metrics. Data, env (costs) and eval keys may be overridden, e.g. "
        "data.source=csv data.path=other.csv to evaluate on another instrument. RUN_DIR may be "
        "a panel's walk-forward: every fold is evaluated on its own test dates and stitched.",
    )
    parser.add_argument(
        "run_dir", help="a run directory of python -m jaxdqn.train (or a panel's walk-forward)"
    )
    parser.add_argument("--split", choices=("val", "test"), default="test")
    cli.add_checkpoint_argument(parser)
    parser.add_argument("--out", default=None, help="output directory (default RUN_DIR/eval)")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    runtime.add_arguments(parser)
    # intermixed: overrides may follow options (RUN_DIR --split test data.path=x.csv)
    args = parser.parse_intermixed_args(argv)
    runtime.configure_from_args(args)

    run_dir = Path(args.run_dir)
    evaluate_run.check_overrides(args.overrides)
    which = cli.checkpoint_choice(args.checkpoint)
    out = Path(args.out) if args.out else run_dir / "eval"
    try:
        if (run_dir / "walkforward_plan.json").exists():
            if args.split != "test":
                raise config_lib.ConfigError(
                    f"--split {args.split}: a walk-forward is evaluated on its folds' test "
                    "segments (--split test)"
                )
            payload = evaluate_run.evaluate_walkforward(run_dir, which, args.overrides, out)
            _print_stitched(payload)
            print(f"wrote {out / 'metrics_test.json'} and every fold's files in {out}")
            return 0
        ev = evaluate_run.evaluate_run(run_dir, args.split, which, args.overrides, out)
    except checkpoint.CheckpointError as e:
        print(f"python -m jaxdqn.evaluate: error: {e}", file=sys.stderr)
        return 1
    for s, m in enumerate(ev.payload["seeds"]):
        print(
            f"seed {s}: sharpe {m['sharpe']:.3f}  sortino {m['sortino']:.3f}  "
            f"max_drawdown {m['max_drawdown']:.3f}  annual_return {m['annual_return']:.3f}  "
            f"turnover {m['turnover']:.4f}"
        )
    for line in run_statistics.summary_lines(ev.payload["statistics"]):
        print(line)
    print(f"checkpoint {ev.payload['checkpoint_step']}; wrote {ev.log_path} and {ev.metrics_path}")
    return 0


def _print_stitched(payload) -> None:
    from jaxdqn.program.records.formats import fixed

    cross = payload["panel"]["cross_section"]["test"]
    mean, ref = cross["mean"], cross["buy_and_hold"]
    beats = cross.get("beats_buy_and_hold")
    print(
        f"{len(payload['folds'])} folds, {cross['instruments']} instruments: mean stitched test "
        f"Sharpe {fixed(mean['sharpe'])} [{fixed(mean['low'])}, {fixed(mean['high'])}] "
        f"(buy-and-hold {fixed(ref['mean'])}); beats buy-and-hold on "
        + ("nan" if beats is None else f"{100 * beats:.0f} %")
        + " of them"
    )
    for name, entry in payload["instruments"].items():
        bh = entry["baselines"].get("buy_and_hold", {}).get("test", {}).get("sharpe")
        print(f"  {name}: sharpe {fixed(entry['test']['sharpe'])}  buy-and-hold {fixed(bh)}")


def main(argv=None) -> int:
    from jaxdqn.program.launch import cli

    return cli.run_main("jaxdqn.evaluate", _main, argv)


if __name__ == "__main__":
    import sys

    sys.exit(main())
