"""Scale (issue 13): two processes under ``jax.distributed`` against one process with two
devices (subprocesses with forced CPU devices). The sharded kill −9 and resume is in
``tests/test_scale.py``, after the scale worker's check of the same sharded iteration."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxdqn.config import ALL_OFF

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "configs" / "smoke.yaml"
VOLATILE = ("wall_time", "env_steps_per_s", "updates_per_s")


def _env(devices: int = 4) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["JAX_PLATFORMS"] = "cpu"
    flag = f"--xla_force_host_platform_device_count={devices}"
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + flag).strip()
    return env


def _records(run_dir):
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if k not in VOLATILE} for x in lines]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


# Every component off: this test is about the multi-process runtime (start-up, collectives
# across processes, who writes); the sharded statistics of every component are checked
# against one device in tests/scale_worker.py, and a small program compiles several times
# faster in each of the three processes; the statistics' bootstrap and the cost stress, which
# the comparison does not read, at their smallest.
ONE_AGENT_TWO_DEVICES = [
    "--config",
    str(SMOKE),
    *ALL_OFF,
    "train.epochs=1",
    "train.iterations_per_epoch=3",
    "train.num_seeds=2",
    "train.mesh=data",
    "eval.bootstrap_reps=100",
    "eval.cost_multiples=[1]",
]


@pytest.mark.slow
def test_scale_two_processes_with_jax_distributed_equal_one_process_with_two_devices(tmp_path):
    """jax.distributed on localhost (gloo CPU collectives): two processes of one device each
    write the summary and log of one process with two local devices; only process 0 writes."""
    # the one-process reference alongside the two processes (three programs, one test's time)
    train = [sys.executable, "-m", "jaxdqn.train", "--no-progress", *ONE_AGENT_TWO_DEVICES]
    local = subprocess.Popen(
        [*train, "--run-dir", "local"],
        cwd=tmp_path,
        env=_env(2),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    port = _free_port()
    cmd = [*train, "--run-dir", "multi", "--coordinator", f"localhost:{port}"]
    cmd += ["--num-processes", "2"]
    procs = [
        subprocess.Popen(
            [*cmd, "--process-id", str(i)],
            cwd=tmp_path,
            env=_env(1),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=900) for p in procs]
    _, local_err = local.communicate(timeout=900)
    assert local.returncode == 0, local_err[-3000:]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    assert "2 cpu devices: seed 1 × data 2" in (tmp_path / "multi" / "events.log").read_text()
    assert _records(tmp_path / "multi") == _records(tmp_path / "local")
    a = json.loads((tmp_path / "local" / "summary.json").read_text())
    b = json.loads((tmp_path / "multi" / "summary.json").read_text())
    assert a["val"] == b["val"] and a["test"] == b["test"] and a["seeds"] == b["seeds"]
    assert "done:" in outs[0][0] and "done:" not in outs[1][0]  # process 1 prints nothing
    assert "epoch 1/1" not in outs[1][1]
