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
# The population of the shared runs: 2 seeds of the smoke config, one epoch.
POPULATION = ["train.epochs=1", "train.num_seeds=2"]


def ablation_all_on() -> Path:
    """``python -m jaxdqn.ablate --only all_on`` on the smoke config with :data:`POPULATION`:
    every component on (L3 included), 2 seeds, one epoch. Its ``all_on/`` is a complete run
    directory of a 2-seed population (the seed-population test reads it) and the all-on
    reference of the ablation test, which copies it and trains only its own variant."""

    def build(folder: Path) -> None:
        from jaxdqn import ablate

        args = ["--config", str(SMOKE), "--only", "all_on", "--out", str(folder), *POPULATION]
        code = ablate.main(args)
        log = folder / "all_on.log"
        assert code == 0, log.read_text()[-3000:] if log.exists() else code

    return shared("ablation_all_on", build)
