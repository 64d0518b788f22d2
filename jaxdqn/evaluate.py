"""``python -m jaxdqn.evaluate RUN_DIR [--split val|test] [--checkpoint best|latest|STEP] [k=v]``

Walks a saved agent deterministically over a split (:func:`jaxdqn.evaluation.walk.walk`) and
writes ``RUN_DIR/eval/eval_<split>.csv`` and ``metrics_<split>.json``: each seed's metrics and
``statistics``, the population statistics of the split against the baselines walked on the same
bars (bootstrap intervals, PSR, DSR over the run's val trials in ``metrics.jsonl``, SPA;
:mod:`jaxdqn.program.run_statistics`). Data, env (costs) and eval keys may be overridden
(evaluate on another instrument, or on another panel); the network must match the checkpoint.
On a panel the log has an ``instrument`` column, the statistics are those of the equal-weight
portfolios, and ``metrics_<split>.json`` adds ``instruments`` (each instrument's agent and
baseline metrics) and ``panel`` (the cross-section; :mod:`jaxdqn.program.panel_results`). Bad
config or data: one line on stderr, exit code 2.
"""

from __future__ import annotations

EVAL_OVERRIDABLE = ("data.", "env.", "eval.", "seed=")


def _main(argv) -> int:
    import argparse
    import json
    import sys
    from pathlib import Path

    import jax

    from jaxdqn import config as config_lib
    from jaxdqn.agent.build import build_agent, make_init
    from jaxdqn.evaluation.baselines import run_baselines
    from jaxdqn.evaluation.panel_baselines import run_panel_baselines
    from jaxdqn.market import market as market_lib
    from jaxdqn.program import checkpoint, panel_results, run_statistics, runtime
    from jaxdqn.program.results import write_eval_log
    from jaxdqn.program.walks import walk_seed

    parser = argparse.ArgumentParser(
        prog="python -m jaxdqn.evaluate",
        description="Walk a saved agent deterministically over a split and write its per-bar "
        "log and metrics. Data, env (costs) and eval keys may be overridden, e.g. "
        "data.source=csv data.path=other.csv to evaluate on another instrument.",
    )
    parser.add_argument("run_dir", help="a run directory written by python -m jaxdqn.train")
    parser.add_argument("--split", choices=("val", "test"), default="test")
    parser.add_argument(
        "--checkpoint", default="best", help="best | latest | a checkpoint step (default best)"
    )
    parser.add_argument("--out", default=None, help="output directory (default RUN_DIR/eval)")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    runtime.add_arguments(parser)
    # intermixed: overrides may follow options (RUN_DIR --split test data.path=x.csv)
    args = parser.parse_intermixed_args(argv)
    runtime.configure_from_args(args)

    run_dir = Path(args.run_dir)
    saved = run_dir / "config.yaml"
    if not saved.exists():
        raise config_lib.ConfigError(f"{run_dir}: no config.yaml (not a jaxdqn run directory)")
    for item in args.overrides:
        if not item.startswith(EVAL_OVERRIDABLE):
            key = item.split("=", 1)[0]
            raise config_lib.ConfigError(
                f"{key}: evaluation may override only data.*, env.*, eval.* and seed "
                "(the network must match the checkpoint)"
            )
    which = args.checkpoint
    if which not in ("best", "latest"):
        try:
            which = int(which)
        except ValueError:
            raise config_lib.ConfigError(
                f"--checkpoint: expected best, latest or a step number, got {which!r}"
            ) from None
    cfg = config_lib.load(saved, args.overrides)
    prepared = market_lib.prepare(cfg)
    agent = build_agent(cfg, prepared)
    num_seeds = cfg.train.num_seeds
    # The restore template: the abstract seed-stacked train state (nothing is computed).
    keys = jax.random.split(jax.random.PRNGKey(cfg.seed), num_seeds)
    template = jax.eval_shape(make_init(agent, num_seeds=num_seeds), prepared.market, keys)
    ckpt = checkpoint.Checkpointer(
        run_dir / "checkpoints", keep_latest=cfg.train.keep_latest, keep_best=cfg.train.keep_best
    )
    try:
        steps = ckpt.steps()
        if not steps:
            raise config_lib.ConfigError(f"{run_dir}: no checkpoints in {run_dir / 'checkpoints'}")
        if isinstance(which, int) and which not in steps:
            shown = ", ".join(map(str, steps))
            raise config_lib.ConfigError(
                f"--checkpoint {which}: {run_dir} has no checkpoint at that step (steps: {shown})"
            )
        state, _, step = ckpt.restore(which, template)
    except checkpoint.CheckpointError as e:
        print(f"python -m jaxdqn.evaluate: error: {e}", file=sys.stderr)
        return 1
    finally:
        ckpt.close()
    out = Path(args.out) if args.out else run_dir / "eval"
    out.mkdir(parents=True, exist_ok=True)
    results = [walk_seed(agent, prepared, cfg.eval, state, args.split, s) for s in range(num_seeds)]
    log_path = write_eval_log(out / f"eval_{args.split}.csv", [r.log for r in results])
    base_logs: dict = {}
    stat_logs, panel = [r.log for r in results], {}
    if prepared.is_panel:
        base = run_panel_baselines(cfg, prepared, splits=(args.split,))
        portfolios = panel_results.portfolio_logs({args.split: results}, base)
        stat_logs, base_logs = portfolios[0][args.split], portfolios[1]
        walks = {args.split: results}
        panel = panel_results.panel_entries(cfg, prepared, walks, base, portfolios)
    else:
        run_baselines(cfg, prepared, splits=(args.split,), logs=base_logs)
    stats = run_statistics.split_statistics(
        cfg,
        stat_logs,
        base_logs,
        args.split,
        run_statistics.selection_trials(run_dir),
        bars_per_year=prepared.bars_per_year,
    )
    payload = {
        "run_dir": str(run_dir),
        "checkpoint_step": step,
        "split": args.split,
        "overrides": list(args.overrides),
        "bar_clock": prepared.bar_clock.to_json(),
        "seeds": [r.metrics for r in results],
        "statistics": stats,
        **panel,
    }
    metrics_path = out / f"metrics_{args.split}.json"
    metrics_path.write_text(json.dumps(payload, indent=2, default=float))
    for s, r in enumerate(results):
        m = r.metrics
        print(
            f"seed {s}: sharpe {m['sharpe']:.3f}  sortino {m['sortino']:.3f}  "
            f"max_drawdown {m['max_drawdown']:.3f}  annual_return {m['annual_return']:.3f}  "
            f"turnover {m['turnover']:.4f}"
        )
    for line in run_statistics.summary_lines(stats):
        print(line)
    print(f"checkpoint {step}; wrote {log_path} and {metrics_path}")
    return 0


def main(argv=None) -> int:
    from jaxdqn.program import cli

    return cli.run_main("jaxdqn.evaluate", _main, argv)


if __name__ == "__main__":
    import sys

    sys.exit(main())
