"""pytest plugin of ``bench/suite_costs.py``: one JSON line per test phase (setup, call,
teardown) with its process id and wall-clock window, in ``$SUITE_COSTS_DIR/tests-<pid>.jsonl``."""

import json
import os
import time

import pytest


def _timed(item, phase):
    t0 = time.time()
    yield
    line = {
        "pid": os.getpid(),
        "test": item.nodeid,
        "phase": phase,
        "t": t0,
        "dur": time.time() - t0,
    }
    with open(os.path.join(os.environ["SUITE_COSTS_DIR"], f"tests-{os.getpid()}.jsonl"), "a") as f:
        f.write(json.dumps(line) + "\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    yield from _timed(item, "setup")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    yield from _timed(item, "call")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    yield from _timed(item, "teardown")
