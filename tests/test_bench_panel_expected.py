"""bench/panel_expected.py (issue 29): the fresh, long draw of a run's synthetic panel keeps every
instrument's generator (phi, vol, drift) and changes its seed and length, so the expected ratio
it measures is that of the same market, on bars no run saw."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import panel_expected  # noqa: E402
from jaxdqn import config  # noqa: E402
from jaxdqn.market import market  # noqa: E402


def _run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(ROOT / "configs" / "panel_synthetic.yaml", run / "config.yaml")
    return run


def test_e3_fresh_panel_keeps_each_generator_and_draws_new_bars(tmp_path):
    run = _run_dir(tmp_path)
    before = config.load(run / "config.yaml")
    overrides = panel_expected.fresh_panel_overrides(run, 6000, 1000, 0.15, 0.05)
    after = config.load(run / "config.yaml", overrides)
    syn0, syn1 = before.data.synthetic, after.data.synthetic
    assert [i.name for i in syn1.panel] == [i.name for i in syn0.panel]
    for i, (old, new) in enumerate(zip(syn0.panel, syn1.panel, strict=True)):
        assert new.phi == (syn0.phi if old.phi is None else old.phi)
        assert new.vol == (syn0.vol if old.vol is None else old.vol)
        assert new.drift == (syn0.drift if old.drift is None else old.drift)
        assert new.num_bars == 6000
        assert new.seed == syn0.seed + 1001 + i != syn0.seed + 1 + i
    assert (after.data.train_frac, after.data.val_frac) == (0.15, 0.05)

    p0, p1 = market.prepare(before), market.prepare(after)
    lengths = [hi - lo for lo, hi in p1.ranges("test", walk=True)]
    assert lengths == [6000 - 900 - 300 + 1] * len(lengths)
    # Same instrument, same law, other bars: the first returns differ.
    r0 = np.asarray(p0.market.close[:50])
    r1 = np.asarray(p1.market.close[:50])
    assert not np.allclose(r0, r1)


def test_e3_fresh_panel_refuses_a_single_market_and_too_many_bars(tmp_path):
    run = _run_dir(tmp_path)
    with pytest.raises(SystemExit, match="--bars 200000"):
        panel_expected.fresh_panel_overrides(run, 200_000, 1000, 0.15, 0.05)
    shutil.copy(ROOT / "configs" / "synthetic.yaml", run / "config.yaml")
    with pytest.raises(SystemExit, match="not a synthetic panel run"):
        panel_expected.fresh_panel_overrides(run, 6000, 1000, 0.15, 0.05)
