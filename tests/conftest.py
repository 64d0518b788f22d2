"""Test-session setup: one persistent compilation cache per test process, in a temporary
folder, never in the user's ``~/.cache`` (``jaxdqn.program.runtime``).

The programs the tests start (``python -m jaxdqn.train`` ...) find it through
``JAXDQN_COMPILE_CACHE``; the tests that train in this process use it too, so a Trainer built
for the same sizes as an earlier one loads the earlier executables instead of compiling them
again (each closure is a new function to JAX's in-memory cache, but the same program to the
persistent one). On the CPU a loaded executable is the compiled one: results do not change.
It is set in ``pytest_configure``, before collection imports anything that could compile,
together with jaxdqn's XLA flags, so that the programs compiled in this process are the ones
``python -m jaxdqn.train`` compiles (the CPU flags change float rounding: a test comparing a
training here with one in a subprocess needs both under the same flags).
"""

import os
import shutil
import tempfile

import pytest

# (the folder made for this process, the JAXDQN_COMPILE_CACHE it replaced)
_CACHE = pytest.StashKey[tuple[str, str | None]]()


def pytest_configure(config):
    folder = tempfile.mkdtemp(prefix="jaxdqn_test_compile_cache_")
    config.stash[_CACHE] = (folder, os.environ.get("JAXDQN_COMPILE_CACHE"))
    os.environ["JAXDQN_COMPILE_CACHE"] = folder
    from jaxdqn.program import runtime

    runtime.configure(folder)


def pytest_unconfigure(config):
    folder, old = config.stash[_CACHE]
    if old is None:
        os.environ.pop("JAXDQN_COMPILE_CACHE", None)
    else:
        os.environ["JAXDQN_COMPILE_CACHE"] = old
    shutil.rmtree(folder, ignore_errors=True)
