"""The training program (issue 6): end to end, resume, SIGINT, plateau actions, rewind, faults,
user errors and compilation count. Runs on the smoke config."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import optax
import pandas as pd
import pytest
import shared_runs
from sigkill import kill_when_exists

from jaxdqn import config
from jaxdqn.agent import iteration, optim
from jaxdqn.program.checkpoints import checkpoint
from jaxdqn.program.records import logger as logger_lib
from jaxdqn.program.run import loop

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "configs" / "smoke.yaml"
FAST = ["train.epochs=4", "train.iterations_per_epoch=3"]
VOLATILE = ("wall_time", "env_steps_per_s", "updates_per_s")


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["JAX_PLATFORMS"] = "cpu"
    return env


def _train(args, cwd, **kw):
    cmd = [sys.executable, "-m", "jaxdqn.train", "--no-progress", *args]
    return subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, **kw)


def _records(run_dir):
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if k not in VOLATILE} for x in lines]


@pytest.fixture(scope="module")
def full_run():
    """The session's shared population (``shared_runs.population``: 2 seeds, every component
    on, 4 epochs of 3 iterations, trained by ``python -m jaxdqn.train``) and its output; also
    the reference of the resume and same-command tests."""
    run = shared_runs.population()
    out = (run.parent / "stdout.txt").read_text(), (run.parent / "stderr.txt").read_text()
    return run, out


@pytest.mark.slow
def test_e3_training_writes_every_output(full_run):
    run, res = full_run
    for name in (
        "config.yaml",
        "metrics.jsonl",
        "eval_val.csv",
        "eval_test.csv",
        "baselines_test.csv",
        "summary.json",
        "report.md",
    ):
        assert (run / name).is_file(), name
    # configs/smoke.yaml sets eval.plots=false: the report says so and draws nothing
    # (tests/test_report.py draws every figure)
    assert "_Off (`eval.plots=false`)" in (run / "report.md").read_text()
    assert not list(run.glob("*.png"))
    assert any((run / "tb").rglob("*tfevents*"))
    records = _records(run)
    assert [r["epoch"] for r in records] == [1, 2, 3, 4]
    for key in (
        "loss",
        "lr",
        "val_sharpe",
        "plateau_epochs",
        "detector",
        "frozen",
        "action",
        "rewinds",
        "checkpoints",
        "q_gap",
        "atom_utilisation",
    ):
        assert key in records[-1], key
    ckpt_steps = [p.name for p in (run / "checkpoints").iterdir() if p.name.isdigit()]
    assert records[-1]["checkpoints"] == len(ckpt_steps)
    summary = json.loads((run / "summary.json").read_text())
    assert {"best_epoch", "val", "test", "baselines", "wall_time_s"} <= set(summary)
    assert "buy_and_hold" in summary["baselines"]
    assert np.isfinite(summary["test"]["annual_volatility"])
    # daily bars: the bar clock is inferred as 252 and said in the summary, report and log
    assert summary["bar_clock"]["bars_per_year"] == 252.0 and summary["bar_clock"]["inferred"]
    assert summary["data"] == {"close_only": False, "volume": True, "held_branches": {}}
    assert "| bar clock | 252 bars a year (inferred: daily bars" in (run / "report.md").read_text()
    assert "bar clock 252 bars a year" in (run / "events.log").read_text()
    stdout, stderr = res
    assert "epoch 4/4" in stderr + stdout  # plain progress lines when not a terminal
    assert "report.md" in stdout


def _checkpoint_crcs(run_dir):
    """Every checkpoint's CRC-32 of every state leaf, as recorded at save time."""
    out = {}
    for meta in sorted((Path(run_dir) / "checkpoints").glob("*/meta/metadata")):
        out[meta.parent.parent.name] = [leaf[3] for leaf in json.loads(meta.read_text())["leaves"]]
    return out


