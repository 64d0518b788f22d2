"""Test-session setup: programs started by the tests keep their compilation cache in a temporary
folder, never in the user's ``~/.cache`` (``jaxdqn.program.runtime``)."""

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _private_compile_cache(tmp_path_factory):
    old = os.environ.get("JAXDQN_COMPILE_CACHE")
    os.environ["JAXDQN_COMPILE_CACHE"] = str(tmp_path_factory.mktemp("compile_cache"))
    yield
    if old is None:
        os.environ.pop("JAXDQN_COMPILE_CACHE", None)
    else:
        os.environ["JAXDQN_COMPILE_CACHE"] = old
