"""Walk-forward (issue 14 item 2): the fold arithmetic (purge, embargo, out of sample), the bar
splits it trains on, the stitched series, the per-fold table and resume after kill −9.

The end-to-end runs use the smoke config with every component off (a small program that
compiles fast), two seeds, two rolling folds of a few dozen bars and two short epochs."""

import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sigkill import kill_when_exists

from jaxdqn import config as C
from jaxdqn.evaluation import metrics
from jaxdqn.market import data, folds
from jaxdqn.market import features as features_lib
from jaxdqn.market import market as market_lib
from jaxdqn.program.walkforward import driver as walkforward

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "configs" / "smoke.yaml"
FOLDS = [
    "walkforward.mode=rolling",
    "walkforward.unit=bars",
    "walkforward.folds=2",
    "walkforward.train=400",
    "walkforward.val=40",
    "walkforward.test=60",
    "walkforward.purge=5",
    "walkforward.embargo=3",
]
FAST = [
    *C.ALL_OFF,
    "train.num_seeds=2",
    "train.epochs=2",
    "train.iterations_per_epoch=3",
    "eval.bootstrap_reps=100",
    "eval.cost_multiples=[1]",
]
ARGS = ["--config", str(SMOKE), *FOLDS, *FAST]
RESULT = "walkforward.json"


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["JAX_PLATFORMS"] = "cpu"
    return env


def _walkforward(args, cwd, **kw):
    cmd = [sys.executable, "-m", "jaxdqn.walkforward", "--no-progress", *args]
    return subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, **kw)


def _sp500_dates() -> pd.DatetimeIndex:
    return pd.DatetimeIndex(data.load(C.Config().data).index)


def _check_layout(plan, n, w):
    """Folds never overlap: consecutive test segments up to the last bar, exactly ``purge``
    bars between train and val and between val and test, every test strictly after its train
    and val, and no train range holding a bar of an earlier fold's embargo."""
    assert plan[-1].test[1] == n
    for a, b in itertools.pairwise(plan):
        assert a.test[1] == b.test[0]  # consecutive, disjoint
    zones = folds.embargo_zones(plan, w.embargo)
    for k, f in enumerate(plan):
        assert 0 <= f.train[0] < f.train[1] <= f.val[0] < f.val[1] <= f.test[0] < f.test[1]
        assert f.val[0] - f.train[1] == w.purge and f.test[0] - f.val[1] == w.purge
        assert max(f.train[1], f.val[1]) <= f.test[0]  # out of sample, strictly after
        for lo, hi in zones[:k]:
            assert hi == lo or f.train[1] <= lo or f.train[0] >= hi, (k, f.train, (lo, hi))
        for later in plan[k + 1 :]:  # no test bar of this fold is in a later fold's test
            assert set(range(*f.test)).isdisjoint(range(*later.test))


def test_e3_walkforward_folds_never_overlap_and_respect_purge_and_embargo():
    dates = _sp500_dates()
    n = len(dates)
    # bars: the lengths are exact
    over = ["walkforward.unit=bars", "walkforward.val=100", "walkforward.test=150"]
    for extra in (["walkforward.folds=5"], ["walkforward.folds=3", "walkforward.purge=0"]):
        w = C.load(None, [*over, *extra]).walkforward
        plan = folds.plan_folds(dates, w)
        assert len(plan) == w.folds
        _check_layout(plan, n, w)
        for f in plan:
            assert f.train[0] == 0  # anchored
            assert f.val[1] - f.val[0] == 100 and f.test[1] - f.test[0] == 150
        assert [f.test[0] for f in plan] == [n - (w.folds - k) * 150 for k in range(w.folds)]

    # the acceptance layout: 4 anchored folds, val and test one year, purge 5: calendar years
    w = C.load(None, ["walkforward.folds=4", "walkforward.val=1", "walkforward.test=1"]).walkforward
    plan = folds.plan_folds(dates, w)
    _check_layout(plan, n, w)
    for f, year in zip(plan, (2015, 2016, 2017, 2018), strict=True):
        test = dates[f.test[0] : f.test[1]]
        assert (test.year == year).all() and (dates[f.test[0] - 1].year == year - 1)
        assert f.test[1] == n or dates[f.test[1]].year == year + 1
        last_val = dates[f.val[1] - 1]  # val: the year up to its last bar
        assert dates[f.val[0]] > last_val - pd.DateOffset(years=1) >= dates[f.val[0] - 1]

    # rolling with an embargo that binds: a test segment longer than val + 2 purge puts the end
    # of fold k's test inside fold k + 2's window, whose start then moves past the embargo
    over = ["walkforward.mode=rolling", "walkforward.unit=bars", "walkforward.folds=4"]
    over += ["walkforward.train=600", "walkforward.val=100", "walkforward.test=250"]
    w = C.load(None, [*over, "walkforward.embargo=20"]).walkforward
    plan = folds.plan_folds(dates, w)
    _check_layout(plan, n, w)
    free = folds.plan_folds(dates, C.load(None, [*over, "walkforward.embargo=0"]).walkforward)
    assert [f.test for f in plan] == [f.test for f in free]
    assert [f.val for f in plan] == [f.val for f in free]
    assert [f.train[1] - f.train[0] for f in free] == [600] * 4
    moved = [k for k in range(4) if plan[k].train != free[k].train]
    assert moved == [2, 3]
    for k in moved:  # starts right after the embargo of the test segment its window held
        assert plan[k].train[0] == plan[k - 2].test[1] + 20
        assert plan[k].train[1] == free[k].train[1]


