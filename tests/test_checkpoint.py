"""O6 checkpoints: bit-exact round trip, latest-N ∪ best-N retention, corrupt fallback."""

from __future__ import annotations

import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from jaxdqn.program.checkpoints.checkpoint import Checkpointer, CheckpointError, score

REPO = Path(__file__).resolve().parent.parent
# pytest resets warning filters per test; orbax's unawaited metadata read after a failed restore
# is the harmless echo that jaxdqn.program.checkpoints.checkpoint silences in a program.
pytestmark = pytest.mark.filterwarnings("ignore:coroutine .* was never awaited:RuntimeWarning")


@struct.dataclass
class Inner:
    w: jax.Array
    key: jax.Array
    name: str = struct.field(pytree_node=False, default="inner")


class Counters(NamedTuple):
    step: jax.Array
    done: jax.Array


def make_state(i: int) -> dict:
    """A nested pytree with every leaf kind the train state uses; values depend on ``i``."""
    k = jax.random.PRNGKey(i)
    return {
        "inner": Inner(w=jax.random.normal(k, (3, 4), jnp.float32), key=jax.random.split(k)[1]),
        "counters": Counters(step=jnp.int32(7 * i), done=jnp.array([True, False, i % 2 == 1])),
        "tuple": (jnp.uint32(2**32 - 1 - i), jnp.zeros((0, 5), jnp.float32)),
        # NaN payload and negative zero must survive bit for bit.
        "special": jnp.array([np.nan, -0.0, np.inf, i], jnp.float32),
        "numpy": np.arange(4, dtype=np.int64) * i,
    }


def assert_bit_exact(got, want):
    chex.assert_trees_all_equal_structs(got, want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert type(g) is type(w) or (isinstance(g, jax.Array) and isinstance(w, jax.Array))
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape
        assert g.tobytes() == w.tobytes()


def fill(directory, metrics, keep_latest=2, keep_best=2):
    ckpt = Checkpointer(directory, keep_latest=keep_latest, keep_best=keep_best)
    for step, m in enumerate(metrics):
        ckpt.save(step, make_state(step), {"epoch": step, "best": m}, m)
    return ckpt


def test_o6_checkpoint_round_trip_bit_exact(tmp_path):
    state = make_state(3)
    host = {"epoch": 3, "plateau": {"prev_q_gap": [0.5, 0.25, 1.0, 2.0]}, "best": math.nan}
    with Checkpointer(tmp_path / "ck", keep_latest=1, keep_best=1) as ckpt:
        ckpt.save(3, state, host, 1.25)
        assert ckpt.steps() == [3] and ckpt.count() == 1
    # A fresh instance (as after a restart) restores from an abstract target.
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype) if isinstance(x, jax.Array) else x,
        make_state(0),
    )
    with Checkpointer(tmp_path / "ck", keep_latest=1, keep_best=1) as ckpt:
        got, got_host, step = ckpt.restore("latest", abstract)
        assert ckpt.metrics() == {3: 1.25}
    assert step == 3
    assert_bit_exact(got, state)
    assert got["inner"].name == "inner"
    assert isinstance(got["counters"], Counters) and isinstance(got["inner"], Inner)
    assert got_host["epoch"] == 3 and got_host["plateau"] == host["plateau"]
    assert math.isnan(got_host["best"])
    # The restored PRNG key behaves like the saved one.
    np.testing.assert_array_equal(
        jax.random.uniform(got["inner"].key, (3,)), jax.random.uniform(state["inner"].key, (3,))
    )


def test_o6_checkpoint_leading_seed_axis(tmp_path):
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    state = jax.vmap(lambda k: {"k": k, "w": jax.random.normal(k, (2, 2)), "t": jnp.int32(1)})(keys)
    with Checkpointer(tmp_path, keep_latest=1, keep_best=1) as ckpt:
        ckpt.save(0, state, {}, 0.0)
        got, _, _ = ckpt.restore(0, jax.tree.map(jnp.zeros_like, state))
    assert got["k"].shape == (3, 2) and got["k"].dtype == jnp.uint32
    assert_bit_exact(got, state)


