"""Issue 32, searches beyond one program (docs/DESIGN.md, H2): ``python -m jaxdqn.sweep`` on
Optuna — the sweep file, the study's bookkeeping, two workers sharing one SQLite study with one
of them killed mid-trial, ``--resume``, and the Deflated Sharpe Ratio's N over every trial."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jaxdqn.config import ALL_OFF, ConfigError
from jaxdqn.program.sweep import space, study, worker

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "configs" / "smoke.yaml"
# every component off: the same program paths, traced in half the time (a trial is mostly
# tracing: 4.0 s of training and walks against 9.2 s all on, 2-core EPYC)
FAST = [*ALL_OFF, "train.epochs=2", "eval.bootstrap_reps=50"]


def _spec_file(tmp_path: Path, name: str = "sweep.yaml", **fields) -> Path:
    tree = {
        "study": "t",
        "config": str(SMOKE),
        "overrides": FAST,
        "trials": 2,
        "sampler": "random",
        "space": {"optim.lr": {"low": 1e-4, "high": 1e-3, "log": True}},
    }
    tree.update(fields)
    path = tmp_path / name
    path.write_text(json.dumps(tree))  # JSON is YAML
    return path


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"space": {"optim.lr": {"low": 1e-3, "high": 1e-4}}}, "low must be below high"),
        ({"space": {"optim.lr": {"low": 0, "high": 1e-3, "log": True}}}, "log range needs low"),
        ({"space": {"optim.lr": {"low": 1e-4, "high": 1e-3, "size": 2}}}, "unknown fields"),
        ({"space": {"model.nope": {"choices": [1, 2]}}}, "space.model.nope"),
        ({"space": {"replay.batch_size": {"low": 0, "high": 64}}}, "replay.batch_size"),
        ({"space": {"seed": {"choices": [0, 1]}}}, "luck is not a hyperparameter"),
        ({"space": {"population.optim.lr": {"choices": [0.1, 0.2]}}}, "fixed override"),
        ({"space": {"eval.walk_test": {"choices": [True, False]}}}, "may not be searched"),
        ({"overrides": ["eval.walk_test=true"]}, "trials never walk test"),
        ({"overrides": ["model.sh1=-3"]}, "base config"),
        ({"trials": 0}, "trials: expected an integer >= 1"),
        ({"sampler": "cmaes"}, "sampler"),
        ({"colour": "red"}, "unknown fields ['colour']"),
        ({"space": {"optim.lr": {"choices": [0.1]}}}, "two or more values"),
        ({"pruner": {"type": "hyperband"}}, "pruner: expected {type: median | threshold"),
        ({"pruner": {"type": "median", "worse_than": 0.0}}, "unknown fields ['worse_than']"),
        ({"pruner": {"type": "threshold"}}, "pruner.worse_than: expected a number"),
        ({"pruner": {"type": "median", "warmup": -1}}, "pruner.warmup: expected an integer"),
        (
            {
                "pruner": {"type": "median"},
                "metric": "sortino",
                "overrides": [*FAST, "population.optim.lr=[1e-4,1e-3]"],
            },
            "metric must be sharpe",
        ),
    ],
)
def test_h2_sweep_file_errors_name_the_field(tmp_path, fields, message):
    with pytest.raises(ConfigError, match=None) as e:
        space.load_spec(_spec_file(tmp_path, **fields))
    assert message in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def test_h2_trial_overrides_hold_the_values_and_never_walk_test(tmp_path):
    spec = space.load_spec(
        _spec_file(
            tmp_path,
            space={
                "optim.lr": {"low": 1e-4, "high": 1e-3, "log": True},
                "replay.batch_size": {"low": 32, "high": 128, "step": 32},
                "eval.policy": {"choices": ["greedy", "boltzmann"]},
            },
        )
    )
    kinds = [p.kind for p in spec.space]
    assert kinds == ["float", "int", "choice"]
    values = {"optim.lr": 0.000123456789, "replay.batch_size": 64, "eval.policy": "boltzmann"}
    over = space.trial_overrides(spec, values)
    assert over == [
        *FAST,
        "eval.walk_test=false",
        "optim.lr=0.000123456789",
        "replay.batch_size=64",
        "eval.policy=boltzmann",
    ]
    cfg = spec.base_config(over[len(FAST) + 1 :])
    assert cfg.optim.lr == 0.000123456789 and cfg.replay.batch_size == 64
    assert cfg.eval.policy == "boltzmann" and cfg.eval.walk_test is False
    # the identity ignores the budget (a resumed study may raise it), not the space
    more = space.load_spec(_spec_file(tmp_path, "b.yaml", trials=9))
    other = space.load_spec(
        _spec_file(tmp_path, "c.yaml", space={"optim.lr": {"low": 1e-4, "high": 2e-3}})
    )
    base = space.load_spec(_spec_file(tmp_path))
    assert base.identity() == more.identity() != other.identity()


def test_h2_a_dead_workers_trial_is_requeued_to_resume_its_run(tmp_path):
    import optuna
    from optuna.distributions import FloatDistribution
    from optuna.trial import TrialState, create_trial

    spec = space.load_spec(_spec_file(tmp_path))
    url = study.default_storage(tmp_path)
    st = study.open_study(spec, url, resume=False, heartbeat_s=1)
    dist = {"optim.lr": FloatDistribution(1e-4, 1e-3, log=True)}

    def add(state, lr, **attrs):
        value = 0.5 if state == TrialState.COMPLETE else None
        params = {"optim.lr": lr}
        st.add_trial(create_trial(state=state, value=value, params=params, distributions=dist,
                                  user_attrs=attrs))  # fmt: skip

    add(TrialState.COMPLETE, 2e-4, run_dir="trials/trial_0000")
    add(TrialState.FAIL, 3e-4, run_dir="trials/trial_0001")
    dead = st.get_trials()[1]
    study.requeue(st, dead)
    waiting = [t for t in st.get_trials() if t.state == TrialState.WAITING]
    assert len(waiting) == 1
    assert waiting[0].system_attrs["fixed_params"] == {"optim.lr": 3e-4}  # its values
    assert waiting[0].user_attrs == {"resumes": 1, "run_dir": "trials/trial_0001", "retries": 1}
    assert study.counts(st) == study.Counts(complete=1, running=0, waiting=1, failed=0, died=1)
    # a trial requeued MAX_RETRIES times is failed for good
    add(TrialState.FAIL, 4e-4, run_dir="trials/trial_0003", retries=study.MAX_RETRIES)
    study.requeue(st, st.get_trials()[-1])
    assert study.counts(st).failed == 1 and study.counts(st).waiting == 1
    # the same study from another sweep file is refused; --resume needs the study
    other = space.load_spec(
        _spec_file(tmp_path, "c.yaml", space={"optim.lr": {"low": 1e-4, "high": 2e-3}})
    )
    with pytest.raises(ConfigError, match="started from another sweep file"):
        study.open_study(other, url, resume=True)
    lost = space.load_spec(_spec_file(tmp_path, "d.yaml", study="lost"))
    with pytest.raises(ConfigError, match="--resume: no study 'lost'"):
        study.open_study(lost, url, resume=True)
    assert isinstance(st, optuna.Study)
    assert study.redact("postgresql://u:secret@h/db") == "postgresql://u:***@h/db"


def test_h2_workers_of_one_study_draw_apart(monkeypatch):
    """Workers seeded alike would propose the same values: each mixes in its host and pid."""
    seeds = []
    for pid in (4000, 4001, 4000):
        monkeypatch.setattr(os, "getpid", lambda pid=pid: pid)
        seeds.append(study.worker_seed(0))
    assert seeds[0] != seeds[1] and seeds[0] == seeds[2]
    assert study.worker_seed(1) != seeds[2]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["JAX_PLATFORMS"] = "cpu"
    return env


def _sweep(args, cwd, **kw) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "jaxdqn.sweep", *map(str, args)]
    return subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, **kw)


def test_h2_sweep_refuses_bad_input_with_one_line(tmp_path):
    bad = _spec_file(tmp_path, space={"optim.lr": {"low": 1e-3, "high": 1e-4}})
    r = _sweep([bad, "--dir", tmp_path / "s"], tmp_path, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().count("\n") == 0 and "low must be below high" in r.stderr
    r = _sweep([_spec_file(tmp_path), "--dir", tmp_path / "s", "--resume"], tmp_path, timeout=120)
    assert r.returncode == 2 and "--resume: no study 't'" in r.stderr, r.stderr
    from jaxdqn import walkforward

    assert walkforward.main(["--config", str(SMOKE), "eval.walk_test=false"]) == 2


def test_h2_failed_trials_keep_their_error_and_stop_at_max_failed(tmp_path):
    """Values whose combination the config refuses fail their trial (the error kept in the
    study, one line from the worker); ``max_failed`` failures stop the search with exit 1."""
    space_ = {
        "replay.capacity": {"choices": [256, 300]},  # each end is valid on its own,
        "replay.learning_starts": {"choices": [1024, 2000]},  # no combination is
    }
    sweep = _spec_file(tmp_path, study="bad", max_failed=2, space=space_)
    r = _sweep([sweep, "--dir", tmp_path / "s"], tmp_path, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stderr.strip().count("\n") == 0, r.stderr
    assert "2 trials failed (max_failed 2); the last: ConfigError: replay.capacity" in r.stderr
    assert r.stdout.count(": failed: replay.capacity: must hold") == 2, r.stdout
    assert not (tmp_path / "s" / "trials").exists() or not any(
        (tmp_path / "s" / "trials").iterdir()
    )


def _started(log: Path) -> int | None:
    """The trial a worker's log says it is running (its last "started" line)."""
    lines = [ln for ln in log.read_text().splitlines() if ": started" in ln]
    return int(lines[-1].split()[1].rstrip(":")) if lines else None