@pytest.mark.slow
def test_e3_walkforward_bad_settings_are_config_or_data_errors(tmp_path):
    bad = [
        (["walkforward.embargo=3"], "walkforward.embargo: anchored folds"),
        (["walkforward.mode=rolling"], "walkforward.train: must be > 0"),
        (["walkforward.train=2"], "walkforward.train: only rolling folds"),
        (["walkforward.unit=bars", "walkforward.test=10.5"], "a whole number of bars"),
        (["walkforward.val=0.3"], "a whole number of months"),
        (["walkforward.test=0"], "walkforward.test: must be > 0"),
        (["walkforward.folds=0"], "walkforward.folds: must be >= 1"),
        (["walkforward.purge=-1"], "walkforward.purge: must be >= 0"),
        (["eval.cost_multiples=[0, 2]"], "eval.cost_multiples: need numbers >= 0 that include 1"),
        (["eval.cost_multiples=[2, 1]"], "eval.cost_multiples: must be increasing"),
        (["eval.cost_multiples=[-1, 1]"], "eval.cost_multiples: need numbers >= 0"),
        (["eval.bootstrap_reps=5"], "eval.bootstrap_reps: must be >= 10"),
        (["data.split=bars"], "data.train_bars: split=bars needs [start, stop)"),
        (
            ["data.split=bars", "data.train_bars=[0, 900]", "data.val_bars=[800, 1000]"],
            "data.test_bars: split=bars needs",
        ),
        (
            [
                "data.split=bars",
                "data.train_bars=[0, 900]",
                "data.val_bars=[800, 1000]",
                "data.test_bars=[1000, 1100]",
            ],
            "data.val_bars: must start at or after the end of data.train_bars",
        ),
    ]
    for overrides, fragment in bad:
        with pytest.raises(C.ConfigError) as e:
            C.load(None, overrides)
        assert fragment in str(e.value) and "\n" not in str(e.value), (overrides, str(e.value))
    assert C.Config().eval.cost_multiples == (0.0, 1.0, 2.0, 3.0)
    assert C.Config().eval.bootstrap_reps == 1000
    # more folds than the data holds: a DataError naming what is missing
    for overrides, fragment in [
        (["walkforward.folds=30"], "need bars from"),
        (["walkforward.unit=bars", "walkforward.test=1000", "walkforward.val=2000"], "fold 0"),
        (["walkforward.mode=rolling", "walkforward.train=15"], "train window"),
    ]:
        with pytest.raises(data.DataError, match=fragment):
            walkforward.make_plan(C.load(None, overrides))
    # the program: one line on stderr, exit code 2, nothing trained
    res = _walkforward(["--run-dir", "wf", "walkforward.folds=30"], tmp_path, timeout=300)
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "jaxdqn.walkforward: error: walk-forward: 30 test segments" in res.stderr
    assert not (tmp_path / "wf").exists()
    res = _walkforward(["--resume", "nowhere", "train.epochs=3"], tmp_path, timeout=300)
    assert res.returncode == 2 and "--resume: takes the walk-forward's own config" in res.stderr