def test_o6_checkpoint_retention_latest_and_best(tmp_path):
    # step:     0    1    2    3    4    5    6
    metrics = [1.0, 5.0, math.nan, 4.0, 0.5, -2.0, 0.1]
    ckpt = fill(tmp_path, metrics)
    # latest 2 = {5, 6}; best 2 by metric = {1 (5.0), 3 (4.0)}; NaN (step 2) never best.
    assert ckpt.steps() == [1, 3, 5, 6]
    assert sorted(int(p.name) for p in tmp_path.iterdir() if p.name.isdigit()) == [1, 3, 5, 6]
    assert ckpt.best_step() == 1 and ckpt.latest_step() == 6
    assert ckpt.metrics() == {1: 5.0, 3: 4.0, 5: -2.0, 6: 0.1}
    ckpt.close()


def test_o6_checkpoint_nan_metric_is_never_best(tmp_path):
    ckpt = fill(tmp_path, [math.nan, -3.0, math.nan, math.nan], keep_latest=1, keep_best=1)
    assert ckpt.steps() == [1, 3]
    assert ckpt.best_step() == 1
    assert math.isnan(ckpt.metrics()[3])
    assert score(math.nan) == -math.inf and score(math.inf) == -math.inf and score(2) == 2.0


def test_o6_checkpoint_restore_best(tmp_path):
    ckpt = fill(tmp_path, [0.5, 2.0, 1.0, math.nan], keep_latest=1, keep_best=2)
    state, host, step = ckpt.restore("best", make_state(0))
    assert step == 1 and host == {"epoch": 1, "best": 2.0}
    assert_bit_exact(state, make_state(1))
    state, _, step = ckpt.restore(2, make_state(0))
    assert step == 2
    assert_bit_exact(state, make_state(2))


def corrupt_truncate(step_dir: Path):
    for p in (step_dir / "state").rglob("*"):
        if p.is_file() and p.parent.name == "d":
            with open(p, "r+b") as f:
                f.truncate(3)


def corrupt_delete_manifest(step_dir: Path):
    (step_dir / "state" / "manifest.ocdbt").unlink()


def corrupt_garble_host(step_dir: Path):
    (step_dir / "host" / "metadata").write_text('{"epoch": ')


def corrupt_delete_meta(step_dir: Path):
    shutil.rmtree(step_dir / "meta")


def corrupt_swap_state(step_dir: Path):
    # Readable, well-formed data that is not what this step saved: only the checksum sees it.
    other = step_dir.parent / str(int(step_dir.name) - 1) / "state"
    shutil.rmtree(step_dir / "state")
    shutil.copytree(other, step_dir / "state")


@pytest.mark.parametrize(
    "corrupt",
    [
        corrupt_truncate,
        corrupt_delete_manifest,
        corrupt_garble_host,
        corrupt_delete_meta,
        corrupt_swap_state,
    ],
)
def test_o6_checkpoint_corrupt_latest_falls_back(tmp_path, caplog, corrupt):
    fill(tmp_path, [1.0, 2.0, 3.0], keep_latest=3, keep_best=1).close()
    corrupt(tmp_path / "2")
    ckpt = Checkpointer(tmp_path, keep_latest=3, keep_best=1)
    with caplog.at_level(logging.WARNING, logger="jaxdqn.program.checkpoints.checkpoint"):
        state, host, step = ckpt.restore("latest", make_state(0))
    assert step == 1 and host["epoch"] == 1
    assert_bit_exact(state, make_state(1))
    warnings = [
        r.getMessage() for r in caplog.records if r.name == "jaxdqn.program.checkpoints.checkpoint"
    ]
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert "step 2" in warnings[0] and "unreadable" in warnings[0]
    # The corrupt step is moved aside, so the run can write step 2 again.
    assert ckpt.steps() == [0, 1] and (tmp_path / "2.corrupt").is_dir()
    ckpt.save(2, make_state(5), {"epoch": 2}, 0.0)
    assert_bit_exact(ckpt.restore("latest", make_state(0))[0], make_state(5))


def test_o6_checkpoint_corrupt_best_falls_back_to_next_best(tmp_path, caplog):
    fill(tmp_path, [2.0, 9.0, 5.0, 1.0], keep_latest=1, keep_best=3).close()
    corrupt_truncate(tmp_path / "1")
    ckpt = Checkpointer(tmp_path, keep_latest=1, keep_best=3)
    with caplog.at_level(logging.WARNING, logger="jaxdqn.program.checkpoints.checkpoint"):
        _, host, step = ckpt.restore("best", make_state(0))
    assert step == 2 and host["best"] == 5.0
    assert ckpt.best_step() == 2
    assert any(
        "step 1" in r.getMessage()
        for r in caplog.records
        if r.name == "jaxdqn.program.checkpoints.checkpoint"
    )


