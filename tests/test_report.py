"""E3 outputs: summary.json, baseline equity files and report.md with its plots
(jaxdqn.program.records.results, jaxdqn.program.report.plots, jaxdqn.program.report.document)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from jaxdqn import config
from jaxdqn.evaluation.baselines import ORACLE_EXECUTIONS
from jaxdqn.evaluation.walk import LOG_COLUMNS, EvalResult
from jaxdqn.market import env
from jaxdqn.program.records.logger import RunLogger
from jaxdqn.program.records.results import (
    read_baseline_equity,
    read_eval_log,
    read_summary,
    write_baseline_equity,
    write_eval_log,
    write_summary,
)
from jaxdqn.program.report import run_statistics
from jaxdqn.program.report.document import write_report
from jaxdqn.program.report.plots import drawdown
from jaxdqn.program.report.training_plots import Markers

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
N_EPOCHS = 6
N_BARS = 40


def _eval_log(dates: pd.DatetimeIndex, equity: np.ndarray) -> pd.DataFrame:
    n = len(dates)
    ret = np.diff(np.concatenate([[1.0], equity])) / np.concatenate([[1.0], equity[:-1]])
    frame = pd.DataFrame(
        {
            "t": np.arange(n) + 100,
            "date": dates,
            "direction": np.full(n, 2),
            "magnitude": np.zeros(n, int),
            "order": np.zeros(n, int),
            "urgency": np.full(n, 2),
            "scale": np.ones(n),
            "target_position": np.ones(n),
            "position": np.ones(n),
            "filled": np.ones(n, bool),
            "expired": np.zeros(n, bool),
            "price": np.full(n, 100.0),
            "traded": np.zeros(n),
            "cost": np.zeros(n),
            "equity": equity,
            "return": ret,
        }
    )
    return frame[list(LOG_COLUMNS)]


def _metrics(sharpe: float) -> dict:
    return {
        "sharpe": sharpe,
        "sortino": float("nan"),
        "max_drawdown": -0.1,
        "annual_return": 0.05,
        "annual_volatility": 0.2,
        "calmar": 0.5,
        "hit_rate": 0.5,
        "turnover": 0.01,
        "exposure": 0.9,
    }


def _make_run(run_dir: Path, seeds: int) -> None:
    """A fake finished run: config, metrics.jsonl, eval and baseline csvs, summary.json."""
    run_dir.mkdir()
    cfg = config.load(overrides=[f"train.num_seeds={seeds}", "model.vsn=false"])
    (run_dir / "config.yaml").write_text(config.dump(cfg))

    rng = np.random.default_rng(0)
    with RunLogger(run_dir, tensorboard=False, console=False) as log:
        for e in range(1, N_EPOCHS + 1):

            def per_seed(v, shape=()):
                x = v + 0.1 * rng.standard_normal((seeds, *shape))
                return x[0] if seeds == 1 else x

            log.log_epoch(
                {
                    "epoch": e,
                    "wall_time": 10.0 * e,
                    "lr": 1e-3 * (0.5 if e >= 4 else 1.0),
                    "loss": per_seed(3.0 - 0.2 * e),
                    # Before learning starts the loss parts are NaN (→ null in the file).
                    "loss_c51": per_seed(2.0) if e > 1 else per_seed(np.nan),
                    "loss_spread": per_seed(-0.01),
                    "q_gap": per_seed(0.1 * e, (4,)),
                    "atom_utilisation": per_seed(0.5),
                    "val_sharpe": per_seed(0.1 * e),
                    "plateau_epochs": 0,
                    "detector": "none",
                    "frozen": [False] * 4,
                    "action": {3: "reset_branches", 5: "rewind"}.get(e, "none"),
                    "rewinds": int(e >= 5),
                    "restart": e == 4,
                    "env_steps_per_s": 1.0e5,
                    "updates_per_s": 300.0,
                }
            )

    dates = pd.bdate_range("2016-01-04", periods=N_BARS)
    base_eq = np.cumprod(1 + 0.001 * rng.standard_normal(N_BARS))
    if seeds == 1:
        write_eval_log(run_dir / "eval_test.csv", _eval_log(dates, base_eq))
    else:
        logs = [_eval_log(dates, base_eq * (1 + 0.01 * s)) for s in range(seeds)]
        write_eval_log(run_dir / "eval_test.csv", logs)
    write_baseline_equity(
        run_dir / "baselines_test.csv",
        dates,
        {"flat": np.ones(N_BARS), "buy_and_hold": np.linspace(1.0, 1.1, N_BARS)},
    )
    summary = {
        "best_epoch": 4,
        "best_step": 1234,
        "epochs": N_EPOCHS,
        "wall_time_s": 3725.0,
        "val": _metrics(1.25),
        "test": _metrics(np.float32(0.5)),
        "baselines": {
            "flat": {"val": _metrics(float("nan")), "test": _metrics(float("nan"))},
            "buy_and_hold": {"val": _metrics(0.75), "test": _metrics(0.9)},
        },
        "jax_version": "0.10.2",
    }
    if seeds > 1:
        summary["seeds"] = [
            {"seed": s, "best_epoch": 3 + s, "val": _metrics(1.0 + s), "test": _metrics(2.0 * s)}
            for s in range(seeds)
        ]
    write_summary(run_dir, summary)


def _images(report: Path) -> list[Path]:
    names = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report.read_text())
    return [report.parent / n for n in names]


def _assert_pngs(paths: list[Path]) -> None:
    for p in paths:
        assert p.is_file(), p
        assert p.read_bytes()[:8] == PNG_MAGIC, p


EXPECTED_PNGS = {
    "equity_test.png",
    "drawdown_test.png",
    "losses.png",
    "val_sharpe.png",
    "learning_rate.png",
    "q_gap.png",
    "atom_utilisation.png",
}


def test_e3_report_single_seed(tmp_path):
    run = tmp_path / "run"
    _make_run(run, seeds=1)
    path = write_report(run)
    assert path == run / "report.md"
    text = path.read_text()
    images = _images(path)
    assert {p.name for p in images} == EXPECTED_PNGS
    _assert_pngs(images)

    # Header: config essentials, epochs and wall time (3725 s = 1:02:05), best checkpoint.
    assert "| components off | loss.spread, model.vsn |" in text  # L3: off by default
    learning = "| learning | γ 0.9, n-step 3, reward scale auto, target polyak, evaluation greedy |"
    assert learning in text
    assert "| epochs / wall time | 6 / 1:02:05 (3725 s) |" in text
    assert "| best checkpoint | epoch 4, step 1234 |" in text
    assert "| jax_version | 0.10.2 |" in text
    assert "median env steps/s 1e+05, updates/s 300" in text
    # Metrics tables: agent then every baseline; NaN printed as nan.
    head = "| strategy | sharpe | sortino | max_drawdown | annual_return | annual_volatility |"
    assert text.count(head) == 2
    assert "| **agent** | 1.250 | nan | -0.100 | 0.050 |" in text
    assert "| **agent** | 0.500 | nan |" in text
    assert "| flat | nan | nan | -0.100 |" in text
    assert "| buy_and_hold | 0.900 |" in text
    assert "6 epochs logged (epochs 1–6); 1 SGDR restarts, 1 branch resets, 1 rewinds." in text


def test_e3_report_without_figures_when_eval_plots_is_false(tmp_path):
    """``eval.plots=false`` (configs/smoke.yaml, the tests' runs): the same tables and lines,
    no PNG written or linked, one line saying the figures are off."""
    run = tmp_path / "run"
    _make_run(run, seeds=1)
    cfg = config.load(overrides=["train.num_seeds=1", "model.vsn=false", "eval.plots=false"])
    (run / "config.yaml").write_text(config.dump(cfg))
    text = write_report(run).read_text()
    assert not list(run.glob("*.png")) and "![" not in text
    assert "_Off (`eval.plots=false`): no equity or training plots._" in text
    assert "| **agent** | 1.250 | nan | -0.100 | 0.050 |" in text
    assert "6 epochs logged (epochs 1–6); 1 SGDR restarts, 1 branch resets, 1 rewinds." in text


def test_e3_report_lists_the_oracle_per_order_type_with_its_execution_chosen_on_val(tmp_path):
    run = tmp_path / "run"
    _make_run(run, seeds=1)
    summary = read_summary(run)
    executions = list(ORACLE_EXECUTIONS)
    for i, name in enumerate(executions):  # val Sharpe 0.1 .. 0.9 in table order
        summary["baselines"][name] = {"val": _metrics(0.1 * (i + 1)), "test": _metrics(2.0 - i)}
    best = executions[-1]  # oracle_limit_then_market_high: best on val, worst on test
    summary["baselines"]["oracle"] = {**summary["baselines"][best], "execution": best}
    write_summary(run, summary)
    text = write_report(run).read_text()
    # the main tables name the oracle with its execution and leave the execution rows out
    label = "| oracle (best execution on val: limit-then-market, high urgency) | 0.900 |"
    assert label in text
    assert "| oracle (best execution on val: limit-then-market, high urgency) | -6.000 |" in text
    assert "| oracle_market_low |" not in text
    # the small table: one row per order type, urgency columns, "val / test", chosen in bold
    assert "### Oracle by execution (Sharpe, val / test)" in text
    assert "| order \\ urgency | low | mid | high |" in text
    assert "| market | 0.100 / 2.000 | 0.200 / 1.000 | 0.300 / 0.000 |" in text
    assert "| limit | 0.400 / -1.000 | 0.500 / -2.000 | 0.600 / -3.000 |" in text
    assert "| limit-then-market | 0.700 / -4.000 | 0.800 / -5.000 | **0.900 / -6.000** |" in text
    # without execution rows (real data) there is no such table
    assert "Oracle by execution" not in _plain(tmp_path)
    with pytest.raises(ValueError, match=r"baselines\.oracle\.execution"):
        write_summary(run, {**summary, "baselines": {"oracle": {"execution": 3}}})


def _plain(tmp_path: Path) -> str:
    run = tmp_path / "plain"
    _make_run(run, seeds=1)
    return write_report(run).read_text()


def test_e3_report_three_seeds(tmp_path):
    run = tmp_path / "run"
    _make_run(run, seeds=3)
    rec = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert len(rec["q_gap"]) == 3 and len(rec["q_gap"][0]) == 4 and rec["loss_c51"] == [None] * 3
    path = write_report(run)
    text = path.read_text()
    images = _images(path)
    assert {p.name for p in images} == EXPECTED_PNGS
    _assert_pngs(images)
    # val Sharpe of seeds 1, 2, 3 → mean 2, sample std 1; test 0, 2, 4 → 2 ± 2.
    assert "| **agent** (mean ± std, 3 seeds) | 2.000 ± 1.000 | nan |" in text
    assert "| **agent** (mean ± std, 3 seeds) | 2.000 ± 2.000 | nan |" in text
    assert "| agent seed 1 (epoch 4) | 2.000 |" in text
    assert "| agent seed 2 (epoch 5) | 4.000 |" in text
    assert "| seed / seeds | 0 / 3 |" in text

    log = read_eval_log(run / "eval_test.csv")
    assert list(log.columns) == ["seed", *LOG_COLUMNS]
    assert sorted(log["seed"].unique()) == [0, 1, 2]
    assert log["date"].dtype.kind == "M"


def test_e3_report_without_summary_or_eval_notes_what_is_missing(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with RunLogger(run, tensorboard=False, console=False) as log:
        for e in (1, 2):
            log.log_epoch({"epoch": e, "wall_time": 65.0 * e, "loss": 1.0 / e, "rewinds": 0})
    text = write_report(run).read_text()
    assert "config.yaml not found" in text
    assert "2 logged / 0:02:10 (no summary.json: the run has not finished)" in text
    assert "_No summary.json: the run has not finished._" in text
    assert "_No eval_test.csv: the agent has not been evaluated on test._" in text
    assert "_validation Sharpe: not in metrics.jsonl._" in text
    images = _images(run / "report.md")
    assert [p.name for p in images] == ["losses.png"]
    _assert_pngs(images)

    # Test evaluated but no baseline file yet, summary without test metrics.
    write_summary(run, {"best_epoch": None, "epochs": 2, "wall_time_s": 130.0, "val": {}})
    write_eval_log(
        run / "eval_test.csv",
        _eval_log(pd.bdate_range("2016-01-04", periods=5), np.linspace(1, 1.04, 5)),
    )
    text = write_report(run).read_text()
    assert "_The agent has not been evaluated on test._" in text
    assert "_No baselines_test.csv: baselines are not drawn._" in text
    _assert_pngs(_images(run / "report.md"))

    with pytest.raises(FileNotFoundError):
        write_report(tmp_path / "nope")


def test_e3_summary_schema_and_null_metrics(tmp_path):
    s = {
        "best_epoch": np.int64(3),
        "best_step": 10,
        "epochs": 5,
        "wall_time_s": np.float32(1.5),
        "val": {"sharpe": np.float32(np.nan), "sortino": 1.0},
        "test": {"sharpe": float("inf")},
        "baselines": {"flat": {"val": {"sharpe": None}}},
        "seeds": [{"seed": 0, "best_epoch": 3, "val": {"sharpe": 0.5}}],
        "device": "cpu",
    }
    path = write_summary(tmp_path, s)
    raw = path.read_text()
    assert "NaN" not in raw and "Infinity" not in raw
    got = read_summary(tmp_path)
    assert got["best_epoch"] == 3 and got["val"] == {"sharpe": None, "sortino": 1.0}
    assert got["test"] == {"sharpe": None} and got["device"] == "cpu"
    assert got["seeds"][0]["val"]["sharpe"] == 0.5
    assert read_summary(tmp_path / "missing") is None

    with pytest.raises(ValueError, match="missing key 'epochs'"):
        write_summary(tmp_path, {"best_epoch": 1, "wall_time_s": 1.0, "val": {}})
    with pytest.raises(ValueError, match=r"summary\.val\.sharpe"):
        write_summary(tmp_path, {**s, "val": {"sharpe": "high"}})
    with pytest.raises(ValueError, match=r"summary\.best_epoch"):
        write_summary(tmp_path, {**s, "best_epoch": 2.5})
    with pytest.raises(ValueError, match=r"seeds\[0\]\.test"):
        write_summary(tmp_path, {**s, "seeds": [{"test": [1.0]}]})


def test_e3_baseline_equity_file_format(tmp_path):
    dates = pd.bdate_range("2016-01-04", periods=3)
    path = write_baseline_equity(
        tmp_path / "baselines_test.csv",
        dates,
        {"flat": [1, 1, 1], "buy_and_hold": [1.0, 1.1, 1.21]},
    )
    assert path.read_text().splitlines() == [
        "date,flat,buy_and_hold",
        "2016-01-04,1.0,1.0",
        "2016-01-05,1.0,1.1",
        "2016-01-06,1.0,1.21",
    ]
    frame = read_baseline_equity(path)
    assert list(frame.columns) == ["flat", "buy_and_hold"]
    assert frame.index[1] == pd.Timestamp("2016-01-05")
    with pytest.raises(ValueError, match=r"flat has shape \(2,\)"):
        write_baseline_equity(tmp_path / "x.csv", dates, {"flat": [1.0, 1.0]})
    with pytest.raises(ValueError, match="no baseline"):
        write_baseline_equity(tmp_path / "x.csv", dates, {})


def test_e3_drawdown_anchored_at_initial_wealth():
    np.testing.assert_allclose(drawdown([1.1, 0.99, 1.21, 0.605]), [0.0, -0.1, 0.0, -0.5])
    np.testing.assert_allclose(drawdown([0.9, 0.95, 1.2]), [-0.1, -0.05, 0.0])
    np.testing.assert_allclose(drawdown([[1.0, 0.5], [2.0, 0.25]]), [[0.0, -0.5], [0.0, -0.75]])


def test_e3_markers_restarts_resets_rewinds():
    recs = [
        {"epoch": 1, "restart": False, "action": "none"},
        {"epoch": 2, "restart": [False, True], "action": ["reset_branches", "none"]},
        {"epoch": 3, "restart": False, "action": ["rewind", "none"]},
        {"epoch": 4, "restart": True, "action": "rewind"},
    ]
    m = Markers(recs)
    assert (m.restarts, m.resets, m.rewinds) == ([2, 4], [2], [3, 4])
    # Without an action field the rewind epochs come from the rewinds counter (summed over seeds).
    counted = Markers(
        [{"epoch": e, "rewinds": r} for e, r in [(1, [0, 0]), (2, [0, 1]), (3, [0, 1])]]
    )
    assert counted.rewinds == [2] and counted.restarts == []


def _stress_walks(seeds: int) -> list[list[EvalResult]]:
    """Fake walks ``[S][M]`` at 0×..3× costs whose Sharpe falls by 0.5 per multiple."""
    return [
        [
            EvalResult(
                log=None,
                metrics={
                    "sharpe": 1.0 + 0.1 * s - 0.5 * k,
                    "annual_return": 0.1 - 0.02 * k,
                    "max_drawdown": -0.1 - 0.01 * k,
                    "annual_turnover": 20.0,
                },
            )
            for k in range(4)
        ]
        for s in range(seeds)
    ]


@pytest.mark.slow
def test_e3_report_statistics_and_cost_stress_sections(tmp_path):
    run = tmp_path / "run"
    _make_run(run, seeds=3)
    summary = read_summary(run)
    seed_logs = [g for _, g in read_eval_log(run / "eval_test.csv").groupby("seed")]
    bars = seed_logs[0]["date"]
    rng = np.random.default_rng(1)
    base_logs = {
        ("flat", "test"): pd.DataFrame({"date": bars, "return": np.zeros(N_BARS)}),
        ("buy_and_hold", "test"): pd.DataFrame(
            {"date": bars, "return": 0.001 * rng.standard_normal(N_BARS)}
        ),
        ("oracle_market_low", "test"): pd.DataFrame({"date": bars, "return": np.ones(N_BARS)}),
    }
    # the DSR's trials: every seed's val Sharpe at every epoch of metrics.jsonl
    trials = run_statistics.selection_trials(run)
    assert trials[0].shape == (3 * N_EPOCHS,)
    assert trials[1].startswith("seeds × checkpoints compared on val: 3 × 6")
    cfg = config.load(overrides=["train.num_seeds=3"])
    stats = run_statistics.split_statistics(
        cfg, seed_logs, base_logs, "test", trials, bars_per_year=252.0, reps=200
    )
    assert set(stats["spa"]["baselines"]) == {"flat", "buy_and_hold"}  # no oracle executions
    assert stats["dsr"]["num_trials"] == 18 and stats["bootstrap"]["seed"] == cfg.eval.key
    summary["statistics"] = {"test": stats}
    multiples = (0.0, 1.0, 2.0, 3.0)
    summary["cost_stress"] = run_statistics.cost_stress_table(
        env.EnvParams(), multiples, _stress_walks(3)
    )
    assert summary["cost_stress"]["rows"][2]["mean"]["sharpe"] == pytest.approx(0.1)
    write_summary(run, summary)
    text = write_report(run).read_text()

    assert "## Statistics" in text and "### test" in text
    row = stats["seeds"][1]
    assert (
        f"| seed 1 | {row['sharpe']:.3f} | [{row['sharpe_low']:.3f}, {row['sharpe_high']:.3f}] "
        f"| {row['psr_zero']:.3f} | {row['psr_reference']:.3f} | {row['dsr']:.3f} |"
    ) in text
    assert f"| **mean of 3 seeds** | {stats['mean']['sharpe']:.3f} | [" in text
    assert "DSR: N = 18 trials (seeds × checkpoints compared on val: 3 × 6" in text
    assert "| baseline | p consistent | p lower | p upper |" in text
    assert "| **agent beats every baseline** (largest p) |" in text
    assert "| some baseline beats the agent (reverse) |" in text
    assert "## Cost stress (test)" in text
    assert (
        "| 2.0× | 2.00 | 2.00 | 0.00 | 0.100 | 0.060 | -0.120 | 20.000 | 0.000 / 0.100 / 0.200 |"
        in text
    )
    images = {p.name for p in _images(run / "report.md")}
    assert images == EXPECTED_PNGS | {"cost_stress.png"}
    _assert_pngs(_images(run / "report.md"))

    # without arch: the reason instead of the SPA table
    bare = {k: v for k, v in stats.items() if k != "spa"}
    bare["unavailable"] = "arch not installed: No module named 'arch'"
    write_summary(run, {**summary, "statistics": {"test": bare}})
    text = write_report(run).read_text()
    assert "_arch not installed: No module named 'arch'._" in text and "Hansen" not in text

    # the schema is checked
    bad = {**stats, "seeds": [{"seed": 0, "sharpe": "high"}]}
    with pytest.raises(ValueError, match=r"statistics\.test\.seeds\[0\]\.sharpe"):
        write_summary(run, {**summary, "statistics": {"test": bad}})
    with pytest.raises(ValueError, match=r"statistics\.test\.dsr\.trials"):
        write_summary(run, {**summary, "statistics": {"test": {**stats, "dsr": {}}}})
    rows = [{**summary["cost_stress"]["rows"][0], "multiple": None}]
    with pytest.raises(ValueError, match=r"cost_stress\.rows\[0\]\.multiple"):
        write_summary(run, {**summary, "cost_stress": {"rows": rows}})
    # baselines walked on other bars are refused
    shifted = {("flat", "test"): pd.DataFrame({"date": bars + pd.Timedelta(days=1), "return": 0.0})}
    with pytest.raises(ValueError, match="bars differ"):
        run_statistics.split_statistics(
            cfg, seed_logs, shifted, "test", trials, bars_per_year=252.0
        )


def test_e3_report_statistics_of_one_seed(tmp_path):
    run = tmp_path / "run"
    _make_run(run, seeds=1)
    log = read_eval_log(run / "eval_test.csv")
    bars = log["date"]
    base = {("buy_and_hold", "test"): pd.DataFrame({"date": bars, "return": log["return"] * 0.5})}
    cfg = config.load()
    trials = run_statistics.selection_trials(run)
    assert trials[0].shape == (N_EPOCHS,)
    stats = run_statistics.split_statistics(
        cfg, [log], base, "test", trials, bars_per_year=252.0, reps=100
    )
    summary = read_summary(run)
    summary["statistics"] = {"test": stats}
    summary["cost_stress"] = run_statistics.cost_stress_table(
        env.EnvParams(), (0.0, 1.0, 2.0, 3.0), _stress_walks(1)
    )
    write_summary(run, summary)
    text = write_report(run).read_text()
    assert "| **mean (1 seed)** |" in text and "sharpe per seed" not in text
    assert "| 0.0× | 0.00 | 0.00 | 0.00 | 1.000 |" in text
    lines = run_statistics.summary_lines(stats)
    assert (
        lines[1].startswith("  seed 0: sharpe ") and "SPA p (consistent): buy_and_hold" in lines[-1]
    )


def test_e3_dsr_trials_are_every_seed_at_every_epoch(tmp_path):
    # the loop logs the seed mean as val_sharpe and each seed's in val_sharpe_seeds
    with RunLogger(tmp_path, tensorboard=False, console=False) as log:
        for e, seeds in enumerate([[0.5, -0.1], [None, 0.3], [0.7, 0.2]], start=1):
            mean = float(np.nanmean([np.nan if v is None else v for v in seeds]))
            log.log_epoch({"epoch": e, "val_sharpe": mean, "val_sharpe_seeds": seeds})
        log.log_epoch({"epoch": 4, "fault": True})  # a fault record carries no validation
    sharpes, what = run_statistics.selection_trials(tmp_path)
    np.testing.assert_allclose(sharpes, [0.5, -0.1, 0.3, 0.7, 0.2])  # the NaN seed dropped
    assert what.startswith("seeds × checkpoints compared on val: 2 × 3")
    assert run_statistics.selection_trials(tmp_path / "none")[0] is None


def test_e3_report_cell_is_the_one_number_format_of_the_metrics_tables():
    from jaxdqn.program.records.formats import cell

    assert cell(3) == "3" and cell(np.int64(7)) == "7"
    assert cell(True) == "true" and cell(False) == "false"
    assert cell(0.12345) == "0.123" and cell(np.float32(-2.0)) == "-2.000"
    assert cell(None) == "nan" and cell(float("nan")) == "nan"
    assert cell(float("inf")) == "inf" and cell(-math.inf) == "-inf"
    assert cell("greedy") == "greedy"
