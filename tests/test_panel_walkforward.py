"""Walk-forward on a panel (issue 29 item 4): date-range splits that cut every instrument at the
same dates, folds planned on the panel's calendar with the instruments each fold keeps, every
instrument's test segments stitched (against hand-computed values), and one end-to-end panel
walk-forward whose folds and held-out evaluation are read back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from jaxdqn import config
from jaxdqn.config import ConfigError
from jaxdqn.evaluation import metrics as metrics_lib
from jaxdqn.evaluation import panel_statistics
from jaxdqn.market import folds, panel, splits
from jaxdqn.market.data import DataError
from jaxdqn.program.trained import evaluate as evaluate_run
from jaxdqn.program.walkforward import driver as walkforward
from jaxdqn.program.walkforward import panel as walkforward_panel

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "configs" / "smoke.yaml"
DATES = [
    "data.split=dates",
    "data.train_dates=[2010-01-04, 2010-06-30]",
    "data.val_dates=[2010-07-06, 2010-09-30]",
    "data.test_dates=[2010-10-01, 2010-12-31]",
]


def _frame(start: str, n: int, freq: str = "B") -> pd.DataFrame:
    index = pd.date_range(start, periods=n, freq=freq, name="date")
    return pd.DataFrame({"close": np.linspace(10.0, 20.0, n)}, index=index)


def test_e2_split_dates_cuts_at_the_configured_dates_bare_days_whole():
    cfg = config.load(None, [*DATES, "data.min_split_rows=2"]).data
    df = _frame("2009-11-02", 400)
    sp = splits.split(df, cfg, warmup=5)
    d = df.index
    assert d[sp.train[0]] == pd.Timestamp("2010-01-04") and d[sp.train[1] - 1] <= pd.Timestamp(
        "2010-06-30"
    )
    assert d[sp.train[1]] > pd.Timestamp("2010-06-30")  # the purge gap: in no split
    assert d[sp.val[0]] == pd.Timestamp("2010-07-06") and d[sp.val[1] - 1] == pd.Timestamp(
        "2010-09-30"
    )
    assert d[sp.test[0]] == pd.Timestamp("2010-10-01") and d[sp.test[1] - 1] == pd.Timestamp(
        "2010-12-31"
    )
    assert sp.test[1] < len(df)  # later bars unused
    assert sp.train[0] > 5  # earlier bars: the features' history only
    # a bare last date holds the whole day of intraday bars; a timestamp stops there
    hourly = _frame("2010-01-04 09:00", 24 * 400, freq="h")
    sp = splits.split(hourly, cfg, warmup=5)
    assert hourly.index[sp.test[1] - 1] == pd.Timestamp("2010-12-31 23:00")
    exact = config.load(
        None, [*DATES[:3], "data.test_dates=['2010-10-01', '2010-12-31T12:00:00']"]
    ).data
    sp = splits.split(hourly, exact, warmup=5)
    assert hourly.index[sp.test[1] - 1] == pd.Timestamp("2010-12-31 12:00")
    # an instrument without bars in a range is refused, naming the range
    with pytest.raises(DataError, match=r"split 'test' is empty: no bars in \['2010-10-01'"):
        splits.split(_frame("2009-11-02", 200), cfg, warmup=5)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.train_dates=[2010-01-04]"], "data.train_dates: split=dates needs [first, last]"),
        (["data.val_dates=[2010-07-06, soon]"], "data.val_dates: not ISO dates"),
        (["data.test_dates=[2010-12-31, 2010-10-01]"], "its last date is before its first"),
        (["data.val_dates=[2010-06-30, 2010-09-30]"], "data.val_dates: must start after"),
        (["data.test_dates=[2010-09-30, 2010-12-31]"], "data.test_dates: must start after"),
    ],
)
def test_e2_split_dates_bad_ranges_are_config_errors(overrides, message):
    with pytest.raises(ConfigError) as info:
        config.load(None, [*DATES, *overrides])
    assert message in str(info.value) and "\n" not in str(info.value)


PANEL = [
    "data.source=synthetic",
    "data.synthetic.num_bars=700",
    "data.synthetic.panel=[{name: long, phi: 0.25, num_bars: 900, start_date: '1999-04-01'},"
    " {name: early, phi: 0.2, vol: 0.02, num_bars: 600}, {name: noise, phi: 0.0}]",
]
FOLDS = [
    "walkforward.mode=rolling",
    "walkforward.unit=bars",
    "walkforward.folds=2",
    "walkforward.train=300",
    "walkforward.val=60",
    "walkforward.test=80",
    "walkforward.purge=5",
    "walkforward.embargo=3",
]


def test_e3_panel_walkforward_plans_on_the_calendar_and_names_short_instruments():
    # early (560 bars from 2000-01-03) ends before fold 1's val: refused by name at min_bars 0
    cfg = config.load(SMOKE, [*PANEL, *FOLDS])
    with pytest.raises(DataError) as info:
        walkforward.make_plan(cfg)
    msg = str(info.value)
    assert msg.startswith("walk-forward fold 1: instrument early: ") and "\n" not in msg
    assert "data.min_bars" in msg
    # ... and dropped from that fold only when data.min_bars says so
    plan = walkforward.make_plan(config.load(SMOKE, [*PANEL, *FOLDS, "data.min_bars=100"]))
    bars = panel.panel_of(plan.cfg.data).bars
    union = pd.DatetimeIndex(sorted(set().union(*(set(b.index) for b in bars))))
    assert plan.dates.equals(union) and len(union) == 900  # long holds every other date
    assert plan.instruments == (("early", "long", "noise"), ("long", "noise"))
    record = walkforward.plan_record(plan)
    assert [f["instruments"] for f in record["folds"]] == [list(m) for m in plan.instruments]
    for f in plan.folds:
        data = walkforward.plan_fold_config(plan, f).data
        assert data.split == "dates" and data.bars_per_year == plan.bar_clock.bars_per_year
        for which in ("train", "val", "test"):
            lo, hi = getattr(f, which)
            want = (folds.stamp(union[lo]), folds.stamp(union[hi - 1]))
            assert getattr(data, f"{which}_dates") == want
    # the test segments follow each other on the calendar up to its last bar
    assert plan.folds[0].test[1] == plan.folds[1].test[0] and plan.folds[1].test[1] == len(union)
    # one instrument's plan is unchanged: bar splits, no instruments in its record
    single = walkforward.make_plan(config.load(SMOKE, FOLDS))
    assert single.instruments is None
    assert "instruments" not in walkforward.plan_record(single)["folds"][0]
    assert walkforward.plan_fold_config(single, single.folds[0]).data.split == "bars"


def _fold(k: int, parts: dict[str, tuple[list[float], list[float]]], seeds: int = 2):
    """A fold's walks: ``parts[name] = (agent returns, buy-and-hold returns)``; seed s's agent
    returns are the given ones times (1 + s)."""
    logs, bases = [], []
    for name, (agent, bh) in parts.items():
        dates = pd.bdate_range(f"{2001 + k}-01-01", periods=len(agent))
        for s in range(seeds):
            r = np.asarray(agent) * (1 + s)
            logs.append(
                pd.DataFrame(
                    {
                        "seed": s,
                        "instrument": name,
                        "date": dates,
                        "return": r,
                        "position": 0.5,
                        "traded": 0.1,
                        "equity": np.cumprod(1 + r),
                    }
                )
            )
        eq = np.cumprod(1 + np.asarray(bh))
        bases.append(pd.DataFrame({"instrument": name, "date": dates, "buy_and_hold": eq}))
    log = pd.concat(logs, ignore_index=True).sort_values(["seed", "instrument"], kind="stable")
    return walkforward_panel.FoldWalks(k, log, pd.concat(bases, ignore_index=True))


def test_e3_panel_walkforward_stitches_each_instrument_over_its_folds_by_hand():
    a0, b0 = [0.01, -0.02, 0.03], [0.02, 0.01, -0.01]
    a1, b1 = [0.005, 0.01], [-0.02, 0.03]
    c0, d0 = [0.0, 0.01, -0.01], [0.01, 0.0, 0.02]
    walks = [_fold(0, {"A": (a0, b0), "C": (c0, d0)}), _fold(1, {"A": (a1, b1)})]
    per, cross, frame = walkforward_panel.stitch_instruments(walks, 252.0, reps=200, seed=1)
    assert list(per) == ["A", "C"]
    assert per["A"]["folds"] == [0, 1] and per["C"]["folds"] == [0]
    assert per["A"]["bars"] == 5 and per["C"]["bars"] == 3
    for s in (0, 1):
        want = metrics_lib.performance(
            np.asarray(a0 + a1) * (1 + s), 252.0, positions=np.full(5, 0.5), traded=np.full(5, 0.1)
        )
        assert per["A"]["test_seeds"][s] == pytest.approx(want, nan_ok=True)
    # equity compounds over the folds: fold 1's segment starts at fold 0's final equity
    fa = frame[frame.instrument == "A"]
    np.testing.assert_allclose(fa["seed_1_equity"], np.cumprod(1 + 2 * np.asarray(a0 + a1)))
    np.testing.assert_allclose(fa["buy_and_hold_return"], b0 + b1, atol=1e-12)
    np.testing.assert_allclose(fa["buy_and_hold_equity"], np.cumprod(1 + np.asarray(b0 + b1)))
    bh = per["A"]["baselines"]["buy_and_hold"]["test"]
    assert bh == pytest.approx(metrics_lib.performance(np.asarray(b0 + b1), 252.0), nan_ok=True)
    # the cross-section is that of the stitched [seed, instrument] Sharpe ratios
    sharpe = np.asarray([[per[n]["test_seeds"][s]["sharpe"] for n in per] for s in (0, 1)])
    ref = np.asarray([per[n]["baselines"]["buy_and_hold"]["test"]["sharpe"] for n in per])
    assert cross == panel_statistics.cross_section_statistics(sharpe, ref, reps=200, seed=1)
    assert cross["mean"]["sharpe"] == pytest.approx(sharpe.mean(axis=0).mean())
    # folds that disagree on their seeds or baselines are refused
    odd = _fold(1, {"A": (a1, b1)}, seeds=1)
    with pytest.raises(ValueError, match="fold 1: its seeds differ"):
        walkforward_panel.stitch_instruments([walks[0], odd], 252.0)


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["JAX_PLATFORMS"] = "cpu"
    return env


FAST = [
    *config.ALL_OFF,
    "train.num_seeds=2",
    "train.epochs=1",
    "train.iterations_per_epoch=2",
    "eval.bootstrap_reps=100",
    "eval.cost_multiples=[1]",
]


@pytest.fixture(scope="module")
def panel_wf(tmp_path_factory):
    """One 2-fold walk-forward on the 3-instrument panel (``early`` dropped from fold 1)."""
    cwd = tmp_path_factory.mktemp("panel_wf")
    args = ["--config", str(SMOKE), *PANEL, "data.min_bars=100", *FOLDS, *FAST]
    cmd = [sys.executable, "-m", "jaxdqn.walkforward", "--no-progress", *args, "--run-dir", "wf"]
    res = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    return cwd / "wf", res


@pytest.mark.slow
def test_e3_panel_walkforward_end_to_end_stitches_portfolio_and_instruments(panel_wf):
    run, res = panel_wf
    result = json.loads((run / "walkforward.json").read_text())
    assert [f["instruments"] for f in result["folds"]] == [
        ["early", "long", "noise"],
        ["long", "noise"],
    ]
    assert "across 3 instruments mean test Sharpe" in res.stdout
    ppy = result["bar_clock"]["bars_per_year"]
    # every fold is a panel run cut at its planned dates, each instrument on its own bars
    plan = json.loads((run / "walkforward_plan.json").read_text())
    for entry in plan["folds"]:
        fdir = run / f"fold_{entry['fold']}"
        fold_cfg = config.load(fdir / "config.yaml")
        assert fold_cfg.data.split == "dates"
        assert list(fold_cfg.data.test_dates) == entry["dates"]["test"]
        log = pd.read_csv(fdir / "eval_test.csv", parse_dates=["date"])
        assert sorted(log["instrument"].unique()) == entry["instruments"]
        first, last = (pd.Timestamp(d) for d in entry["dates"]["test"])
        assert log["date"].min() >= first and log["date"].max() <= last
    # each instrument's stitched Sharpe is that of its folds' test returns, concatenated
    walks = [walkforward_panel.read_fold_walks(k, run / f"fold_{k}") for k in (0, 1)]
    for name, entry in result["instruments"].items():
        for s in (0, 1):
            r = np.concatenate(
                [
                    w.log[(w.log.instrument == name) & (w.log.seed == s)]["return"].to_numpy()
                    for w in walks
                ]
            )
            want = metrics_lib.performance(r, ppy)["sharpe"]
            assert entry["test_seeds"][s]["sharpe"] == pytest.approx(want, rel=1e-9, nan_ok=True)
    assert result["instruments"]["early"]["folds"] == [0]
    stitched = pd.read_csv(run / walkforward_panel.INSTRUMENTS_FILE, parse_dates=["date"])
    assert set(stitched["instrument"]) == {"early", "long", "noise"}
    # the stitched series is the folds' equal-weight portfolios, one after the other
    pf = [pd.read_csv(run / f"fold_{k}" / "portfolio_test.csv") for k in (0, 1)]
    r0 = np.concatenate([p[p.seed == 0]["return"].to_numpy() for p in pf])
    want = metrics_lib.performance(r0, ppy)["sharpe"]
    assert result["stitched"]["seeds"][0]["sharpe"] == pytest.approx(want, rel=1e-9)
    # ... which is the per-date mean of the stitched instruments
    by_date = stitched.groupby("date")["seed_0_return"].mean().to_numpy()
    np.testing.assert_allclose(by_date, r0, rtol=1e-9, atol=1e-12)
    cross = result["panel"]["cross_section"]["test"]
    assert cross["instruments"] == 3 and cross["seeds"] == 2
    report = (run / "walkforward.md").read_text()
    assert "## Panel: 3 instruments" in report and "| early |" in report
    assert "of the panel's calendar" in report


@pytest.mark.slow
def test_e3_evaluate_a_panel_walkforward_on_instruments_it_never_saw(panel_wf, tmp_path):
    from jaxdqn import evaluate

    run, _ = panel_wf
    unseen = (
        "data.synthetic.panel=[{name: fresh, phi: 0.3, seed: 40, num_bars: 900, start_date: "
        "'1999-04-01'}, {name: calm, phi: 0.0, seed: 41, num_bars: 900, start_date: '1999-04-01'}]"
    )
    assert evaluate.main([str(run), "--out", str(tmp_path), unseen]) == 0
    payload = json.loads((tmp_path / "metrics_test.json").read_text())
    assert [f["instruments"] for f in payload["folds"]] == [["calm", "fresh"]] * 2
    plan = json.loads((run / "walkforward_plan.json").read_text())
    ppy = payload["bar_clock"]["bars_per_year"]
    returns = {0: [], 1: []}
    for entry in plan["folds"]:
        # each fold's checkpoint walked the unseen instruments on that fold's own test dates
        fold_out = tmp_path / f"fold_{entry['fold']}"
        log = pd.read_csv(fold_out / "eval_test.csv", parse_dates=["date"])
        first, last = (pd.Timestamp(d) for d in entry["dates"]["test"])
        assert log["date"].min() == first and log["date"].max() == last
        fresh = log[log.instrument == "fresh"]
        for s in (0, 1):
            returns[s].append(fresh[fresh.seed == s]["return"].to_numpy())
    for s in (0, 1):
        want = metrics_lib.performance(np.concatenate(returns[s]), ppy)["sharpe"]
        got = payload["instruments"]["fresh"]["test_seeds"][s]["sharpe"]
        assert got == pytest.approx(want, rel=1e-9, nan_ok=True)
    assert payload["panel"]["cross_section"]["test"]["instruments"] == 2
    assert payload["statistics"]["seeds"][0]["sharpe"] is not None
    assert (tmp_path / walkforward_panel.INSTRUMENTS_FILE).exists()
    # evaluated again with the same overrides: every fold's earlier evaluation is reused
    lines = []
    before = (tmp_path / "metrics_test.json").read_text()
    evaluate_run.evaluate_walkforward(run, "best", [unseen], tmp_path, echo=lines.append)
    assert all(line.endswith("(evaluated earlier, reused)") for line in lines) and len(lines) == 2
    assert (tmp_path / "metrics_test.json").read_text() == before
    lines.clear()
    evaluate_run.evaluate_walkforward(run, "latest", [unseen], tmp_path, echo=lines.append)
    assert not any("reused" in line for line in lines)
    # a walk-forward is evaluated on its test segments only; one instrument's is refused
    with pytest.raises(ConfigError, match="--split val: a walk-forward is evaluated"):
        evaluate._main([str(run), "--split", "val", "--out", str(tmp_path / "v")])
    single = tmp_path / "single"
    single.mkdir()
    plan["folds"] = [{k: v for k, v in f.items() if k != "instruments"} for f in plan["folds"]]
    (single / "walkforward_plan.json").write_text(json.dumps(plan))
    with pytest.raises(ConfigError, match="a walk-forward of one instrument; evaluate one of"):
        evaluate._main([str(single)])