def test_o6_checkpoint_all_corrupt_raises(tmp_path, caplog):
    fill(tmp_path, [1.0, 2.0], keep_latest=2, keep_best=1).close()
    corrupt_truncate(tmp_path / "0")
    corrupt_garble_host(tmp_path / "1")
    ckpt = Checkpointer(tmp_path, keep_latest=2, keep_best=1)
    with (
        caplog.at_level(logging.WARNING, logger="jaxdqn.program.checkpoints.checkpoint"),
        pytest.raises(CheckpointError, match=r"no restorable checkpoint .*tried steps 1, 0") as e,
    ):
        ckpt.restore("latest", make_state(0))
    assert "\n" not in str(e.value)
    assert (
        len([r for r in caplog.records if r.name == "jaxdqn.program.checkpoints.checkpoint"]) == 2
    )
    with pytest.raises(CheckpointError, match="no checkpoints"):
        ckpt.restore("best", make_state(0))


def test_o6_checkpoint_garbled_metrics_file_is_moved_aside_on_open(tmp_path, caplog):
    fill(tmp_path, [1.0, 2.0], keep_latest=2, keep_best=1).close()
    (tmp_path / "1" / "metrics" / "metrics").write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="jaxdqn.program.checkpoints.checkpoint"):
        ckpt = Checkpointer(tmp_path, keep_latest=2, keep_best=1)
    assert ckpt.steps() == [0] and (tmp_path / "1.corrupt").is_dir()
    ours = [
        r.getMessage() for r in caplog.records if r.name == "jaxdqn.program.checkpoints.checkpoint"
    ]
    assert len(ours) == 1 and "step 1" in ours[0]


def test_o6_checkpoint_target_mismatch_is_an_error_not_a_fallback(tmp_path):
    ckpt = fill(tmp_path, [1.0, 2.0], keep_latest=2, keep_best=1)
    wrong = make_state(0)
    wrong["numpy"] = np.zeros(5, np.int64)
    with pytest.raises(CheckpointError, match=r"\['numpy'\]: saved int64\[4\].*target int64\[5\]"):
        ckpt.restore("latest", wrong)
    with pytest.raises(CheckpointError, match="state leaves"):
        ckpt.restore("latest", {"w": jnp.zeros(3)})
    assert ckpt.steps() == [0, 1]  # nothing was treated as corrupt


def test_o6_checkpoint_never_overwrites(tmp_path):
    ckpt = fill(tmp_path, [1.0, 2.0], keep_latest=2, keep_best=1)
    with pytest.raises(CheckpointError, match="larger than the latest"):
        ckpt.save(1, make_state(9), {}, 0.0)
    (tmp_path / "5").mkdir()
    with pytest.raises(CheckpointError, match="already exists"):
        ckpt.save(5, make_state(9), {}, 0.0)
    with pytest.raises(CheckpointError, match="JSON"):
        ckpt.save(6, make_state(9), {"x": object()}, 0.0)
    with pytest.raises(CheckpointError, match="typed PRNG key"):
        ckpt.save(6, {"k": jax.random.key(0)}, {}, 0.0)
    with pytest.raises(CheckpointError, match="arrays only"):
        ckpt.save(6, {"n": 3}, {}, 0.0)
    with pytest.raises(CheckpointError, match="step 4"):
        ckpt.restore(4, make_state(0))
    assert ckpt.steps() == [0, 1]
    assert_bit_exact(ckpt.restore(1, make_state(0))[0], make_state(1))


def test_o6_checkpoint_ignores_interrupted_save(tmp_path):
    fill(tmp_path, [1.0], keep_latest=1, keep_best=1).close()
    # What a SIGKILL during orbax's write leaves behind: a temporary step directory.
    tmp = tmp_path / "1.orbax-checkpoint-tmp-1234567"
    (tmp / "state").mkdir(parents=True)
    (tmp / "state" / "junk").write_bytes(b"\0" * 10)
    ckpt = Checkpointer(tmp_path, keep_latest=1, keep_best=1)
    assert ckpt.steps() == [0]
    ckpt.save(1, make_state(1), {"epoch": 1}, 0.0)
    assert_bit_exact(ckpt.restore("latest", make_state(0))[0], make_state(1))


