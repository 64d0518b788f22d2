"""Test helper: start a program and kill it with SIGKILL at a chosen point of its progress."""

import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path


def kill_when_exists(
    cmd: Sequence[str], cwd: Path, env: Mapping[str, str], marker: Path, timeout: float = 600.0
) -> None:
    """Run ``cmd`` (output discarded) and SIGKILL it as soon as ``marker`` exists — or when it
    exits by itself, or after ``timeout`` seconds — then reap it. Whether ``marker`` was reached
    is for the caller to assert."""
    proc = subprocess.Popen(
        list(cmd), cwd=cwd, env=dict(env), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + timeout
    while not marker.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
