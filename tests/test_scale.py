"""Scale-out (X1, issue 13): the ``("seed", "data")`` mesh, populations over devices and
one agent data-parallel, and a sharded training run killed and resumed (two processes under
``jax.distributed``: ``tests/test_scale_runs.py``). The multi-device checks run in a subprocess
with ``XLA_FLAGS=--xla_force_host_platform_device_count=4`` (the flag must precede JAX's start;
``tests/scale_worker.py``)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from model_overrides import PER_SAMPLE_MODEL_OFF
from sigkill import kill_when_exists

from jaxdqn.agent import mesh
from jaxdqn.config import ConfigError

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "configs" / "smoke.yaml"
FOUR = "--xla_force_host_platform_device_count=4"
VOLATILE = ("wall_time", "env_steps_per_s", "updates_per_s")


def _env(devices_flag: str = FOUR) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["JAX_PLATFORMS"] = "cpu"
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + devices_flag).strip()
    return env


def _run_worker() -> dict:
    res = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "scale_worker.py")],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def worker() -> dict:
    """Every check's result from one worker process (its checks: all of them). One process,
    because the module runs on one pytest-xdist worker: separate processes would only add
    their start-ups (Python, JAX, the market) one after another. The seed-population check runs
    with every component off (each device holds whole agents: the check is about placement),
    the data-parallel update with every component on, the data-parallel iteration with every
    component that has batch-wide statistics or state on
    (``model_overrides.PER_SAMPLE_MODEL_OFF``)."""
    return _run_worker()


@pytest.mark.slow
def test_scale_worker_sees_four_devices(worker):
    assert worker["devices"] == 4


def test_scale_population_over_four_devices_equals_one_device_member_by_member(worker):
    pop = worker["population"]
    # Same keys, same program per seed: float rounding only (vmap over 1 vs 4 seeds).
    assert pop["state_max_diff"] < 1e-4, pop
    assert pop["metrics_max_diff"] < 1e-4, pop
    assert pop["learning"] > 0  # the learner ran inside the compared iterations
    assert pop["replay_size"] == [192] * 4


def test_scale_data_parallel_update_equals_one_device_on_the_same_global_batch(worker):
    dp = worker["data_parallel_step"]
    assert dp["rank_rewards"] and dp["sampled_target"]  # L5 and L2's draw are exercised
    # The update moves the parameters by ~3e-4 (relative); the split one lands within 1e-3
    # of that move of the one-device result (pmean'd gradients, global M8/L5/L2/M13/L7).
    assert dp["params_moved"] > 1e-5
    for field, diff in dp["field_max_diff"].items():
        assert diff < 1e-5, (field, dp)
    assert dp["metrics_max_diff"] < 1e-5, dp


def test_scale_per_shard_replay_samples_its_own_shard_with_global_is_weights(worker):
    s = worker["per_shard_sampling"]
    assert s["in_shard"] and s["items_from_own_shard"], s
    assert s["weights_max_diff"] < 1e-6, s
    assert s["max_weight"] == pytest.approx(1.0)  # normalised over the global batch


def test_scale_data_parallel_iteration_keeps_every_replica_identical(worker):
    it = worker["data_parallel_iteration"]
    assert it["finite"] and it["learning"] > 0, it
    assert it["replica_spread"] == 0.0, it  # params, optimiser, dynamics: bit-identical copies
    assert it["env_shape"][:2] == [2, 2]  # [seed, data, E/D, obs]
    # every device's shard holds its E/D·K transitions per iteration; the metric sums them
    assert it["replay_size_metric"] == [2.0 * x[0] for x in it["replay_size"]]


def _train(args, cwd, timeout=900):
    cmd = [sys.executable, "-m", "jaxdqn.train", "--no-progress", *args]
    return subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)


def _records(run_dir):
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if k not in VOLATILE} for x in lines]


# The scale worker's data-parallel iteration check (above, same module: same xdist worker,
# run before) compiles this run's iteration — the same program, 2 seeds × 2 data devices — so
# the three training processes below load it from the session's compilation cache.
SHARDED = [
    "--config",
    str(SMOKE),
    "train.epochs=2",
    "train.iterations_per_epoch=3",
    "train.num_seeds=2",
    "train.mesh=2x2",
    *PER_SAMPLE_MODEL_OFF,
]


@pytest.mark.slow
def test_scale_sharded_run_resumes_after_sigkill_exactly(tmp_path):
    """2 seeds × 2 data devices, every component with state on: kill −9 after epoch 1's checkpoint,
    --resume for epoch 2, and the run ends with the uninterrupted run's log and summary."""
    cmd = [sys.executable, "-m", "jaxdqn.train", "--no-progress", *SHARDED]
    # The uninterrupted run first, then the one to be killed: it loads every program from the
    # session's compilation cache instead of compiling them alongside (the suite's 2 cores are
    # busy, so running the two together saved no time and compiled everything twice).
    full = _train(["--run-dir", "full", *SHARDED], tmp_path)
    assert full.returncode == 0, full.stderr[-3000:]
    after_epoch_1 = tmp_path / "run" / "checkpoints" / "3"
    kill_when_exists([*cmd, "--run-dir", "run"], tmp_path, _env(), after_epoch_1)
    assert after_epoch_1.exists()
    events = (tmp_path / "full" / "events.log").read_text()
    assert "4 cpu devices: seed 2 × data 2" in events
    res = _train(["--resume", "run"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert _records(tmp_path / "run") == _records(tmp_path / "full")
    a = json.loads((tmp_path / "full" / "summary.json").read_text())
    b = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert a["val"] == b["val"] and a["test"] == b["test"] and a["seeds"] == b["seeds"]


@pytest.mark.parametrize(
    ("spec", "devices", "seeds", "expected"),
    [
        ("auto", 4, 4, (4, 1)),
        ("auto", 4, 2, (2, 2)),
        ("auto", 2, 1, (1, 2)),
        ("auto", 4, 3, (1, 4)),
        ("seed", 4, 8, (4, 1)),
        ("data", 4, 3, (1, 4)),
        ("2x2", 4, 2, (2, 2)),
        ("1x1", 1, 5, (1, 1)),
    ],
)
def test_scale_parse_mesh(spec, devices, seeds, expected):
    assert mesh.parse_mesh(spec, devices, seeds) == expected


@pytest.mark.parametrize(
    ("spec", "devices", "seeds", "match"),
    [
        ("seed", 4, 3, "do not divide train.num_seeds=3"),
        ("2x2", 8, 4, "set train.devices=4"),
        ("2by2", 4, 4, "not auto, seed, data or SEEDxDATA"),
        ("0x4", 4, 4, "not auto, seed, data or SEEDxDATA"),
    ],
)
def test_scale_parse_mesh_errors(spec, devices, seeds, match):
    with pytest.raises(ConfigError, match=match):
        mesh.parse_mesh(spec, devices, seeds)


def test_scale_layout_refuses_more_devices_than_exist():
    with pytest.raises(ConfigError, match="only 1 cpu device"):
        mesh.make_layout(2, "auto", 2)
    one = mesh.make_layout(3, "auto", 0)
    assert one.mesh is None and one.describe() == "1 device"
