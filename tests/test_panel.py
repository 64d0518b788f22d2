"""E2 panels (issue 29, the data layer): directories, globs and long files of many instruments,
each validated like one file, with errors naming the file or symbol."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from jaxdqn import config
from jaxdqn.market import data, panel
from jaxdqn.market.data import DataError


def _bars(start: str, n: int, seed: int, freq: str = "B") -> pd.DataFrame:
    """``n`` consistent OHLCV bars from ``start`` (a column ``date``)."""
    rng = np.random.default_rng(seed)
    close = 20 * np.exp(np.cumsum(0.01 * rng.standard_normal(n)))
    open_ = close * np.exp(0.002 * rng.standard_normal(n))
    return pd.DataFrame(
        {
            "date": pd.date_range(start, periods=n, freq=freq).strftime("%Y-%m-%d %H:%M"),
            "open": open_,
            "high": np.maximum(open_, close) * 1.01,
            "low": np.minimum(open_, close) * 0.99,
            "close": close,
            "volume": rng.integers(100, 1000, n),
        }
    )


def _load(path, symbol_column=None, *extra) -> panel.Panel:
    cfg = config.load(None, list(extra)).data
    return panel.load_panel(str(path), cfg, symbol_column)


def _raises(path, *fragments, symbol_column=None) -> str:
    with pytest.raises(DataError) as info:
        _load(path, symbol_column)
    msg = str(info.value)
    assert "\n" not in msg, msg
    for frag in fragments:
        assert frag in msg, (frag, msg)
    return msg


@pytest.fixture
def folder(tmp_path):
    """Three instruments of different dates and lengths, one of them gzipped, one Parquet."""
    d = tmp_path / "universe"
    d.mkdir()
    _bars("2010-01-04", 300, 0).to_csv(d / "MSFT.csv", index=False)
    _bars("2012-06-01", 200, 1).to_csv(d / "AAPL.csv.gz", index=False)
    _bars("2011-03-01", 250, 2).to_parquet(d / "KO.parquet", index=False)
    (d / "README.md").write_text("not data")
    return d


def test_e2_panel_directory_and_glob_name_instruments_by_file_stem(folder):
    assert panel.is_panel(str(folder)) and not panel.is_panel(str(folder / "MSFT.csv"))
    assert panel.is_panel(str(folder / "*.csv")) and panel.is_panel("x.csv", "symbol")
    p = _load(folder)
    assert p.names == ("AAPL", "KO", "MSFT") and not p.notes
    assert [len(b) for b in p.bars] == [200, 250, 300]
    assert p.bars[0].index[0] == pd.Timestamp("2012-06-01")
    # each instrument is exactly what loading its file alone gives
    pd.testing.assert_frame_equal(p.bars[2], data.load_ohlcv(folder / "MSFT.csv"))
    assert p.bars[1].attrs["source"].endswith("KO.parquet")
    g = _load(folder / "*.csv*")
    assert g.names == ("AAPL", "MSFT")


def test_e2_panel_long_file_with_a_symbol_column(tmp_path):
    parts = [_bars("2010-01-04", 120, k).assign(Ticker=t) for k, t in enumerate(("XOM", "JPM"))]
    long = pd.concat(parts).sample(frac=1.0, random_state=0)  # rows in any order per symbol...
    long = long.sort_values("date", kind="stable")  # ...but increasing dates within one
    path = tmp_path / "long.csv"
    long.to_csv(path, index=False)
    p = _load(path, "ticker")  # any case
    assert p.names == ("JPM", "XOM")
    np.testing.assert_allclose(p.bars[1]["close"], parts[0]["close"], rtol=1e-15)
    assert p.bars[0].attrs["source"] == f"{path} [symbol JPM]"


def test_e2_panel_errors_name_the_file_or_symbol(tmp_path, folder):
    bad = _bars("2015-01-05", 100, 3)
    bad.loc[7, "low"] = bad.loc[7, "high"] * 2
    bad.to_csv(folder / "BAD.csv", index=False)
    _raises(folder, "BAD.csv", "row 7", "column 'low'")
    (folder / "BAD.csv").unlink()
    # the same instrument twice
    _bars("2015-01-05", 100, 4).to_csv(folder / "MSFT.csv.gz", index=False)
    _raises(folder, "instrument 'MSFT' again")
    (folder / "MSFT.csv.gz").unlink()
    # an instrument of another frequency, and one whose own frequency changes
    _bars("2015-01-05 09:00", 400, 5, freq="h").to_csv(folder / "FX.csv", index=False)
    _raises(folder, "FX.csv", "bars every 1 h, the panel's every 1 d")
    mixed = pd.concat([_bars("2015-01-05", 100, 6), _bars("2015-06-01 09:00", 50, 6, freq="h")])
    mixed.to_csv(folder / "FX.csv", index=False)
    _raises(folder, "FX.csv", "row 101", "one frequency")
    # nothing there, a pattern that matches nothing
    empty = tmp_path / "empty"
    empty.mkdir()
    _raises(empty, "no .csv, .csv.gz or .parquet files")
    _raises(tmp_path / "nope*.csv", "matches no file")
    # a long file: a symbol's bad row, a missing symbol column, a row without a symbol
    long = pd.concat([_bars("2010-01-04", 60, k).assign(sym=t) for k, t in enumerate("AB")])
    long.loc[long["sym"] == "B", "close"] = -1.0
    path = tmp_path / "long.csv"
    long.to_csv(path, index=False)
    _raises(path, "[symbol B]", "column 'close'", symbol_column="sym")
    _raises(path, "symbol column 'ticker' not found", symbol_column="ticker")
    long = long.assign(close=1.0, high=2.0, low=0.5, open=1.0)
    long.iloc[5, long.columns.get_loc("sym")] = None
    long.to_csv(path, index=False)
    _raises(path, "row 5", "no symbol", symbol_column="sym")


def test_e2_panel_reads_every_instrument_close_only_or_without_volume_when_some_are(folder):
    closes = _bars("2013-01-02", 150, 7)[["date", "close"]]
    closes.to_csv(folder / "IDX.csv", index=False)
    p = _load(folder)
    assert all(data.info(b)[0] for b in p.bars)  # every instrument close-only
    assert not any(data.info(b)[1] for b in p.bars)  # and none with the volume feature
    assert any("IDX have closes only" in n for n in p.notes)
    assert any("IDX have no volume" in n for n in p.notes)
    msft = p.bars[p.names.index("MSFT")]
    np.testing.assert_array_equal(msft["open"].to_numpy()[1:], msft["close"].to_numpy()[:-1])


def test_e2_panel_bundled_20_stocks_wide_table_of_adjusted_closes():
    cfg = config.load(None).data
    p = panel.load_wide("sp500_20", cfg)
    assert p.names == tuple(sorted(p.names)) and len(p.names) == 20
    assert {"AAPL", "MSFT", "XOM", "JPM"} <= set(p.names)
    for bars in p.bars:
        assert len(bars) == 8313 and data.info(bars)[:2] == (True, False)
        assert bars.index[0] == pd.Timestamp("1990-01-02")
        assert bars.index[-1] == pd.Timestamp("2022-12-28")
    aapl = p.bars[p.names.index("AAPL")]
    assert aapl["close"].iloc[0] == 0.264 and aapl["close"].iloc[-1] == 125.674
    assert "sp500_20" in aapl.attrs["source"] and "[column AAPL]" in aapl.attrs["source"]


def test_e2_panel_wide_table_gaps_and_errors(tmp_path):
    dates = pd.bdate_range("2015-01-05", periods=80).strftime("%Y-%m-%d")
    rng = np.random.default_rng(9)
    wide = pd.DataFrame({"Date": dates, **{t: 10 + rng.random(80) for t in ("B", "A")}})
    wide.loc[:19, "B"] = np.nan  # B starts later
    wide.loc[40, "A"] = np.nan  # and A has a hole
    path = tmp_path / "wide.csv"
    wide.to_csv(path, index=False)
    cfg = config.load(None).data
    p = panel.load_wide(str(path), cfg)
    assert p.names == ("A", "B") and [len(b) for b in p.bars] == [79, 60]
    assert p.bars[1].index[0] == pd.Timestamp(dates[20])
    wide.loc[50, "A"] = -3.0
    wide.to_csv(path, index=False)
    with pytest.raises(DataError, match=r"\[column A\]: row 49 .*column 'close': non-positive"):
        panel.load_wide(str(path), cfg)
    wide.drop(columns="Date").to_csv(path, index=False)
    with pytest.raises(DataError, match="needs one date column"):
        panel.load_wide(str(path), cfg)


PANEL_CFG = ("data.split=fraction", "data.train_frac=0.6", "data.val_frac=0.2")


def test_e2_panel_market_is_each_instrument_alone_concatenated(folder):
    from jaxdqn.market import env, features, market, panel_market, splits

    cfg = config.load(None, list(PANEL_CFG))
    p = _load(folder)
    pm = panel_market.prepare_panel(cfg, p)
    assert pm.names == ("AAPL", "KO", "MSFT")
    assert [i.offset for i in pm.instruments] == [0, 200, 450]
    assert pm.market.num_bars == 750 and pm.bar_clock.bars_per_year == 252.0
    first = market.first_decision(cfg)
    for inst, bars in zip(pm.instruments, p.bars, strict=True):
        # per-instrument normalisation on its own train rows, and its own sigma and ADV
        sp = splits.split(bars, cfg.data, first)
        feats = features.compute_features(bars, cfg.features, sp.train)
        alone = env.make_market(bars, feats, cfg.env)
        rows = slice(inst.offset, inst.offset + inst.num_bars)
        for f in ("close", "open", "sigma", "adv", "features", "volume"):
            np.testing.assert_array_equal(getattr(pm.market, f)[rows], getattr(alone, f), f)
        np.testing.assert_array_equal(inst.features.mean, feats.mean)
        assert inst.splits == sp
    train, walk = pm.ranges("train"), pm.ranges("test", walk=True)
    for k, inst in enumerate(pm.instruments):
        lo, hi = inst.splits.train
        assert tuple(train[k]) == (inst.offset + max(lo, first), inst.offset + hi)
        # no observation window reaches into the previous instrument
        assert train[k, 0] - (cfg.features.window - 1) >= inst.offset + features.warmup_length(
            cfg.features
        )
        tlo, thi = inst.splits.test
        assert tuple(walk[k]) == (inst.offset + tlo - 1, inst.offset + thi)
        assert pm.instrument_of(int(train[k, 0])) == k == pm.instrument_of(int(walk[k, 1]) - 1)
    with pytest.raises(ValueError, match="unknown split"):
        pm.ranges("holdout")


def test_e2_panel_market_refuses_an_instrument_too_short_for_its_splits_by_name(folder):
    from jaxdqn.market import panel_market

    _bars("2016-01-04", 90, 8).to_csv(folder / "TINY.csv", index=False)
    cfg = config.load(None, list(PANEL_CFG))
    with pytest.raises(DataError, match=r"TINY\.csv"):
        panel_market.prepare_panel(cfg, _load(folder))


@pytest.mark.parametrize("sampling", ["length", "uniform"])
def test_e1_panel_episodes_draw_an_instrument_and_never_cross_into_another(folder, sampling):
    import jax
    import jax.numpy as jnp

    from jaxdqn.market import env, panel_market

    cfg = config.load(None, [*PANEL_CFG, "env.episode_length=16"])
    pm = panel_market.prepare_panel(cfg, _load(folder), sampling)
    params, market = pm.env_params, pm.market
    train = pm.ranges("train")
    n = 4000
    keys = jax.random.split(jax.random.PRNGKey(0), n)
    reset = jax.vmap(env.reset, in_axes=(None, None, None, None, 0))
    states, _ = reset(params, market, 0, 1, keys)  # lo, hi unused on a panel

    def instrument(lo, hi):
        idx = np.clip(np.searchsorted(train[:, 0], lo), 0, len(train) - 1)
        assert np.array_equal(train[idx], np.stack([lo, hi], 1)), "not an instrument's range"
        return idx

    picked = instrument(np.asarray(states.lo), np.asarray(states.hi))
    length = (train[:, 1] - train[:, 0]).astype(np.float64)
    p = length / length.sum() if sampling == "length" else np.full(3, 1 / 3)
    freq = np.bincount(picked, minlength=3) / n
    np.testing.assert_array_less(np.abs(freq - p), 4 * np.sqrt(p * (1 - p) / n))
    # 100 steps with auto-reset (about 6 episodes each): every bar played stays inside its
    # episode's instrument range, and the instruments are drawn anew at each reset
    m = 500
    states = jax.tree.map(lambda x: x[:m], states)
    step = jax.jit(jax.vmap(env.step_autoreset, in_axes=(None, None, 0, 0, 0)), static_argnums=0)
    action = jnp.tile(jnp.array([2, 2, 0, 2], jnp.int32), (m, 1))
    switched = np.zeros(m, bool)
    first = instrument(np.asarray(states.lo), np.asarray(states.hi))
    for _ in range(100):
        states, *_ = step(params, market, states, action, jnp.ones(m, jnp.float32))
        t, lo, hi = (np.asarray(x) for x in (states.t, states.lo, states.hi))
        assert np.all((lo <= t) & (t < hi))
        switched |= instrument(lo, hi) != first
    assert switched.mean() > 0.5
