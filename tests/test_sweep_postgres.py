"""Issue 32 (docs/DESIGN.md, H2): a sweep's study in a PostgreSQL server (the storage of
workers on many machines), started by the test where the machine has one."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest
from test_sweep import FAST, _spec_file, _sweep


def _postgres_binaries() -> tuple[str, str] | None:
    found = []
    for name in ("initdb", "pg_ctl"):
        path = shutil.which(name) or next(
            iter(sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))), None
        )
        if path is None:
            return None
        found.append(str(path))
    return found[0], found[1]


@pytest.fixture
def postgres_url():
    """A PostgreSQL server of its own on a free loopback port (skipped without one)."""
    bins = _postgres_binaries()
    if bins is None:
        pytest.skip("no PostgreSQL server on this machine (initdb, pg_ctl); .ci/run installs it")
    pytest.importorskip("psycopg", reason="psycopg (the PostgreSQL driver) is not installed")
    initdb, pg_ctl = bins
    folder = Path(tempfile.mkdtemp(prefix="jaxdqn_pg_"))
    as_user = {}
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root: as its own user, else nobody
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            user = pwd.getpwnam("nobody")
        os.chown(folder, user.pw_uid, user.pw_gid)
        # (subprocess's user/group: set in C, no Python run between fork and exec)
        as_user = {"user": user.pw_uid, "group": user.pw_gid}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = folder / "data"
    run = lambda cmd: subprocess.run(cmd, capture_output=True, text=True, timeout=120, **as_user)
    r = run([initdb, "-D", str(data), "-U", "sweep", "--auth=trust"])
    assert r.returncode == 0, r.stderr
    opts = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1"
    r = run([pg_ctl, "-D", str(data), "-o", opts, "-l", str(folder / "log"), "-w", "start"])
    assert r.returncode == 0, r.stderr + (folder / "log").read_text()
    try:
        yield f"postgresql://sweep:pw@127.0.0.1:{port}/postgres"
    finally:
        run([pg_ctl, "-D", str(data), "-m", "immediate", "stop"])
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
def test_h2_a_study_in_postgresql(tmp_path, postgres_url):
    sweep = _spec_file(tmp_path, study="pg", trials=2, overrides=[*FAST, "train.epochs=1"])
    r = _sweep([sweep, "--dir", tmp_path / "s", "--storage", postgres_url], tmp_path, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads((tmp_path / "s" / "sweep.json").read_text())
    assert result["storage"].startswith("postgresql://sweep:***@127.0.0.1")
    assert result["counts"]["complete"] == 2 and result["counts"]["runs"] == 2
    assert result["dsr_trials"]["num_trials"] == 2 == result["statistics"]["dsr"]["num_trials"]
    assert not (tmp_path / "s" / "study.db").exists()  # the study is in the server
