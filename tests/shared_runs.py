"""Runs that several tests only read, made once per test session (``tests/conftest.py``).

:func:`shared` makes ``name`` in the session folder under an exclusive file lock, so that with
pytest-xdist the first worker that asks trains it and every other one waits for it and reads
the same files. A failed build is recorded: every later test that asks fails with the same
message instead of training again. The tests must not write into a shared run.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

SESSION_ENV = "JAXDQN_TEST_SESSION"


def session_folder() -> Path:
    return Path(os.environ[SESSION_ENV])


def shared(name: str, build: Callable[[Path], None]) -> Path:
    """The folder ``runs/<name>`` of the session, made by ``build(folder)`` the first time any
    process of the session asks for it."""
    runs = session_folder() / "runs"
    runs.mkdir(exist_ok=True)
    folder, done, failed = runs / name, runs / f"{name}.done", runs / f"{name}.failed"
    with open(runs / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if failed.exists():
                raise AssertionError(f"shared run {name} failed earlier:\n{failed.read_text()}")
            if not done.exists():
                shutil.rmtree(folder, ignore_errors=True)
                folder.mkdir()
                try:
                    build(folder)
                except BaseException as e:
                    failed.write_text(f"{type(e).__name__}: {e}"[-4000:])
                    raise
                done.write_text("")
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return folder


ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "configs" / "smoke.yaml"
# The shared population: 2 seeds of the smoke config (every component on, L3 included), 4
# epochs of 3 iterations — enough for a resume after epoch 2 and a plateau detector with a
# previous epoch to compare — on the S&P 500 with the default train split, two years of val
# and half a year of test (the defaults' three and three: the val walk runs every epoch, and
# the predict test replays the test walk up to each of its bars, quadratic in its length).
POPULATION = [
    "train.epochs=4",
    "train.iterations_per_epoch=3",
    "train.num_seeds=2",
    "data.split=dates",
    "data.train_dates=[1999-01-04, 2012-12-31]",
    "data.val_dates=[2013-01-02, 2014-12-31]",
    "data.test_dates=[2015-01-02, 2015-06-30]",
]
POPULATION_ARGS = ["--config", str(SMOKE), *POPULATION]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["JAX_PLATFORMS"] = "cpu"
    return env


def population() -> Path:
    """``python -m jaxdqn.train --no-progress`` + :data:`POPULATION_ARGS` ``--run-dir run``,
    started from the run's folder: a complete 2-seed run directory (``run/``) with the
    program's ``stdout.txt`` and ``stderr.txt`` beside it. It is the reference of the resume
    test (which also checks that the same command gives the same bytes), the run the evaluate,
    predict and export tests read, and the ``all_on`` variant of the ablation test
    (``ablate``'s all-on is this command)."""

    def build(folder: Path) -> None:
        cmd = [sys.executable, "-m", "jaxdqn.train", "--no-progress", *POPULATION_ARGS]
        res = subprocess.run(
            [*cmd, "--run-dir", "run"],
            cwd=folder,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=900,
        )
        (folder / "stdout.txt").write_text(res.stdout)
        (folder / "stderr.txt").write_text(res.stderr)
        assert res.returncode == 0, res.stderr[-3000:]

    return shared("population", build) / "run"