def test_o6_checkpoint_close_waits_for_the_removal_of_interrupted_saves(tmp_path):
    """A reader (evaluate, predict) opens and closes without saving: orbax's clean-up of
    interrupted saves, started in a thread on open, has finished when ``close`` returns (a
    program exiting while it ran printed a traceback after its one-line error)."""
    fill(tmp_path, [1.0], keep_latest=1, keep_best=1).close()
    interrupted = [tmp_path / f"{k}.orbax-checkpoint-tmp-1234567" for k in range(2, 22)]
    for tmp in interrupted:
        (tmp / "state").mkdir(parents=True)
    ckpt = Checkpointer(tmp_path, keep_latest=1, keep_best=1)
    assert ckpt.steps() == [0]
    ckpt.close()
    assert not any(tmp.exists() for tmp in interrupted)


@pytest.mark.slow
def test_o6_checkpoint_complete_when_killed_right_after_save(tmp_path):
    child = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {str(REPO)!r})
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_checkpoint import make_state
        from jaxdqn.program.checkpoints.checkpoint import Checkpointer
        ckpt = Checkpointer({str(tmp_path)!r}, keep_latest=2, keep_best=1)
        ckpt.save(0, make_state(0), {{"epoch": 0}}, 1.0)
        ckpt.save(1, make_state(1), {{"epoch": 1}}, 0.5)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    ckpt = Checkpointer(tmp_path, keep_latest=2, keep_best=1)
    state, host, step = ckpt.restore("latest", make_state(0))
    assert step == 1 and host == {"epoch": 1}
    assert_bit_exact(state, make_state(1))
    assert ckpt.best_step() == 0


def test_h1_each_members_best_step_is_kept_and_restored(tmp_path):
    """A population's checkpoints keep each member's best step by its own metric besides the
    latest-N ∪ best-N, the retention predicted before each save is the one on disk, and
    ``restore("best", member=m)`` returns member m's best."""
    means = [0.0, 3.0, 1.0, 2.0, 0.5, math.nan]
    members = [[0.0, 9.0], [5.0, 1.0], [1.0, 1.0], [2.0, 2.0], [0.5, 0.5], [math.nan] * 2]
    ckpt = Checkpointer(tmp_path, keep_latest=1, keep_best=1, members=2)
    for step, (m, per) in enumerate(zip(means, members, strict=True)):
        predicted = ckpt.kept_after(step, m, per)
        ckpt.save(step, make_state(step), {"epoch": step}, m, per)
        assert ckpt.steps() == predicted, step
    # latest (5) ∪ best mean (1) ∪ member 0's best (1) ∪ member 1's best (0, an old step no
    # other rule keeps)
    assert ckpt.steps() == [0, 1, 5]
    assert ckpt.best_step() == 1 and ckpt.best_step(member=0) == 1 and ckpt.best_step(member=1) == 0
    state, host, step = ckpt.restore("best", make_state(0), member=1)
    assert step == 0 and host == {"epoch": 0}
    assert_bit_exact(state, make_state(0))
    ckpt.close()
    again = Checkpointer(tmp_path, keep_latest=1, keep_best=1, members=2)  # read back from disk
    assert again.member_metrics(1) == {0: 9.0, 1: 1.0, 5: again.member_metrics(1)[5]}
    assert math.isnan(again.member_metrics(1)[5]) and again.best_step(member=1) == 0
    with pytest.raises(CheckpointError, match="1 member metrics for 2 members"):
        again.save(6, make_state(6), {}, 1.0, [1.0])
    again.close()
    # without members nothing changes: the metrics item holds the val Sharpe alone
    plain = fill(tmp_path / "plain", [1.0, 2.0])
    assert plain.steps() == [0, 1]
    assert all(math.isnan(v) for v in plain.member_metrics(0).values())
    held = [p.read_text() for p in sorted((tmp_path / "plain").glob("*/metrics/metrics"))]
    assert held and all('"members"' not in text for text in held)
    plain.close()