def _mid_trial(sweep_dir: Path, number: int) -> bool:
    """Trial ``number``'s run has saved a checkpoint after its first epoch, not finished."""
    run = sweep_dir / "trials" / f"trial_{number:04d}"
    steps = [int(p.name) for p in (run / "checkpoints").glob("*") if p.name.isdigit()]
    return any(s > 0 for s in steps) and not (run / "summary.json").exists()


def _val_sharpes(run: Path) -> int:
    return sum(
        1 for line in (run / "metrics.jsonl").read_text().splitlines() if '"val_sharpe"' in line
    )


def _kill_mid_trial(proc: subprocess.Popen, log: Path, sweep_dir: Path) -> int:
    """SIGKILL the worker ``proc`` once the trial it runs has checkpointed its first epoch;
    returns that trial's number."""
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        n = _started(log)
        if n is not None and _mid_trial(sweep_dir, n):
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return n
        time.sleep(0.05)
    raise AssertionError(f"the worker never reached a trial's second epoch:\n{log.read_text()}")


@pytest.mark.slow
def test_h2_two_workers_killed_resume_completes_and_n_counts_every_trial(tmp_path):
    """Two workers share one SQLite study of 6 trials; one is SIGKILLed mid-trial (the other
    fails that trial after two silent heartbeats and resumes its run), then the other too;
    ``--resume`` completes the study, and the DSR's N counts every run's val Sharpes once."""
    sweep_dir = tmp_path / "s"
    args = [_spec_file(tmp_path, study="kill", trials=6), "--dir", sweep_dir, "--heartbeat", "1"]
    cmd = [sys.executable, "-m", "jaxdqn.sweep", *map(str, args)]
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    with open(logs[0], "w") as fa:
        a = subprocess.Popen(cmd, cwd=tmp_path, env=_env(), stdout=fa, stderr=subprocess.STDOUT)
    time.sleep(3)  # A creates the study; B joins it
    with open(logs[1], "w") as fb:
        b = subprocess.Popen(cmd, cwd=tmp_path, env=_env(), stdout=fb, stderr=subprocess.STDOUT)
    killed = [_kill_mid_trial(a, logs[0], sweep_dir)]
    # B notices A's silence, requeues its trial and resumes it (or a later one); kill B in
    # the trial after the one it resumed
    deadline = time.time() + 300
    while f"resuming trial {killed[0]}'s run" not in logs[1].read_text():
        assert time.time() < deadline and b.poll() is None, logs[1].read_text()
        time.sleep(0.1)
    resumed_by_b = _started(logs[1])
    while _started(logs[1]) == resumed_by_b:
        assert time.time() < deadline and b.poll() is None, logs[1].read_text()
        time.sleep(0.1)
    killed.append(_kill_mid_trial(b, logs[1], sweep_dir))
    assert not (sweep_dir / "sweep.json").exists()

    r = _sweep([*args, "--resume"], tmp_path, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"resuming trial {killed[1]}'s run" in r.stdout, r.stdout
    result = json.loads((sweep_dir / "sweep.json").read_text())
    c = result["counts"]
    assert (c["complete"], c["failed"], c["died"], c["running"]) == (6, 0, 2, 0), c
    assert c["optuna_trials"] == 8 and c["runs"] == 6
    rows = {r["number"]: r for r in result["trials"]}
    for dead in killed:
        assert rows[dead]["state"] == "fail"
        again = [r for r in rows.values() if r["resumes"] == dead]
        assert len(again) == 1 and again[0]["state"] == "complete"
        assert again[0]["run_dir"] == rows[dead]["run_dir"]
        assert again[0]["params"] == rows[dead]["params"]
        # the resumed run trained its 2 epochs once: no epoch twice in its log
        resumed = sweep_dir / again[0]["run_dir"]
        assert json.loads((resumed / "summary.json").read_text())["epochs"] == 2
        assert _val_sharpes(resumed) == 2
    # N: every (run, epoch, seed) val Sharpe, each run counted once
    runs = {r["run_dir"] for r in rows.values()}
    n = sum(_val_sharpes(sweep_dir / r) for r in runs)
    assert n == 12 == result["dsr_trials"]["num_trials"]
    assert result["statistics"]["dsr"]["num_trials"] == n
    assert "of its 6 runs" in result["statistics"]["dsr"]["trials"]
    # test is walked for the winner only, after the search
    winner = result["winner"]
    assert winner["value"] == max(r["value"] for r in rows.values() if r["state"] == "complete")
    assert (sweep_dir / "winner" / "eval_test.csv").exists()
    for r in runs:
        assert not (sweep_dir / r / "eval_test.csv").exists()
        assert "test" not in json.loads((sweep_dir / r / "summary.json").read_text())
        assert (sweep_dir / r / "report.md").exists()
    report = (sweep_dir / "sweep.md").read_text()
    assert f"N = {n}" in report and "(winner)" in report
    # the study as it stands has its finale: --resume again trains nothing
    r = _sweep([*args, "--resume"], tmp_path, timeout=600)
    assert r.returncode == 0 and "started" not in r.stdout, r.stdout + r.stderr


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")  # (ask/tell, not optimize)
def test_h2_pruners_stop_after_warmup_on_the_median_or_a_threshold(tmp_path):
    """The sweep file's pruner as Optuna runs it: epochs are steps (1-based), nothing is
    pruned within the first ``warmup`` epochs, the median rule waits for ``startup``
    finished trials, and "worse than" follows the direction."""
    from optuna.trial import TrialState, create_trial

    median = {"type": "median", "warmup": 1, "startup": 2}
    spec = space.load_spec(_spec_file(tmp_path, pruner=median))
    assert spec.pruner == space.Pruner("median", 1, 2, None)
    st = study.open_study(spec, study.default_storage(tmp_path), resume=False)

    def verdicts(scores):
        t = st.ask()
        out = []
        for epoch, v in enumerate(scores, start=1):
            t.report(v, epoch)
            out.append(t.should_prune())
        st.tell(t, state=TrialState.PRUNED)
        return out

    assert verdicts([-5.0, -5.0]) == [False, False]  # no finished trial yet
    for v in (1.0, 2.0):  # two finished trials, 1.0 and 2.0 after epochs 1 and 2
        st.add_trial(create_trial(value=v, intermediate_values={1: v, 2: v}))
    assert verdicts([-5.0, -5.0]) == [False, True]  # epoch 1 is the warmup
    assert verdicts([0.0, 1.6]) == [False, False]  # above the median 1.5
    spec = space.load_spec(
        _spec_file(tmp_path, "t.yaml", study="th", pruner={"type": "threshold", "worse_than": 0})
    )
    st = study.open_study(spec, study.default_storage(tmp_path), resume=False)
    assert verdicts([-1.0, -0.1, 0.1]) == [False, True, False]
    spec = space.load_spec(
        _spec_file(
            tmp_path,
            "m.yaml",
            study="min",
            direction="minimize",
            pruner={"type": "threshold", "worse_than": 0.5, "warmup": 0},
        )
    )
    st = study.open_study(spec, study.default_storage(tmp_path), resume=False)
    assert verdicts([0.6, 0.4]) == [True, False]
    assert spec.identity() != space.load_spec(_spec_file(tmp_path, "n.yaml")).identity()


def test_h2_epoch_score_is_what_the_run_selects_on():
    record = {"val_sharpe": 0.25, "val_sortino": 0.5, "val_sharpe_seeds": [0.0, 1.0, 3.0, -1.0]}
    assert worker.epoch_score(record, "sortino", 0, 2) == 0.5
    assert worker.epoch_score(record, "sharpe", 0, 4) == 0.25
    assert worker.epoch_score(record, "sharpe", 2, 2) == 1.0  # members' means 0.5 and 1.0
    assert worker.epoch_score(record, "sharpe", 4, 1) == 3.0
    one = {"val_sharpe": 0.7}  # a one-member population of one seed logs no per-seed list
    assert worker.epoch_score(one, "sharpe", 1, 1) == 0.7


def test_h2_a_resumed_trial_reports_its_logged_epochs_first(tmp_path):
    """A requeued trial that resumes a run reports the epochs the run's log already holds
    before the new one, so the pruner judges the whole run."""
    from jaxdqn.program.records.logger import RunLogger

    log = RunLogger(tmp_path, num_seeds=1)
    for epoch, v in [(1, 0.5), (2, -0.25)]:
        log.log_epoch({"epoch": epoch, "val_sharpe": v})
    log.close()

    class Trial:
        def __init__(self):
            self.reports = []

        def report(self, value, step):
            self.reports.append((step, value))

        def should_prune(self):
            return self.reports[-1][1] < 0

    spec = space.load_spec(_spec_file(tmp_path, pruner={"type": "median"}))
    trial, reported = Trial(), []
    on_epoch = worker._pruning(trial, spec, (0, 1, 6), reported, tmp_path)
    assert on_epoch({"epoch": 3, "val_sharpe": 1.5}) is False
    assert trial.reports == reported == [(1, 0.5), (2, -0.25), (3, 1.5)]
    assert on_epoch({"epoch": 4, "val_sharpe": -1.0}) is True  # the log is read once only
    assert trial.reports[3:] == [(4, -1.0)]
    assert on_epoch({"epoch": 5, "val_sharpe": float("nan")}) is False  # nothing to judge
    assert on_epoch({"epoch": 6, "val_sharpe": -1.0}) is False  # the last epoch: it finishes
    assert trial.reports[-1] == (6, -1.0)


@pytest.mark.slow
def test_h2_pruned_trials_stop_after_their_checkpoint_and_count_in_n(tmp_path):
    """A pruner that stops every trial after its warmup (1 epoch): the trial's run ends after
    epoch 2 of 3 with that epoch's checkpoint and log (unfinished: no summary), the study
    records the epochs' val Sharpes the pruner saw, the pruned trial fills the budget, its val
    Sharpes count in the DSR's N, and with no complete trial the finale refuses in one line."""
    from optuna.trial import TrialState

    from jaxdqn.program.sweep import finale

    pruner = {"type": "threshold", "worse_than": 1e9, "warmup": 1}
    over = [*FAST, "train.epochs=3"]
    spec = space.load_spec(_spec_file(tmp_path, pruner=pruner, overrides=over, trials=1))
    sweep_dir = tmp_path / "s"
    url = study.default_storage(tmp_path)
    st = study.open_study(spec, url, resume=False)
    said = []
    worker.work(st, spec, sweep_dir, say=said.append)
    trials = st.get_trials()
    assert [t.state for t in trials] == [TrialState.PRUNED], said
    assert study.counts(st).finished == 1 and study.counts(st).pruned == 1
    for t in trials:
        run = sweep_dir / t.user_attrs["run_dir"]
        records = [
            json.loads(line)
            for line in (run / "metrics.jsonl").read_text().splitlines()
            if '"val_sharpe"' in line
        ]
        assert [r["epoch"] for r in records] == [1, 2]
        assert t.intermediate_values == {r["epoch"]: r["val_sharpe"] for r in records}
        assert not (run / "summary.json").exists()
        steps = sorted(int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit())
        assert steps[-1] == 2 * 4  # epoch 2's checkpoint (4 iterations per epoch)
        assert "pruned after epoch 2 (val sharpe" in t.user_attrs["error"]
    assert sum("pruned after epoch 2" in line for line in said) == 1, said
    found = finale.search_trials(st, sweep_dir)
    assert found.values.size == 2 and "1 pruned" in found.what
    with pytest.raises(study.SweepError, match="no complete trial to select"):
        finale.finale(st, spec, sweep_dir, url)
