"""E3 baselines: each baseline's position path, and the command-line table."""

from __future__ import annotations

import functools
import math
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pandas as pd
import pytest

from jaxdqn import baselines as baselines_cli
from jaxdqn import config
from jaxdqn.evaluation import baselines
from jaxdqn.evaluation import walk as evaluate
from jaxdqn.market import market as market_setup

REPO = Path(__file__).resolve().parents[1]
SYNTHETIC = (
    "data.source=synthetic",
    "data.split=fraction",
    "data.train_frac=0.5",
    "data.val_frac=0.1",
    "data.synthetic.num_bars=2500",
    "data.synthetic.phi=0.3",
)


@functools.cache
def _prepared(overrides: tuple[str, ...] = ()) -> tuple[config.Config, market_setup.Prepared]:
    cfg = config.load(None, overrides)
    return cfg, market_setup.prepare(cfg)


def _walk(name: str, split: str = "val", overrides: tuple[str, ...] = (), key: int | None = None):
    cfg, p = _prepared(overrides)
    policy = baselines.policies(p.market, p.env_params, cfg, bars_per_year=p.bars_per_year)[name]
    lo, hi = p.eval_range(split)
    k = jax.random.PRNGKey(cfg.eval.key if key is None else key)
    return evaluate.walk(p.market, p.env_params, lo, hi, policy, k, p.dates)


def test_e3_flat_never_trades_and_equity_stays_one():
    log = _walk("flat").log
    assert (log["direction"] == 1).all()
    assert (log["traded"] == 0).all() and not log["filled"].any()
    assert (log["position"] == 0).all() and (log["equity"] == 1.0).all()


def test_e3_buy_and_hold_is_long_from_the_first_bar_and_stops_trading():
    _, p = _prepared()
    lo, hi = p.eval_range("val")
    log = _walk("buy_and_hold").log
    assert (log["direction"] == 2).all() and (log["order"] == 0).all()
    assert (log["urgency"] == 2).all()  # market order at the next open
    np.testing.assert_allclose(log["position"], 1.0, atol=5e-4)
    # The first order buys 1 of equity at close[lo] and fills at open[lo+1].
    o1, c0 = p.df["open"].iloc[lo + 1], p.df["close"].iloc[lo]
    assert log["price"].iloc[0] == pytest.approx(o1, rel=1e-6)
    assert log["traded"].iloc[0] == pytest.approx(o1 / c0, rel=1e-5)
    # Then at most a trim of the fill's cost and gap (sized at close[t], filled at the open)
    # on the next bars, and never another order once the account holds no cash.
    trades = np.flatnonzero(log["traded"].to_numpy() > 0)
    assert trades[0] == 0 and trades[-1] < 5
    assert log["traded"].iloc[1:].max() < 2e-3
    # Holding the index: equity follows close / first fill price, less the costs.
    closes = p.df["close"].to_numpy()[lo + 1 : hi]
    np.testing.assert_allclose(log["equity"], closes / o1 * (1 - 2e-4), rtol=2e-3)


def test_e3_momentum_direction_is_the_sign_of_the_252_bar_log_return():
    _, p = _prepared()
    close = p.df["close"].to_numpy()
    for split in ("val", "test"):
        log = _walk("momentum", split).log
        t = log["t"].to_numpy()
        by_hand = np.sign(np.log(close[t] / close[t - 252]))
        np.testing.assert_array_equal(log["direction"] - 1, by_hand)
        assert (log["direction"] == 0).any() and (log["direction"] == 2).any()
    # hand-built: lookback 2 over closes 1, 2, 3, 2, 1, 1, 4
    sig = baselines.momentum_signal(np.array([1, 2, 3, 2, 1, 1, 4.0]), 2)
    np.testing.assert_array_equal(sig.direction, [1, 1, 2, 1, 0, 0, 2])
    np.testing.assert_array_equal(sig.scale, np.ones(7))


def test_e3_macd_on_hand_computed_emas():
    # fast = 1 (EMA = close), slow = 3 (alpha 1/2), signal = 2 (alpha 2/3); warm-up 3 + 2 bars.
    close = np.array([10, 12, 11, 15, 14, 13, 12, 13, 15.0])
    slow = [10.0]
    for c in close[1:]:
        slow.append(0.5 * c + 0.5 * slow[-1])
    line = close - np.array(slow)  # 0, 1, 0, 2, .5, -.25, -.625, .1875, 1.09375
    sig = [line[0]]
    for m in line[1:]:
        sig.append(2 / 3 * m + 1 / 3 * sig[-1])
    expected = np.sign(line - np.array(sig))
    expected[:5] = 0
    np.testing.assert_array_equal(expected, [0, 0, 0, 0, 0, -1, -1, 1, 1])
    got = baselines.macd_signal(close, fast=1, slow=3, signal=2)
    np.testing.assert_array_equal(got.direction, expected + 1)
    long_flat = baselines.macd_signal(close, fast=1, slow=3, signal=2, long_short=False)
    np.testing.assert_array_equal(long_flat.direction, [1, 1, 1, 1, 1, 1, 1, 2, 2])