@pytest.mark.slow
def test_o6_resume_after_sigkill_is_byte_identical_to_the_uninterrupted_run(full_run, tmp_path):
    """The shared population's command again, killed −9 after epoch 2's checkpoint and resumed
    with ``--resume``, ends with the uninterrupted run's metrics.jsonl (minus wall-clock fields),
    summary.json (minus wall time and provenance) and checkpoints, byte for byte: resume is exact
    (O6), and the same command twice gives the same bytes (issue 16 on the CPU; the second
    time from the session's compilation cache)."""
    ref, _ = full_run
    args = [*shared_runs.POPULATION_ARGS, "--run-dir", "run"]
    cmd = [sys.executable, "-m", "jaxdqn.train", "--no-progress", *args]
    step_after_epoch_2 = tmp_path / "run" / "checkpoints" / "6"
    kill_when_exists(cmd, tmp_path, _env(), step_after_epoch_2)
    assert step_after_epoch_2.exists()
    assert not (tmp_path / "run" / "summary.json").exists()  # killed before the end
    res = _train(["--resume", "run"], tmp_path, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    again = tmp_path / "run"
    assert _records(again) == _records(ref)
    a = json.loads((ref / "summary.json").read_text())
    b = json.loads((again / "summary.json").read_text())
    assert a["val"] == b["val"] and a["test"] == b["test"] and a["best_epoch"] == b["best_epoch"]
    assert a["seeds"] == b["seeds"]
    strip = lambda s: {k: v for k, v in s.items() if k not in ("wall_time_s", "provenance")}
    assert json.dumps(strip(a), sort_keys=True) == json.dumps(strip(b), sort_keys=True)
    assert _checkpoint_crcs(again) == _checkpoint_crcs(ref) and _checkpoint_crcs(ref)
    assert a["provenance"]["deterministic"] is True and a["provenance"]["seed"] == 0
    keys = ("jax", "jaxlib", "device_kind", "xla_flags", "compile_cache", "config_sha256")
    # the training adds jaxdqn's GPU flags, so its iteration records the loops into graphs
    assert a["provenance"]["iteration_xla_options"] == "xla_gpu_command_buffer_unroll_loops=True"
    for key in (*keys, "git_commit"):
        assert key in a["provenance"]
    assert a["provenance"]["kernels"] == b["provenance"]["kernels"]
    assert "fused=per_branch " in a["provenance"]["kernels"]  # the CPU
    assert " acting=reference " in a["provenance"]["kernels"]
    assert a["provenance"]["config_sha256"] == b["provenance"]["config_sha256"]


@pytest.mark.slow
def test_o6_sigint_saves_a_checkpoint_and_exits_130(tmp_path):
    # the shared population's program (loaded from the session's cache), for 50 epochs
    args = [*shared_runs.POPULATION_ARGS, "train.epochs=50", "--run-dir", "run"]
    cmd = [sys.executable, "-m", "jaxdqn.train", "--no-progress", *args]
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    log = tmp_path / "run" / "metrics.jsonl"
    deadline = time.time() + 600
    while (not log.exists() or not log.read_text()) and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 130, err[-2000:]
    assert "--resume" in err
    ckpt = checkpoint.Checkpointer(tmp_path / "run" / "checkpoints", keep_latest=2, keep_best=3)
    latest = ckpt.latest_step()
    assert latest is not None and latest > 3  # saved after the interrupt, past epoch 1
    ckpt.close()


@pytest.mark.slow
def test_e3_bad_config_and_bad_data_exit_2_with_one_line(tmp_path, capsys, monkeypatch):
    """The exit code of the program in its own process; the bad data through its ``main``."""
    from jaxdqn import train

    res = _train(["nope.key=1"], tmp_path, timeout=300)
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "nope" in res.stderr
    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "bad.csv"
    bad.write_text(
        "date,open,high,low,close,volume\n2020-01-01,1,2,0.5,1,10\n2020-01-01,1,2,0.5,1,10\n"
    )
    assert train.main(["--no-progress", "data.source=csv", f"data.path={bad}"]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "bad.csv" in err
    assert "Traceback" not in err
    # dates past pandas' nanosecond calendar (2262-04-11): one line, exit 2, nothing written
    far = tmp_path / "far.csv"
    far.write_text(
        "date,open,high,low,close,volume\n2262-04-10,1,2,0.5,1,10\n2262-04-12,1,2,0.5,1,10\n"
    )
    assert train.main(["--no-progress", "data.source=csv", f"data.path={far}"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().count("\n") == 0
    assert "row 1: column 'date': date '2262-04-12' is outside the range" in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_e3_existing_run_dir_is_never_overwritten(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "mine.txt").write_text("keep")
    res = _train(["--run-dir", "run"], tmp_path, timeout=300)
    assert res.returncode == 2 and "already exists" in res.stderr
    assert (tmp_path / "run" / "mine.txt").read_text() == "keep"


def _trainer(tmp_path, extra=()):
    """An in-process training of the shared population's config (its programs come from the
    session's compilation cache) with ``extra`` overrides."""
    cfg = config.load(SMOKE, [*shared_runs.POPULATION, *extra])
    return loop.Trainer(cfg, tmp_path / "run", progress=False)


@pytest.mark.slow
def test_o5_o4_o6_plateau_actions_and_single_compilation(tmp_path, monkeypatch):
    traces = []
    real = iteration.iteration

    def counted(agent, state, market):
        traces.append(1)
        return real(agent, state, market)

    monkeypatch.setattr(iteration, "iteration", counted)
    # A Sharpe tolerance no change can beat: every epoch after the first is a plateau, so the
    # branch reset (O4) fires at epoch 2 and the rewind (O6) at epoch 5. SGDR restarts every 2
    # epochs change the learning rate and scale the moments (O2, O3).
    trainer = _trainer(
        tmp_path,
        [
            "train.epochs=6",
            "train.plateau_threshold=1",
            "train.plateau_sharpe_eps=1e9",
            "optim.sgdr_period=2",
        ],
    )
    seen = {}
    real_rewind = trainer.rewind

    def rewind(state, run):
        best, _, _ = trainer.ckpt.restore("best", state)
        out = real_rewind(state, run)
        # host copies: the loop donates `out` (whose buffers `best` shares) to the next iteration
        seen["best"], seen["out"] = jax.device_get(best), jax.device_get(out)
        return out

    trainer.rewind = rewind
    trainer.run()
    assert len(traces) == 1  # lr changes, restarts, O3/O4, host scalars: one trace
    # and one executable: the rewound state (restored from a checkpoint) is the same program
    assert trainer.placed.iterate._cache_size() == 1
    records = _records(tmp_path / "run")
    actions = [r["action"] for r in records]
    assert actions == ["none", "reset_branches", "none", "none", "rewind", "none"]
    # after the rewind the detectors start afresh (no previous epoch to compare with)
    assert [r["plateau_epochs"] for r in records] == [0, 1, 2, 3, 4, 0]
    assert records[1]["detector"] in ("sharpe", "both")
    assert [r["restart"] for r in records] == [False, False, True, False, True, False]
    assert records[4]["rewinds"] == 1
    assert [r["branch_resets"] for r in records] == [0, 1, 1, 1, 1, 1]
    # the rewound parameters are exactly the best checkpoint's
    for a, b in zip(
        jax.tree.leaves(seen["best"].params), jax.tree.leaves(seen["out"].params), strict=True
    ):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(seen["best"].key, seen["out"].key)  # a new key was folded in
    # after the rewind the LR cycle restarts at the base rate
    assert records[5]["lr"] == pytest.approx(trainer.cfg.optim.lr)


def _partition(opt_state, name):
    found = []
    is_mt = lambda n: isinstance(n, optax.MultiTransformState)
    jax.tree.map(
        lambda n: found.append(n.inner_states[name]) if is_mt(n) else None, opt_state, is_leaf=is_mt
    )
    return found[0]


@pytest.mark.slow
def test_o4_branch_reset_zeroes_branch_moments_only(tmp_path):
    state = _trainer(tmp_path).init_state()  # leading seed axis, as the loop holds it
    bumped = jax.tree.map(lambda x: x + 1.0 if x.dtype == np.float32 else x, state.opt_state)
    reset = jax.vmap(optim.reset_branch_moments)(bumped)
    adam = lambda part: [
        n
        for n in jax.tree.leaves(part, is_leaf=lambda n: isinstance(n, optax.ScaleByAdamState))
        if isinstance(n, optax.ScaleByAdamState)
    ]
    (branches,) = adam(_partition(reset, "branches"))
    assert all((np.asarray(x) == 0).all() for x in jax.tree.leaves((branches.mu, branches.nu)))
    assert (np.asarray(branches.count) == 0).all()
    for name in ("trunk", "aux"):
        for a, b in zip(
            jax.tree.leaves(_partition(reset, name)),
            jax.tree.leaves(_partition(bumped, name)),
            strict=True,
        ):
            np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_o6_non_finite_state_is_restored_and_never_checkpointed(tmp_path):
    # every component off, here and in the next test (one program for both): the fault path
    # is the loop's, whatever the model; the plateau test keeps every component on
    trainer = _trainer(tmp_path, ["train.epochs=3", *config.ALL_OFF])
    real = trainer.iterate
    calls = {"n": 0}

    def poisoned(state, market):
        state, metrics = real(state, market)
        calls["n"] += 1
        if calls["n"] == 4:  # the first iteration of epoch 2
            state = state.replace(params=jax.tree.map(lambda x: x * np.nan, state.params))
            metrics = dict(metrics, finite=metrics["finite"] & False)
        return state, metrics

    trainer.iterate = poisoned
    summary = trainer.run()
    assert summary["fault_events"] == 1
    assert trainer.placed.iterate._cache_size() == 1  # the recovered state: the same program
    records = _records(tmp_path / "run")
    assert [r["epoch"] for r in records] == [1, 2, 3]
    assert all(np.isfinite(r["loss"]).all() for r in records if r["loss"] is not None)
    assert "non-finite" in (tmp_path / "run" / "events.log").read_text()


@pytest.mark.slow
def test_o6_repeated_faults_stop_with_a_clear_error(tmp_path):
    trainer = _trainer(tmp_path, ["train.max_faults=2", *config.ALL_OFF])
    real = trainer.iterate

    def always_bad(state, market):
        state, metrics = real(state, market)
        return state, dict(metrics, finite=metrics["finite"] & False)

    trainer.iterate = always_bad
    with pytest.raises(loop.TrainingError, match="2 consecutive"):
        trainer.run()


@pytest.mark.slow
def test_e3_evaluate_cli_reproduces_the_best_checkpoint_and_transfers(
    full_run, tmp_path, capsys, monkeypatch
):
    """The program end to end in its own process; the other instrument and the refused
    inputs through its ``main`` in this one (the same code after the interpreter starts)."""
    from jaxdqn import evaluate

    run, _ = full_run
    cmd = [sys.executable, "-m", "jaxdqn.evaluate", str(run), "--split", "test",
           "--out", str(tmp_path / "ev")]  # fmt: skip
    res = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads((tmp_path / "ev" / "metrics_test.json").read_text())["seeds"]
    summary = json.loads((run / "summary.json").read_text())
    assert len(got) == len(summary["seeds"]) == 2
    for mine, theirs in zip(got, summary["seeds"], strict=True):
        for k in ("sharpe", "max_drawdown", "annual_return", "turnover"):
            assert mine[k] == pytest.approx(theirs["test"][k], rel=1e-12, abs=1e-12), k
    assert (tmp_path / "ev" / "eval_test.csv").is_file()
    # another instrument through data overrides (here the synthetic market)
    args = [str(run), "--split", "test", "--out", str(tmp_path / "ev2")]
    assert evaluate.main([*args, "data.source=synthetic", "data.split=fraction"]) == 0
    assert (tmp_path / "ev2" / "eval_test.csv").is_file()
    capsys.readouterr()
    assert evaluate.main([*args, "model.sh1=7"]) == 2
    assert "model.sh1" in capsys.readouterr().err
    # a step the run never saved: a user error (one line, exit 2), the directory as given
    monkeypatch.chdir(tmp_path)
    rel = os.path.relpath(run, tmp_path)
    assert evaluate.main([rel, "--checkpoint", "999"]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0, err[-2000:]
    assert f"--checkpoint 999: {rel} has no checkpoint at that step (steps: " in err
    assert str(tmp_path) not in err
    assert got_clock(tmp_path / "ev") == {
        "bars_per_year": 252.0,
        "inferred": True,
        "rule": "inferred: daily bars, 4.82 a week; 252 trading days a year",
    }


def got_clock(out: Path) -> dict:
    """The ``bar_clock`` entry of an ``evaluate`` output directory's metrics file."""
    return json.loads((out / "metrics_test.json").read_text())["bar_clock"]


@pytest.mark.slow
def test_e3_seed_population_is_evaluated_checkpointed_and_reported_per_seed():
    """The session's shared 2-seed run (``shared_runs.population``), read only."""
    run = shared_runs.population()
    summary = json.loads((run / "summary.json").read_text())
    assert [s["seed"] for s in summary["seeds"]] == [0, 1]
    sharpes = [s["test"]["sharpe"] for s in summary["seeds"]]
    assert summary["test"]["sharpe"] == pytest.approx(np.mean(sharpes))
    frame = pd.read_csv(run / "eval_test.csv")
    assert set(frame["seed"]) == {0, 1}
    records = _records(run)
    assert len(records[-1]["val_sharpe_seeds"]) == 2
    assert np.asarray(records[-1]["q_gap"]).shape == (2, 4)
    template = loop.Trainer(config.load(run / "config.yaml"), run, progress=False).init_state()
    ckpt = checkpoint.Checkpointer(run / "checkpoints", keep_latest=2, keep_best=3)
    state, _, _ = ckpt.restore("latest", template)
    ckpt.close()
    assert all(x.shape[0] == 2 for x in jax.tree.leaves(state.params))
    report = (run / "report.md").read_text()
    assert "2 seeds" in report
    sections = [line for line in report.splitlines() if line.startswith("## ")]
    assert sections == [
        "## Run",
        "## Results (best checkpoint by validation Sharpe)",
        "## Statistics",
        "## Cost stress (test)",
        "## Figures",  # eval.plots=false (smoke.yaml): no equity sections
        "## Training",
    ]


@pytest.mark.slow
def test_e1_e3_close_only_universe_file_trains_reports_and_holds_the_order_branches(tmp_path):
    """A table of 20 instruments' adjusted closes (no open, high, low or volume), one of them
    traded through ``data.columns``: the run detects close-only bars, holds order = market and
    urgency = high on every bar of its walks and says so in the report. Every component off:
    the held branches are the environment's (``EnvParams.hold_orders``), whatever the model,
    and a program of its own (no volume feature) compiles in a fraction of the all-on time."""
    rng = np.random.default_rng(5)
    dates = pd.bdate_range("2005-01-03", periods=700)
    wide = pd.DataFrame(
        {f"T{k:02d}": 40 * np.exp(np.cumsum(0.01 * rng.standard_normal(700))) for k in range(20)}
    )
    wide.insert(0, "Date", dates.strftime("%Y-%m-%d"))
    path = tmp_path / "universe_adj_close.csv"
    wide.to_csv(path, index=False)
    trainer = _trainer(
        tmp_path,
        [
            "data.source=csv",
            f"data.path={path}",
            "data.columns={T07: close}",
            "data.split=fraction",
            "env.impact_eta=0",
            "train.epochs=2",
            *config.ALL_OFF,
        ],
    )
    assert trainer.prepared.close_only and not trainer.prepared.has_volume
    assert "volume_z" not in trainer.prepared.features.names
    summary = trainer.run()
    run = tmp_path / "run"
    assert summary["data"] == {
        "close_only": True,
        "volume": False,
        "held_branches": {"order": "market", "urgency": "high"},
    }
    assert summary["bar_clock"]["bars_per_year"] == 252.0 and summary["bar_clock"]["inferred"]
    for split in ("val", "test"):
        log = pd.read_csv(run / f"eval_{split}.csv")
        assert (log["order"] == 0).all() and (log["urgency"] == 2).all(), split
        assert np.isfinite(log["equity"]).all()
    report = (run / "report.md").read_text()
    assert "| held branches | order = market, urgency = high on every bar" in report
    assert "| bar clock | 252 bars a year (inferred: daily bars" in report
    assert "| volume | none in the data" in report
    events = (run / "events.log").read_text()
    assert "close-only bars" in events and "no volume column" in events
    assert "bar clock 252 bars a year" in events


def test_e3_resume_accepts_restated_values_and_refuses_changes(tmp_path):
    from jaxdqn import train

    run = tmp_path / "run"
    run.mkdir()
    cfg = config.load(SMOKE, ["optim.lr=0.0005"])
    (run / "config.yaml").write_text(config.dump(cfg))
    # the original command with --resume: the same --config and overrides are accepted
    assert train._resume_config(run, ["optim.lr=0.0005"]) == cfg
    assert train._resume_config(run, ["optim.lr=5e-4"], str(SMOKE)) == cfg
    longer = train._resume_config(run, ["optim.lr=0.0005", "train.epochs=9"], str(SMOKE))
    assert longer.train.epochs == 9 and config.differences(cfg, longer) == [
        ("train.epochs", cfg.train.epochs, 9)
    ]
    with pytest.raises(config.ConfigError, match=r"optim\.lr: cannot be changed when resuming"):
        train._resume_config(run, ["optim.lr=0.001"])
    with pytest.raises(config.ConfigError, match=r"the run has 0\.0005"):
        train._resume_config(run, [], str(SMOKE))  # the file alone gives the default lr


@pytest.mark.slow
def test_e3_resume_with_more_epochs_rewrites_config_yaml(tmp_path):
    cfg = config.load(SMOKE, FAST)
    trainer = loop.Trainer(cfg, tmp_path / "run", progress=False)
    trainer.run_dir.mkdir()
    (trainer.run_dir / "config.yaml").write_text(config.dump(cfg))
    longer = config.load(SMOKE, [*FAST, "train.epochs=7"])
    log = logger_lib.open_run_log(trainer.run_dir, 1)
    logger_lib.write_config(log, trainer.run_dir, longer, resumed=True)
    assert config.load(trainer.run_dir / "config.yaml") == longer
    assert "train.epochs 4 -> 7" in (trainer.run_dir / "events.log").read_text()
    logger_lib.write_config(log, trainer.run_dir, longer, resumed=True)  # unchanged: no write
    assert (trainer.run_dir / "events.log").read_text().count("updated on resume") == 1
