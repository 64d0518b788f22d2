"""``python -m jaxdqn.predict RUN_DIR [--data FILE|DIR] [--at DATE] [--checkpoint best|latest|STEP]
[--seed S] [--json]``

What the trained agent of ``RUN_DIR`` does after the last bar on or before ``--at`` (default:
the last bar) of the run's own bars, or of ``--data`` (a file for a one-instrument run, a
directory, glob or long file for a panel run, read with the run's data settings): the decision
its evaluation walk takes there (:mod:`jaxdqn.program.trained.predict`: bars after ``--at`` cut off,
features normalised with the run's train statistics, the walk of the split holding that bar
replayed from its first decision, the greedy policy of the chosen checkpoint).

For each instrument and seed, one row: the four branch actions with their names, the target
position and the order it implies (type, side, limit price, urgency), E[Q] per branch and
action with the Q10/Q50/Q90 spread, the A3 size factor and the bar the decision is taken after.
``--json`` prints a JSON list of one object per instrument and seed::

    {"instrument", "seed", "date",      # the bar the decision is taken after (ISO)
     "t",                               # its row in the bars (eval_<split>.csv's ``t``)
     "close", "checkpoint_step", "split", "walk_from",
     "actions": {"direction": i, "magnitude": i, "order": i, "urgency": i},   # eval_*.csv's
     "action_names", "target_position", "scale", "position", "equity",
     "order": {"type", "side", "urgency", "limit_price", "shares", "text"},
     "q": {branch: {action: {"mean", "q10", "q50", "q90"}}}}

``eval_<split>.csv``'s row of the same decision has ``t`` equal and ``date`` the next bar's
(when the order executes). On a panel, an instrument whose bars end long before ``--at`` (or
start too late for the observation window) is skipped with ``{"instrument", "skipped":
reason}``; the others are decided. Bad input (data whose columns or bar clock differ from the run's,
too few bars, stale bars before ``--at``, no usable checkpoint): one line on stderr, exit code 2.
"""

from __future__ import annotations


def _table(rows) -> list[str]:
    from jaxdqn.branches import ACTION_NAMES, BRANCHES
    from jaxdqn.program.records.formats import markdown_table

    skipped = [r for r in rows if "skipped" in r]
    rows = [r for r in rows if "skipped" not in r]
    head = ["instrument", "seed", "after bar", *BRANCHES, "target", "A3 scale", "order sent"]
    body = [
        [
            r["instrument"],
            str(r["seed"]),
            r["date"][:19].replace("T00:00:00", ""),
            *(r["action_names"][b] for b in BRANCHES),
            f"{r['target_position']:+.3f}",
            f"{r['scale']:.3f}",
            r["order"]["text"],
        ]
        for r in rows
    ]
    lines = markdown_table(head, body)
    for r in rows:
        lines.append("")
        lines.append(
            f"{r['instrument']} seed {r['seed']}: E[Q] [Q10, Q50, Q90] per action "
            f"(position going in {r['position']:+.3f}, walk from {r['walk_from'][:10]}, "
            f"split {r['split']}, checkpoint {r['checkpoint_step']})"
        )
        for b in BRANCHES:
            cells = []
            for a in ACTION_NAMES[b]:
                q = r["q"][b][a]
                mark = "*" if r["action_names"][b] == a else " "
                spread = f"[{q['q10']:+.2f}, {q['q50']:+.2f}, {q['q90']:+.2f}]"
                cells.append(f"{mark}{a} {q['mean']:+.3f} {spread}")
            lines.append(f"  {b:<9} " + "  ".join(cells))
    if rows:
        lines += [
            "",
            "* the action taken: the argmax of E[Q] after the M8-M11 coordination (q.acted)",
        ]
    lines += [f"{r['instrument']}: skipped ({r['skipped']})" for r in skipped]
    return lines


def _main(argv) -> int:
    import argparse
    import json

    from jaxdqn import config as config_lib
    from jaxdqn.program.checkpoints import checkpoint
    from jaxdqn.program.launch import cli, runtime
    from jaxdqn.program.trained import load
    from jaxdqn.program.trained import predict as predict_run

    parser = argparse.ArgumentParser(
        prog="python -m jaxdqn.predict",
        description="The trained agent's decision after the last bar on or before --at (default:"
        " the last bar) of the run's bars or of --data, as its evaluation walk takes it.",
    )
    parser.add_argument("run_dir", help="a run directory of python -m jaxdqn.train")
    parser.add_argument("--data", default=None, help="bars to decide on (default: the run's)")
    parser.add_argument("--at", default=None, help="ISO date or timestamp (default: last bar)")
    cli.add_checkpoint_argument(parser)
    parser.add_argument("--seed", type=int, default=None, help="one seed (default: every seed)")
    parser.add_argument("--json", action="store_true", help="print a JSON list")
    runtime.add_arguments(parser)
    args = parser.parse_args(argv)
    runtime.configure_from_args(args)
    which = cli.checkpoint_choice(args.checkpoint)
    at = predict_run.parse_at(args.at)
    try:
        run = load.load_run(args.run_dir, which)
    except checkpoint.CheckpointError as e:
        raise config_lib.ConfigError(f"{args.run_dir}: no usable checkpoint ({e})") from None
    bars = load.read_bars(run, args.data)
    seeds = None if args.seed is None else (args.seed,)
    rows = predict_run.predict(run, bars, at, seeds)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print("\n".join(_table(rows)))
    return 0


def main(argv=None) -> int:
    from jaxdqn.program.launch import cli

    return cli.run_main("jaxdqn.predict", _main, argv)


if __name__ == "__main__":
    import sys

    sys.exit(main())
