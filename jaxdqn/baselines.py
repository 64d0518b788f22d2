"""``python -m jaxdqn.baselines [--config PATH] [key=value ...]``: the baselines' val and test
metrics (:mod:`jaxdqn.evaluation.baselines`) as a table; on a panel the table of the
``eval.select_on`` statistic over instruments, then each instrument's Sharpe per baseline
(:mod:`jaxdqn.evaluation.panel_baselines`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import pandas as pd

from jaxdqn.evaluation.baselines import (
    TABLE_METRICS,
    describe_execution,
    oracle_execution,
    run_baselines,
)
from jaxdqn.evaluation.panel_baselines import run_panel_baselines
from jaxdqn.market.market import PanelPrepared, Prepared, prepare
from jaxdqn.program.launch import cli, runtime

__all__ = ["format_table", "main"]


def format_table(table: pd.DataFrame, prepared: Prepared) -> str:
    """Readable text: for each split its date range, then :data:`TABLE_METRICS` per baseline."""
    blocks = []
    for split in table.columns.get_level_values("split").unique():
        lo, hi = prepared.eval_range(split)
        first, last = prepared.dates[lo + 1], prepared.dates[hi - 1]
        head = f"{split}: returns of bars {first.date()} .. {last.date()} ({hi - 1 - lo} bars)"
        body = table[split][list(TABLE_METRICS)].to_string(
            float_format=lambda v: f"{v:.3f}", na_rep="nan"
        )
        blocks.append(f"{head}\n{body}")
    return "\n\n".join(blocks)


def _main(argv: Sequence[str] | None) -> int:
    parser = cli.make_parser(
        "python -m jaxdqn.baselines",
        "Walk the baseline strategies (flat, buy-and-hold, random, momentum, MACD, "
        "vol-targeted long, oracle on synthetic data) over the val and test splits through "
        "the market environment and its costs, and print their metrics.",
    )
    runtime.add_arguments(parser)
    args = parser.parse_args(argv)
    runtime.configure_from_args(args)
    cfg = cli.load_config(args)
    prepared = prepare(cfg)
    if prepared.is_panel:
        return _panel(cfg, prepared)
    table = run_baselines(cfg, prepared)
    source = prepared.df.attrs.get("source", cfg.data.source)
    print(
        f"baselines on {source}: full-size market orders at the next open; half-spread "
        f"{cfg.env.half_spread_bps:g} bps + commission {cfg.env.commission_bps:g} bps; "
        f"max leverage {cfg.env.max_leverage:g}"
    )
    for note in prepared.notes():  # the bar clock of the annualised columns, what was detected
        print(note)
    if oracle_execution(table) is not None:
        print(
            "best execution of the oracle's direction on val (the oracle row): "
            f"{describe_execution(oracle_execution(table))}; rows oracle_<order>_<urgency>: "
            f"every execution (limits fill when traded through by "
            f"{cfg.env.limit_through_bps:g} bps)"
        )
    print(format_table(table, prepared))
    return 0


def _panel(cfg, prepared: PanelPrepared) -> int:
    base = run_panel_baselines(cfg, prepared)
    print(
        f"baselines on a panel of {len(prepared.names)} instruments: full-size market orders at "
        f"the next open; half-spread {cfg.env.half_spread_bps:g} bps + commission "
        f"{cfg.env.commission_bps:g} bps; max leverage {cfg.env.max_leverage:g}"
    )
    for note in prepared.notes():
        print(note)
    fmt = lambda v: f"{v:.3f}"
    for split in ("val", "test"):
        print(f"\n{split}: the {cfg.eval.select_on} over instruments of each metric")
        print(base.table[split][list(TABLE_METRICS)].to_string(float_format=fmt, na_rep="nan"))
        sharpe = pd.DataFrame({name: t[(split, "sharpe")] for name, t in base.tables.items()}).T
        print(f"\n{split}: Sharpe per instrument")
        print(sharpe.to_string(float_format=fmt, na_rep="nan"))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m jaxdqn.baselines``: returns the exit code (2 on a config or data error)."""
    return cli.run_main("jaxdqn.baselines", _main, argv)


if __name__ == "__main__":
    sys.exit(main())
