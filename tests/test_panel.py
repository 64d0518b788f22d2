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


SMALL = (
    "model.bottleneck_dim=16",
    "model.sh1=16",
    "model.sh2=8",
    "model.ah=8",
    "model.vsn_hidden=4",
    "model.denoise_hidden=4",
    "model.xlstm_hidden=4",
    "features.window=4",
)


def _alone(cfg, bars):
    """One instrument's market on its own: (market, eval range) as a one-file run has them."""
    from jaxdqn.market import env, features, market, splits

    first = market.first_decision(cfg)
    sp = splits.split(bars, cfg.data, first)
    feats = features.compute_features(bars, cfg.features, sp.train)
    lo, hi = max(sp.test[0], first), sp.test[1]
    return env.make_market(bars, feats, cfg.env), (max(lo - 1, first), hi)


def test_e3_panel_walks_equal_single_instrument_walks(folder):
    """One vmapped program walks every instrument; each instrument's walk is the walk of that
    instrument alone (its own market, range and key): a signal-following policy with traced
    arrays and the agent's own greedy network policy. The actions are identical; the floats
    agree to float32 rounding (vectorised over instruments, XLA's log/exp and the network's
    products round differently in the last bit: ≤ 1.2e-7 in position, 1e-9 in returns)."""
    import jax

    from jaxdqn.agent.build import build_agent, make_init
    from jaxdqn.evaluation import baselines, cost_stress, panel_walk
    from jaxdqn.evaluation import walk as walk_lib
    from jaxdqn.market import panel_market
    from jaxdqn.program.run.walks import seed_policy_params

    cfg = config.load(None, [*PANEL_CFG, *SMALL])
    pm = panel_market.prepare_panel(cfg, _load(folder))
    agent = build_agent(cfg, pm)
    state = make_init(agent, num_seeds=1)(pm.market, jax.random.split(jax.random.PRNGKey(3), 1))
    rng = np.random.default_rng(0)
    sig = baselines.Signal(
        rng.integers(0, 3, pm.market.num_bars).astype(np.int32),
        rng.uniform(0.2, 1.0, pm.market.num_bars).astype(np.float32),
    )
    key = jax.random.PRNGKey(cfg.eval.key)
    offsets = [i.offset for i in pm.instruments]
    dates = [pm.dates_of(i) for i in range(3)]
    policies = {
        "signal": (baselines.follow_signal, baselines.device_signal(sig)),
        "agent": (agent.acting.eval_policy, seed_policy_params(agent, state, 0)),
    }
    for what, (fn, params) in policies.items():
        walks = panel_walk.stress_walk_panel(
            pm.market,
            pm.env_params,
            pm.ranges("test", walk=True),
            offsets,
            dates,
            fn,
            key,
            (0.0, 1.0),
            periods_per_year=252,
            policy_params=params,
        )
        assert len(walks) == 2 and len(walks[1]) == 3
        for i, inst in enumerate(pm.instruments):
            market, (lo, hi) = _alone(cfg, inst.bars)
            own = params
            if what == "signal":  # the signal's rows of this instrument
                rows = slice(inst.offset, inst.offset + inst.num_bars)
                own = baselines.device_signal(
                    sig._replace(direction=sig.direction[rows], scale=sig.scale[rows])
                )
            for m, k in enumerate((0.0, 1.0)):
                ref = cost_stress.stress_walk(
                    market,
                    pm.env_params,
                    lo,
                    hi,
                    fn,
                    key,
                    dates[i],
                    (k,),
                    periods_per_year=252,
                    policy_params=own,
                )[0]
                got = walks[m][i]
                assert len(got.log) == len(ref.log) == hi - 1 - lo, (what, i)
                pd.testing.assert_frame_equal(
                    got.log, ref.log, check_exact=False, rtol=1e-5, atol=1e-6
                )
                np.testing.assert_array_equal(
                    got.log[["direction", "magnitude", "order", "urgency"]].to_numpy(),
                    ref.log[["direction", "magnitude", "order", "urgency"]].to_numpy(),
                )
                for name, v in ref.metrics.items():
                    # hit_rate counts the bars whose return is non-zero: a return that is zero
                    # in exact arithmetic (a position closed at the previous close) can round
                    # to ±1e-9 in one of the two programs under the suite's test-only code
                    # generation (tests/conftest.py; 2 of 32 such bars once): two bars at most
                    nonzero = int((ref.log["return"] != 0).sum())
                    tol = 2.0 / max(nonzero - 2, 1) if name == "hit_rate" else 1e-7
                    np.testing.assert_allclose(got.metrics[name], v, rtol=1e-4, atol=tol)
        assert tuple(walks[1][0].log.columns) == walk_lib.LOG_COLUMNS
    res = panel_walk.cross_section(walks[1], pm.names, "median")
    assert list(res.log["instrument"].unique()) == list(pm.names)
    sharpe = [w.metrics["sharpe"] for w in walks[1]]
    assert res.metrics["sharpe"] == pytest.approx(float(np.median(sharpe)))
    assert panel_walk.cross_section(walks[1], pm.names).metrics["sharpe"] == pytest.approx(
        float(np.mean(sharpe))
    )