def test_e3_walkforward_fold_splits_purge_bars_and_normalise_on_their_own_train():
    cfg = C.load(SMOKE, [*FOLDS, *C.ALL_OFF])
    plan = walkforward.make_plan(cfg)
    for f in plan.folds:
        fold_cfg = walkforward.fold_config(cfg, f)
        assert fold_cfg.data.split == "bars" and fold_cfg.walkforward == cfg.walkforward
        p = market_lib.prepare(fold_cfg)
        assert tuple(p.splits) == (f.train, f.val, f.test)
        # the env trains on [train.start, train.stop): its last reward is on bar train.stop − 1
        assert p.bar_range("train") == f.train
        # a walk over val / test realises returns on exactly the split's bars: the purged bars
        # between them belong to no split
        for split in ("val", "test"):
            lo, hi = p.eval_range(split)
            assert (lo + 1, hi) == getattr(f, split)
        # features: normalised with the fold's own train rows only; bars after the train split
        # (its purge, val, test and the later folds) change no statistic and no earlier row
        df = p.df
        future = df.copy()
        scale = np.linspace(1.0, 1.5, len(df) - f.train[1])
        for col in ("open", "high", "low", "close"):
            future.iloc[f.train[1] :, future.columns.get_loc(col)] *= scale
        future.iloc[f.train[1] :, future.columns.get_loc("volume")] *= 3.0
        other = features_lib.compute_features(future, fold_cfg.features, f.train)
        np.testing.assert_array_equal(other.mean, p.features.mean)
        np.testing.assert_array_equal(other.std, p.features.std)
        np.testing.assert_array_equal(
            other.values[: f.train[1]], np.asarray(p.features.values)[: f.train[1]]
        )
        raw, _ = features_lib.raw_features(df, fold_cfg.features)
        rows = raw[max(f.train[0], p.features.warmup) : f.train[1]]
        np.testing.assert_allclose(p.features.mean, rows.mean(axis=0), rtol=1e-12)
    # a range past the last bar is a data error
    bad = C.load(
        SMOKE,
        [
            "data.split=bars",
            "data.train_bars=[0, 4000]",
            "data.val_bars=[4005, 4500]",
            "data.test_bars=[4505, 6000]",
        ],
    )
    with pytest.raises(data.DataError, match="runs past the last of 5031 rows"):
        market_lib.prepare(bad)


