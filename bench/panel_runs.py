"""What bench/panel_learning.py and bench/panel_expected.py both read of a panel run: each
instrument's test decisions and each synthetic instrument's planted AR(1) coefficient. A module
of their own so that neither script imports the other's."""

from __future__ import annotations

from pathlib import Path

__all__ = ["instrument_phis", "test_decisions"]


def test_decisions(log: Path) -> dict[str, int]:
    """Each instrument's decisions in an evaluation log (``eval_test.csv``: seed 0's rows)."""
    import pandas as pd

    frame = pd.read_csv(log, usecols=["seed", "instrument"])
    return frame[frame.seed == 0].groupby("instrument").size().to_dict()


def instrument_phis(config_file: Path) -> dict[str, float]:
    """Each synthetic instrument's planted AR(1) coefficient in ``config_file``."""
    from jaxdqn import config
    from jaxdqn.market.panel import instrument_settings

    syn = config.load(config_file).data.synthetic
    return {inst.name: instrument_settings(syn, i).phi for i, inst in enumerate(syn.panel)}
