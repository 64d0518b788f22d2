"""Test-session setup: one folder per test session, shared by every process of the session —
pytest, each pytest-xdist worker and every program a test starts — holding

- ``xla/``: JAX's persistent compilation cache (``jaxdqn.program.launch.runtime``), never the user's
  ``~/.cache``. A program compiled once in the session (a Trainer in a worker, or ``python -m
  jaxdqn.train`` in a subprocess) is loaded from it by every later process that builds the same
  program, whichever worker runs it. On the CPU a loaded executable is the compiled one:
  results do not change.
- ``runs/``: the trained runs that several tests only read (:mod:`shared_runs`), each trained
  once per session under a file lock.

The controller makes the folder in ``pytest_configure`` and names it in ``JAXDQN_TEST_SESSION``;
the xdist workers, started after it, inherit the variable and use the same folder. It is set
before collection imports anything that could compile, together with jaxdqn's XLA flags, so
that the programs compiled in this process are the ones ``python -m jaxdqn.train`` compiles in
the tests' subprocesses (they inherit ``XLA_FLAGS``; the CPU flags change float rounding: a test
comparing a training here with one in a subprocess needs both under the same flags).
"""

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from shared_runs import SESSION_ENV

# (the session folder, whether this process made it, the environment it replaced)
_SESSION = pytest.StashKey[tuple[Path, bool, dict[str, str | None]]]()
_REPLACED = ("JAXDQN_COMPILE_CACHE", "XLA_FLAGS", SESSION_ENV)
# The tests' programs are compiled without LLVM's optimisations: the same HLO (the same
# programs, the same results up to float rounding), compiled in a fraction of the time, which is
# most of the suite's time (issue 27: compile 2,026 of 3,503 worker-seconds at the default
# level, 585 of 1,326 at level 0). The subprocesses the tests start inherit XLA_FLAGS, so runs
# compared with each other are compiled alike. Production runs keep XLA's defaults.
#
# And with XLA's older CPU fusion code generators (LLVM IR emitters, not the MLIR fusion
# emitters): the same fusions, compiled in about 60 % of the time (a cold smoke training's
# compilations 15.8 -> 9.5 s, 400 small eager compilations 8.9 -> 5.2 s; the suite 594 -> 441 s;
# 2-core EPYC). Two programs computing the same numbers (a replay and a walk, a vmapped panel
# walk and an instrument's own) may then round differently in the last bits where XLA's default
# code generation gives the same bits: the two tests that compare such pairs say so.
#
# Only where the programs compile for the CPU: on a GPU the kernel tests
# (JAXDQN_KERNEL_BACKEND=pallas) must run the code the production runs compile.
TEST_XLA_FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")
GPU_PLUGINS = ("jax_cuda13_plugin", "jax_cuda12_plugin", "jax_rocm7_plugin", "jax_rocm60_plugin")


def compiles_for_cpu(platforms: str | None, plugins=GPU_PLUGINS) -> bool:
    """Whether this session's programs compile for the CPU, decided before JAX starts a backend
    (XLA reads XLA_FLAGS once, when it does): JAX_PLATFORMS' first entry when it is set, else
    whether no GPU plugin is installed."""
    if platforms and platforms.strip():
        return platforms.split(",")[0].strip() == "cpu"
    return not any(importlib.util.find_spec(name) for name in plugins)


def pytest_configure(config):
    from jaxdqn.program.launch import runtime

    old = {k: os.environ.get(k) for k in _REPLACED}
    inherited = os.environ.get(SESSION_ENV)
    if os.environ.get("PYTEST_XDIST_WORKER") and inherited and Path(inherited).is_dir():
        folder, owner = Path(inherited), False
    else:
        folder, owner = Path(tempfile.mkdtemp(prefix="jaxdqn_test_session_")), True
        (folder / "runs").mkdir()
    config.stash[_SESSION] = (folder, owner, old)
    os.environ[SESSION_ENV] = str(folder)
    os.environ["JAXDQN_COMPILE_CACHE"] = str(folder / "xla")
    if compiles_for_cpu(os.environ.get("JAX_PLATFORMS")):
        os.environ["XLA_FLAGS"] = runtime.merge_xla_flags(
            os.environ.get("XLA_FLAGS", ""), TEST_XLA_FLAGS
        )
    runtime.configure(folder / "xla")


def pytest_unconfigure(config):
    if _SESSION not in config.stash:  # pytest_configure failed before it set the session up
        return
    folder, owner, old = config.stash[_SESSION]
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    if owner:
        shutil.rmtree(folder, ignore_errors=True)


# The modules whose tests cost the most worker-seconds, most expensive first (`python
# bench/suite_costs.py` measures them). pytest-xdist hands out whole modules (``--dist
# loadfile``) in collection order (``--no-loadscope-reorder``), so starting with the longest
# ones keeps both workers busy to the end instead of leaving one module running alone.
HEAVY_FIRST = (
    "test_sweep.py",
    "test_sweep_postgres.py",
    "test_sweep_population.py",
    "test_train.py",
    "test_scale.py",
    "test_scale_runs.py",
    "test_network.py",
    "test_iteration.py",
    "test_ablate.py",
    "test_walkforward.py",
    "test_runtime.py",
    "test_losses.py",
    "test_acting.py",
    "test_schedule.py",
)


def _module_fixtures(item) -> set[str]:
    defs = item._fixtureinfo.name2fixturedefs
    return {name for name, d in defs.items() if d and d[-1].scope in ("module", "session")}


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: file order kept
    # ``slow`` marks the tests that take seconds (``pytest -m "not slow"`` is the quick loop).
    # A test that shares a module-scoped fixture with a slow test is slow too: the fixture's
    # cost falls on whichever of them runs first.
    heavy = {
        (item.path, name)
        for item in items
        if item.get_closest_marker("slow")
        for name in _module_fixtures(item)
    }
    for item in items:
        if any((item.path, name) in heavy for name in _module_fixtures(item)):
            item.add_marker(pytest.mark.slow)