@pytest.fixture(scope="module")
def wf_run(tmp_path_factory):
    """One uninterrupted walk-forward (also the reference of the resume test)."""
    cwd = tmp_path_factory.mktemp("wf")
    res = _walkforward([*ARGS, "--run-dir", "wf"], cwd, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    run = cwd / "wf"
    return run, json.loads((run / "walkforward.json").read_text()), res


@pytest.mark.slow
def test_e3_walkforward_writes_its_results_and_every_fold_is_a_run_dir(wf_run):
    run, result, res = wf_run
    for name in (
        "config.yaml",
        "walkforward_plan.json",
        "walkforward.json",
        "walkforward.md",
        "stitched_test.csv",
        "equity_stitched.png",
        "drawdown_stitched.png",
        "walkforward_folds.png",
    ):
        assert (run / name).is_file(), name
    plan = json.loads((run / "walkforward_plan.json").read_text())
    assert len(result["folds"]) == len(plan["folds"]) == 2
    for k, fold in enumerate(plan["folds"]):
        fdir = run / f"fold_{k}"
        for name in ("summary.json", "report.md", "eval_test.csv", "baselines_test.csv"):
            assert (fdir / name).is_file(), (k, name)
        fold_cfg = C.load(fdir / "config.yaml")
        assert fold_cfg.data.split == "bars"
        bars = fold["bars"]
        ranges = (fold_cfg.data.train_bars, fold_cfg.data.val_bars, fold_cfg.data.test_bars)
        assert ranges == tuple(tuple(bars[s]) for s in ("train", "val", "test"))
        assert fold_cfg.train.num_seeds == 2 and fold_cfg.seed == C.load(run / "config.yaml").seed
        # one bar clock for every fold and the stitched numbers (fold 0's train split)
        assert fold_cfg.data.bars_per_year == plan["bar_clock"]["bars_per_year"] == 252.0
        assert json.loads((fdir / "summary.json").read_text())["bar_clock"]["bars_per_year"] == 252
    assert plan["bar_clock"]["inferred"] and result["bar_clock"] == plan["bar_clock"]
    report = (run / "walkforward.md").read_text()
    for part in ("## Folds", "## Stitched out-of-sample test", "Hansen's SPA", "walkforward_folds"):
        assert part in report
    assert "fold 2/2" in res.stdout and "done: 2 folds" in res.stdout


def test_e3_walkforward_test_segments_are_out_of_sample(wf_run):
    run, result, _ = wf_run
    dates = _sp500_dates()
    for fold in result["folds"]:
        fdir = run / fold["dir"]
        tr, va, te = (fold["bars"][s] for s in ("train", "val", "test"))
        test = pd.read_csv(fdir / "eval_test.csv", parse_dates=["date"])
        val = pd.read_csv(fdir / "eval_val.csv", parse_dates=["date"])
        for s in (0, 1):
            t = test.loc[test["seed"] == s]
            # decisions from the bar before the segment; returns on its bars, nothing else
            assert t["t"].tolist() == list(range(te[0] - 1, te[1] - 1))
            assert (t["date"].to_numpy() == dates[te[0] : te[1]].to_numpy()).all()
            v = val.loc[val["seed"] == s]
            assert (v["date"].to_numpy() == dates[va[0] : va[1]].to_numpy()).all()
        # strictly after the train and val bars, with the purged bars between
        assert test["date"].min() > val["date"].max() > dates[tr[1] - 1]
        assert (dates[va[1] : te[0]] < test["date"].min()).all() and te[0] - va[1] == 5
    stitched = pd.read_csv(run / "stitched_test.csv", parse_dates=["date"])
    first, last = result["folds"][0]["bars"]["test"][0], result["folds"][-1]["bars"]["test"][1]
    assert (stitched["date"].to_numpy() == dates[first:last].to_numpy()).all()
    assert last == len(dates)


def test_e3_walkforward_stitched_equity_is_the_product_of_fold_growth(wf_run):
    run, result, _ = wf_run
    stitched = pd.read_csv(run / "stitched_test.csv", parse_dates=["date"])
    names = list(result["stitched"]["baselines"])
    for s in (0, 1):
        growth = 1.0
        for k, fold in enumerate(result["folds"]):
            log = pd.read_csv(run / fold["dir"] / "eval_test.csv")
            seg = log.loc[log["seed"] == s]
            part = stitched.loc[stitched["fold"] == k]
            np.testing.assert_allclose(
                part[f"seed_{s}_equity"], growth * seg["equity"].to_numpy(), rtol=1e-12
            )
            np.testing.assert_array_equal(part[f"seed_{s}_return"], seg["return"])
            growth *= seg["equity"].iloc[-1]
            assert fold["test_growth_seeds"][s] == pytest.approx(seg["equity"].iloc[-1], 1e-12)
        eq = stitched[f"seed_{s}_equity"].to_numpy()
        assert eq[-1] == pytest.approx(growth, rel=1e-12)
        assert eq[-1] == pytest.approx(
            np.prod([f["test_growth_seeds"][s] for f in result["folds"]])
        )
        # (the environment keeps equity in float32: compounding its returns agrees to ~1e-7)
        np.testing.assert_allclose(eq, np.cumprod(1 + stitched[f"seed_{s}_return"]), rtol=1e-5)
        got = result["stitched"]["seeds"][s]
        want = metrics.performance(stitched[f"seed_{s}_return"], 252)
        for key in ("sharpe", "annual_return", "max_drawdown", "sortino"):
            assert got[key] == pytest.approx(want[key], rel=1e-12, abs=1e-12), key
    for name in names:  # the baselines through the same folds, stitched the same way
        growth = 1.0
        for k, fold in enumerate(result["folds"]):
            base = pd.read_csv(run / fold["dir"] / "baselines_test.csv")
            part = stitched.loc[stitched["fold"] == k]
            np.testing.assert_allclose(part[f"{name}_equity"], growth * base[name], rtol=1e-12)
            growth *= base[name].iloc[-1]
        np.testing.assert_allclose(
            stitched[f"{name}_equity"], np.cumprod(1 + stitched[f"{name}_return"]), rtol=1e-9
        )
    stats = result["stitched"]["statistics"]
    assert stats["bars"] == len(stitched) and len(stats["seeds"]) == 2
    assert stats["reference"]["name"] == "buy_and_hold" and "spa" in stats
    bh = result["stitched"]["baselines"]["buy_and_hold"]["sharpe"]
    assert stats["reference"]["sharpe"] == pytest.approx(bh, rel=1e-9)
    assert stats["dsr"]["num_trials"] == 2 * 2 * 2  # seeds × epochs × folds


def test_e3_walkforward_fold_table_matches_the_fold_summaries(wf_run):
    run, result, _ = wf_run
    for fold in result["folds"]:
        summary = json.loads((run / fold["dir"] / "summary.json").read_text())
        assert fold["best_epoch"] == summary["best_epoch"]
        assert fold["epochs"] == summary["epochs"] == 2
        assert fold["val_sharpe"] == summary["val"]["sharpe"]
        assert fold["test_sharpe"] == summary["test"]["sharpe"]
        assert fold["val_sharpe_seeds"] == [s["val"]["sharpe"] for s in summary["seeds"]]
        assert fold["test_sharpe_seeds"] == [s["test"]["sharpe"] for s in summary["seeds"]]
        assert fold["test_sharpe"] == pytest.approx(np.mean(fold["test_sharpe_seeds"]))
        for name, sharpe in fold["baselines_test_sharpe"].items():
            assert sharpe == summary["baselines"][name]["test"]["sharpe"], name
        assert "buy_and_hold" in fold["baselines_test_sharpe"]
    report = (run / "walkforward.md").read_text()
    for fold in result["folds"]:
        assert f"{fold['test_sharpe']:.3f}" in report


def _strip_wall_times(value):
    if isinstance(value, dict):
        return {k: _strip_wall_times(v) for k, v in value.items() if "wall_time" not in k}
    if isinstance(value, list):
        return [_strip_wall_times(v) for v in value]
    return value


@pytest.mark.slow
def test_e3_walkforward_resume_after_sigkill_continues_at_the_interrupted_fold(wf_run, tmp_path):
    # The killed walk-forward is the reference's up to fold 0 (config, plan and the finished
    # fold 0 copied, which saves training fold 0 again): it is started, killed −9 once fold 1
    # has saved its checkpoint after epoch 1, and resumed.
    ref, reference, _ = wf_run
    run = tmp_path / "wf"
    run.mkdir()
    for name in ("config.yaml", "walkforward_plan.json"):
        shutil.copy(ref / name, run / name)
    shutil.copytree(ref / "fold_0", run / "fold_0")
    cmd = [sys.executable, "-m", "jaxdqn.walkforward", "--no-progress", "--resume", "wf"]
    after_epoch_1 = run / "fold_1" / "checkpoints" / "3"  # fold 1's checkpoint after epoch 1
    kill_when_exists(cmd, tmp_path, _env(), after_epoch_1)
    assert after_epoch_1.exists()
    assert not (run / "fold_1" / "summary.json").exists() and not (run / RESULT).exists()
    fold_0 = (run / "fold_0" / "summary.json").read_bytes()
    res = _walkforward(["--resume", "wf"], tmp_path, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "fold 1/2: finished earlier" in res.stdout
    assert "fold 2/2" in res.stdout and "resumed from its latest checkpoint" in res.stdout
    assert (run / "fold_0" / "summary.json").read_bytes() == fold_0  # not trained again
    assert "resumed from checkpoint 3" in (run / "fold_1" / "events.log").read_text()
    result = json.loads((run / RESULT).read_text())
    assert _strip_wall_times(result) == _strip_wall_times(reference)
    a = json.loads((ref / "fold_1" / "summary.json").read_text())
    b = json.loads((run / "fold_1" / "summary.json").read_text())
    assert a["val"] == b["val"] and a["test"] == b["test"] and a["best_epoch"] == b["best_epoch"]


def test_e3_walkforward_fold_killed_before_its_first_checkpoint_starts_again(tmp_path, monkeypatch):
    from jaxdqn.program.run import loop

    cfg = C.load(SMOKE, [*FOLDS, *C.ALL_OFF])
    plan = walkforward.make_plan(cfg)
    calls = []

    class Recorder:
        def __init__(self, fold_cfg, run_dir, *, resume, progress):
            left = sorted(os.listdir(run_dir)) if Path(run_dir).exists() else None
            calls.append((fold_cfg, Path(run_dir), resume, left))

        def run(self):
            return None

    monkeypatch.setattr(loop, "Trainer", Recorder)
    fdir = walkforward.fold_dir(tmp_path, 1)
    (fdir / "checkpoints" / "0.orbax-checkpoint-tmp-1").mkdir(parents=True)  # a torn save
    (fdir / "metrics.jsonl").write_text("")
    walkforward._run_fold(plan, plan.folds[1], tmp_path, False, lambda _: None)
    fold_cfg, where, resume, left = calls[-1]
    assert (where, resume) == (fdir, False) and left is None  # removed, trained from scratch
    assert fold_cfg == walkforward.fold_config(cfg, plan.folds[1], plan.bar_clock.bars_per_year)
    # with a committed checkpoint it resumes; with another fold's config it refuses
    (fdir / "checkpoints" / "3").mkdir(parents=True)
    (fdir / "config.yaml").write_text(C.dump(fold_cfg))
    walkforward._run_fold(plan, plan.folds[1], tmp_path, False, lambda _: None)
    assert calls[-1][2] is True
    (fdir / "config.yaml").write_text(C.dump(walkforward.fold_config(cfg, plan.folds[0])))
    with pytest.raises(C.ConfigError, match="not the fold's config"):
        walkforward._run_fold(plan, plan.folds[1], tmp_path, False, lambda _: None)