def test_e3_macd_is_causal_and_follows_the_walk():
    _, p = _prepared()
    close = p.df["close"].to_numpy()
    full = baselines.macd_signal(close, 12, 26, 9).direction
    t = 3000
    changed = close.copy()
    changed[t + 1 :] *= np.linspace(0.5, 2.0, close.size - t - 1)
    np.testing.assert_array_equal(
        baselines.macd_signal(changed, 12, 26, 9).direction[: t + 1], full[: t + 1]
    )
    log = _walk("macd").log
    cfg, _ = _prepared()
    sig = baselines.signals(p.market, p.env_params, cfg, bars_per_year=p.bars_per_year)[
        "macd"
    ].direction
    np.testing.assert_array_equal(log["direction"], sig[log["t"]])
    assert set(log["direction"]) == {0, 2}


@pytest.mark.parametrize("leverage", [1.0, 2.0])
def test_e3_vol_target_scale_is_the_formula_capped_by_max_leverage(leverage):
    overrides = (f"env.max_leverage={leverage}",)
    _, p = _prepared(overrides)
    log = _walk("vol_target", overrides=overrides).log
    sigma = np.asarray(p.market.sigma, np.float64)[log["t"]]
    weight = 0.10 / (sigma * math.sqrt(252))  # annual vol target / annualised sigma_t
    np.testing.assert_allclose(log["scale"], weight / leverage, rtol=1e-6)
    np.testing.assert_allclose(log["target_position"], np.minimum(weight, leverage), rtol=1e-6)
    assert (log["direction"] == 2).all()
    if leverage == 1.0:
        assert (weight > 1).any() and (weight < 1).any()  # both sides of the cap are exercised


def test_e3_random_is_reproducible_with_its_key_and_differs_with_another():
    a = _walk("random").log
    b = _walk("random").log
    c = _walk("random", key=99).log
    pd.testing.assert_frame_equal(a, b)
    branches = ["direction", "magnitude", "order", "urgency"]
    assert not (a[branches].to_numpy() == c[branches].to_numpy()).all()
    for col in branches:  # uniform over {0, 1, 2}: each value about a third of ~755 bars
        counts = a[col].value_counts()
        assert set(counts.index) == {0, 1, 2} and counts.min() > 200, col


def test_e3_oracle_follows_the_oracle_column_and_beats_random_on_synthetic():
    cfg, p = _prepared(SYNTHETIC)
    assert "oracle" in baselines.policies(
        p.market, p.env_params, cfg, bars_per_year=p.bars_per_year
    )
    for split in ("val", "test"):
        oracle = _walk("oracle", split, SYNTHETIC)
        rand = _walk("random", split, SYNTHETIC)
        t = oracle.log["t"].to_numpy()
        np.testing.assert_array_equal(oracle.log["direction"] - 1, p.df["oracle"].to_numpy()[t])
        assert oracle.metrics["sharpe"] > rand.metrics["sharpe"] + 1.0
        assert oracle.metrics["sharpe"] > 2.0
    cfg_real, p_real = _prepared()
    assert "oracle" not in baselines.policies(
        p_real.market, p_real.env_params, cfg_real, bars_per_year=p_real.bars_per_year
    )


def test_e3_run_baselines_table_matches_single_walks():
    cfg, p = _prepared(SYNTHETIC)
    table = baselines.run_baselines(cfg, p)
    assert list(table.index) == [*baselines.BASELINE_NAMES, *baselines.ORACLE_EXECUTIONS]
    assert set(table.columns.get_level_values("split")) == {"val", "test"}
    # the shared-compilation path (policy_params) equals the closure path
    walked = _walk("momentum", "test", SYNTHETIC).metrics
    assert table.loc["momentum", ("test", "sharpe")] == walked["sharpe"]
    assert table.loc["momentum", ("test", "turnover")] == walked["turnover"]