def test_e2_panel_normalises_each_instrument_on_its_own_train_rows_only(folder):
    from jaxdqn.market import panel_market

    cfg = config.load(None, list(PANEL_CFG))
    base = panel_market.prepare_panel(cfg, _load(folder))
    # change KO after its train split and every bar of MSFT: AAPL's features do not move, nor
    # KO's normalisation; KO's train rows moved would move it
    ko = pd.read_parquet(folder / "KO.parquet")
    train_end = base.instruments[1].splits.train[1]
    later = ko.copy()
    later.loc[train_end:, ["open", "high", "low", "close"]] *= 3.0
    later.to_parquet(folder / "KO.parquet", index=False)
    msft = pd.read_csv(folder / "MSFT.csv")
    msft[["open", "high", "low", "close"]] *= 0.5
    msft["volume"] *= 7
    msft.to_csv(folder / "MSFT.csv", index=False)
    moved = panel_market.prepare_panel(cfg, _load(folder))
    a0, a1 = base.instruments[0], moved.instruments[0]
    np.testing.assert_array_equal(a0.features.values, a1.features.values)
    k0, k1 = base.instruments[1], moved.instruments[1]
    np.testing.assert_array_equal(k0.features.mean, k1.features.mean)
    np.testing.assert_array_equal(k0.features.std, k1.features.std)
    early = ko.copy()
    early.loc[: train_end // 2, ["open", "high", "low", "close"]] *= 1.5
    early.loc[: train_end // 2, "volume"] *= 5
    early.to_parquet(folder / "KO.parquet", index=False)
    again = panel_market.prepare_panel(cfg, _load(folder))
    assert not np.array_equal(again.instruments[1].features.mean, k0.features.mean)


def test_e2_panel_min_bars_drops_short_instruments_with_a_note(folder):
    from jaxdqn.market import panel_market

    _bars("2016-01-04", 90, 8).to_csv(folder / "TINY.csv", index=False)
    _bars("2016-01-04", 40, 9).to_csv(folder / "WEE.csv", index=False)
    cfg = config.load(None, [*PANEL_CFG, "data.min_bars=60"])
    pm = panel_market.prepare_panel(cfg, _load(folder))
    assert pm.names == ("AAPL", "KO", "MSFT")
    notes = " | ".join(pm.notes())
    assert "dropped instrument WEE (40 bars < data.min_bars=60)" in notes
    assert "dropped instrument TINY (" in notes  # too short for its splits' warm-up
    cfg = config.load(None, [*PANEL_CFG, "data.min_bars=100000"])
    with pytest.raises(DataError, match="no instrument left"):
        panel_market.prepare_panel(cfg, _load(folder))


def test_e2_synthetic_panel_from_the_config():
    from jaxdqn.market import market

    spec = (
        "data.synthetic.panel=[{name: b, phi: 0.3, num_bars: 600, start_date: '2004-01-05'},"
        " {name: a, vol: 0.02}, {name: c, phi: 0.0, seed: 5}]"
    )
    cfg = config.load(
        None, ["data.source=synthetic", "data.split=fraction", spec, "data.synthetic.num_bars=800"]
    )
    pm = market.prepare(cfg)
    assert pm.is_panel and pm.names == ("a", "b", "c")
    a, b, c = (i.bars for i in pm.instruments)
    assert (len(a), len(b), len(c)) == (800, 600, 800)
    assert b.index[0] == pd.Timestamp("2004-01-05") and a.index[0] == pd.Timestamp("2000-01-03")
    assert "seed=2" in a.attrs["source"] and "seed=1" in b.attrs["source"]  # 0 + 1 + place
    assert "seed=5" in c.attrs["source"] and "phi=0.0" in c.attrs["source"]
    r = np.diff(np.log(a["close"].to_numpy()))
    assert 0.015 < r.std() < 0.025
    # the oracle of a no-signal instrument never trades
    assert np.all(np.asarray(pm.market.oracle)[pm.instruments[2].offset :] == 0)
    for bad, msg in (
        ("data.synthetic.panel=[{name: a}, {name: a}]", "'a' again"),
        ("data.synthetic.panel=[{name: a}]", "list two or more"),
        ("data.synthetic.panel=[{phi: 0.1}, {name: b}]", "needs a name"),
        ("data.synthetic.panel=[{name: a, phy: 0.1}, {name: b}]", r"panel\[0\]\.phy: unknown"),
    ):
        with pytest.raises(config.ConfigError, match=msg):
            config.load(None, ["data.source=synthetic", bad])


def test_e2_panel_reward_units_pool_each_instruments_returns_never_across_two():
    from jaxdqn.agent.resolve import reward_units

    a = np.array([100.0, 101.0, 99.0, 100.5])
    b = np.array([10.0, 10.2, 10.1])  # the jump from a's last to b's first is not a return
    r = np.concatenate([np.diff(np.log(a)), np.diff(np.log(b))])
    scale, unit = reward_units("auto", [a, b])
    assert scale == pytest.approx(1 / np.std(r, ddof=1), rel=1e-12) and unit == 1.0
    assert reward_units("auto", a) == reward_units("auto", [a])


def test_e2_panel_data_instruments_selects_a_subset_by_name(folder):
    from jaxdqn.market import market

    cfg = config.load(None, [*PANEL_CFG, "data.source=csv", f"data.path={folder}"])
    assert market.prepare(cfg).names == ("AAPL", "KO", "MSFT")
    sub = config.load(
        None,
        [*PANEL_CFG, "data.source=csv", f"data.path={folder}", "data.instruments=[MSFT, AAPL]"],
    )
    assert market.prepare(sub).names == ("AAPL", "MSFT")
    bad = config.load(
        None, [*PANEL_CFG, "data.source=csv", f"data.path={folder}", "data.instruments=[MSFT, IBM]"]
    )
    with pytest.raises(DataError, match=r"data\.instruments: IBM not in the panel"):
        market.prepare(bad)
    one = config.load(None, ["data.instruments=[MSFT]"])
    with pytest.raises(config.ConfigError, match="selects instruments of a panel"):
        market.prepare(one)


def test_e3_panel_walk_compiles_once_for_every_instrument_and_parameter_value(folder):
    import jax

    from jaxdqn.evaluation import baselines, panel_walk
    from jaxdqn.market import panel_market

    cfg = config.load(None, list(PANEL_CFG))
    pm = panel_market.prepare_panel(cfg, _load(folder))
    args = (
        pm.market,
        pm.env_params,
        pm.ranges("val", walk=True),
        [i.offset for i in pm.instruments],
        [pm.dates_of(i) for i in range(3)],
        baselines.follow_signal,
        jax.random.PRNGKey(0),
    )
    n = pm.market.num_bars
    sig = lambda d: baselines.device_signal(
        baselines.Signal(np.full(n, d, np.int32), np.ones(n, np.float32))
    )
    panel_walk.stress_walk_panel(*args, (1.0,), policy_params=sig(2))
    before = panel_walk._rollouts_jit._cache_size()
    out = panel_walk.stress_walk_panel(*args, (0.0, 2.0), policy_params=sig(0))
    assert panel_walk._rollouts_jit._cache_size() == before  # no new compilation
    assert all(len(w) == 3 for w in out)
    assert all((w.log["direction"] == 0).all() for w in out[0])