def test_e3_oracle_best_execution_selected_on_val():
    cfg, p = _prepared(SYNTHETIC)
    logs: dict[tuple[str, str], pd.DataFrame] = {}
    table = baselines.run_baselines(cfg, p, logs=logs)
    names = list(baselines.ORACLE_EXECUTIONS)
    # every execution: order type {market, limit, limit_then_market} x urgency {low, mid, high}
    assert len(names) == 9 and set(names) <= set(table.index)
    assert {"oracle_market_high", "oracle_limit_low", "oracle_limit_then_market_mid"} <= set(names)
    for name, (order, urgency) in baselines.ORACLE_EXECUTIONS.items():
        log = logs[(name, "test")]
        assert (log["order"] == order).all() and (log["urgency"] == urgency).all(), name
        assert (log["magnitude"] == 2).all() and (log["scale"] == 1.0).all()
        t = log["t"].to_numpy()
        np.testing.assert_array_equal(log["direction"] - 1, p.df["oracle"].to_numpy()[t])
    # the oracle row is the execution with the best val Sharpe, with that execution's test
    # numbers, and says which one it is
    val = table.loc[names, ("val", "sharpe")]
    best = val.idxmax()
    assert baselines.oracle_execution(table) == best
    pd.testing.assert_series_equal(table.loc["oracle"], table.loc[best], check_names=False)
    pd.testing.assert_frame_equal(logs[("oracle", "test")], logs[(best, "test")])
    assert table.loc["oracle", ("val", "sharpe")] == val.max()
    # limit fills are no longer free: the plain deep limit misses moves the oracle wanted
    assert table.loc["oracle_limit_low", ("val", "sharpe")] < val.max()
    # never selected on test: walking test only chooses the same execution (on val walks that
    # are not reported) whatever test says
    only_test = baselines.run_baselines(cfg, p, splits=("test",))
    assert set(only_test.columns.get_level_values("split")) == {"test"}
    assert baselines.oracle_execution(only_test) == best
    pd.testing.assert_series_equal(
        only_test.loc["oracle", "test"], table.loc[best, "test"], check_names=False
    )
    # a row equals the single walk of its policy
    walked = _walk("oracle_limit_high", "test", SYNTHETIC).metrics
    assert table.loc["oracle_limit_high", ("test", "sharpe")] == walked["sharpe"]
    assert baselines.describe_execution("oracle_limit_then_market_low") == (
        "limit-then-market, low urgency"
    )
    # no oracle on real data: no execution rows, no choice
    cfg_real, p_real = _prepared()
    real = baselines.run_baselines(cfg_real, p_real, splits=("val",))
    assert list(real.index) == [n for n in baselines.BASELINE_NAMES if n != "oracle"]
    assert baselines.oracle_execution(real) is None


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    return subprocess.run(
        [sys.executable, "-m", "jaxdqn.baselines", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=300,
    )


@pytest.mark.slow
def test_e3_cli_prints_every_baseline_for_val_and_test():
    proc = _run_cli(*SYNTHETIC)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "val:" in out and "test:" in out
    first_words = [line.split()[0] for line in out.splitlines() if line.strip()]
    for name in [*baselines.BASELINE_NAMES, *baselines.ORACLE_EXECUTIONS]:
        assert first_words.count(name) == 2, name  # one row per split
    assert "best execution of the oracle's direction on val (the oracle row): " in out
    for metric in baselines.TABLE_METRICS:
        assert metric in out


@pytest.mark.slow
def test_e3_cli_bad_key_exits_2_with_one_line():
    proc = _run_cli("env.no_such_key=1")
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no_such_key" in lines[0], proc.stderr


def test_e3_cli_data_error_exits_2_with_one_line(capsys, tmp_path):
    code = baselines_cli.main(["data.source=csv", f"data.path={tmp_path / 'missing.csv'}"])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "missing.csv" in err


def test_e3_cli_help_lists_every_config_key(capsys):
    with pytest.raises(SystemExit) as exc:
        baselines_cli.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for key, default, _help in config.describe():
        line = next((ln for ln in out.splitlines() if ln.split()[:1] == [key]), None)
        assert line is not None, key
        assert default in line, key


def test_e3_close_only_synthetic_market_every_oracle_execution_fills_at_market_now():
    """On close-only bars every execution of the oracle (and of every baseline) is held at
    market, high urgency: the nine oracle executions give one and the same walk."""
    cfg, p = _prepared((*SYNTHETIC, "data.close_only=true"))
    assert p.close_only and p.env_params.hold_orders
    np.testing.assert_array_equal(p.df["open"].to_numpy()[1:], p.df["close"].to_numpy()[:-1])
    logs = {}
    table = baselines.run_baselines(cfg, p, splits=("test",), logs=logs)
    ref = logs[("oracle_market_high", "test")]
    for name in baselines.ORACLE_EXECUTIONS:
        log = logs[(name, "test")]
        assert (log["order"] == 0).all() and (log["urgency"] == 2).all(), name
        pd.testing.assert_frame_equal(log, ref)
    assert (logs[("random", "test")]["order"] == 0).all()
    assert table.loc["oracle", ("test", "sharpe")] > 1.0  # the planted edge is still there
