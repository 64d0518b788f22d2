"""E3 outputs: metrics.jsonl, TensorBoard events and the progress display
(jaxdqn.program.records.logger, jaxdqn.program.records.tensorboard, jaxdqn.program.run.progress)."""

from __future__ import annotations

import io
import json
import math
import struct
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from jaxdqn.program.records import tensorboard
from jaxdqn.program.records.logger import LogError, RunLogger, read_metrics
from jaxdqn.program.run.progress import Progress


def _strict_lines(path: Path) -> list[dict]:
    """Parse every line rejecting the non-standard NaN / Infinity tokens."""

    def reject(token: str):
        raise AssertionError(f"non-standard JSON token {token}")

    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n")
    return [json.loads(line, parse_constant=reject) for line in text.splitlines()]


def _record(epoch: int, **extra) -> dict:
    rec = {
        "epoch": epoch,
        "lr": 3e-4,
        "loss": 1.5 * epoch,
        "q_gap": [0.1, 0.2, 0.3, 0.4],
        "frozen": [False, True, False, False],
        "detector": "none",
        "action": "none",
        "restart": False,
    }
    rec.update(extra)
    return rec


def test_e3_logger_json_lines_convert_values_and_nan_to_null(tmp_path):
    with RunLogger(tmp_path, tensorboard=False, console=False) as log:
        log.log_epoch(
            {
                "epoch": jnp.int32(1),
                "loss": np.float32(2.5),
                "loss_c51": float("nan"),
                "grad_norm": np.float64(np.inf),
                "q_gap": jnp.array([0.5, 0.25, 0.0, -1.0], jnp.float32),
                "q_std": np.array([[1.0, np.nan], [-np.inf, 2.0]]),
                "frozen": np.array([True, False, False, True]),
                "restart": np.bool_(True),
                "action": "rewind",
                "val": {"sharpe": jnp.float32(0.75), "sortino": np.nan},
                "rewinds": jnp.int32(2),
            }
        )
        # Durable before close: the line is already on disk.
        (rec,) = _strict_lines(tmp_path / "metrics.jsonl")
    assert rec == {
        "epoch": 1,
        "loss": 2.5,
        "loss_c51": None,
        "grad_norm": None,
        "q_gap": [0.5, 0.25, 0.0, -1.0],
        "q_std": [[1.0, None], [None, 2.0]],
        "frozen": [True, False, False, True],
        "restart": True,
        "action": "rewind",
        "val": {"sharpe": 0.75, "sortino": None},
        "rewinds": 2,
    }
    assert isinstance(rec["epoch"], int) and isinstance(rec["rewinds"], int)
    assert read_metrics(tmp_path) == [rec]


def test_e3_logger_rejects_bad_records(tmp_path):
    log = RunLogger(tmp_path, tensorboard=False, console=False)
    with pytest.raises(ValueError, match="integer 'epoch'"):
        log.log_epoch({"loss": 1.0})
    with pytest.raises(TypeError, match=r"record\.bad"):
        log.log_epoch({"epoch": 1, "bad": object()})
    log.log_epoch(_record(1))
    with pytest.raises(ValueError, match="not after the last logged epoch 1"):
        log.log_epoch(_record(1))
    assert [r["epoch"] for r in read_metrics(tmp_path)] == [1]


def test_e3_logger_truncate_after_and_resume_appends(tmp_path):
    log = RunLogger(tmp_path, tensorboard=False, console=False)
    for e in range(1, 6):
        log.log_epoch(_record(e))
    assert log.truncate_after(3) == 2
    assert [r["epoch"] for r in read_metrics(tmp_path)] == [1, 2, 3]
    assert log.last_epoch == 3
    with pytest.raises(ValueError):
        log.log_epoch(_record(3))
    log.log_epoch(_record(4, loss=99.0))
    log.close()

    # A new process resuming the run continues after the last logged epoch.
    resumed = RunLogger(tmp_path, tensorboard=False, console=False)
    assert resumed.last_epoch == 4
    assert resumed.truncate_after(10) == 0
    assert resumed.truncate_after(0) == 4
    assert read_metrics(tmp_path) == [] and resumed.last_epoch is None
    resumed.log_epoch(_record(1))
    recs = _strict_lines(tmp_path / "metrics.jsonl")
    assert [r["epoch"] for r in recs] == [1]


def test_e3_logger_cuts_torn_last_line_and_rejects_corruption(tmp_path):
    path = tmp_path / "metrics.jsonl"
    good = json.dumps(_record(1)) + "\n" + json.dumps(_record(2)) + "\n"
    path.write_text(good + '{"epoch": 3, "loss": 1.', encoding="utf-8")
    assert [r["epoch"] for r in read_metrics(path)] == [1, 2]
    log = RunLogger(tmp_path, tensorboard=False, console=False)
    assert log.last_epoch == 2
    assert path.read_text(encoding="utf-8") == good
    log.log_epoch(_record(3))
    assert [r["epoch"] for r in _strict_lines(path)] == [1, 2, 3]

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "metrics.jsonl").write_text('{"epoch": 1}\nnot json\n{"epoch": 3}\n')
    with pytest.raises(LogError, match="line 2 is not valid JSON"):
        RunLogger(bad, tensorboard=False, console=False)
    with pytest.raises(LogError, match="line 2"):
        read_metrics(bad)


def test_e3_logger_note_goes_to_events_log_and_stderr(tmp_path, capsys):
    log = RunLogger(tmp_path, tensorboard=False, console=True)
    log.note("rewind to epoch 7")
    quiet = RunLogger(tmp_path, tensorboard=False, console=False)
    quiet.note("resumed at epoch 9")
    assert capsys.readouterr().err == "[jaxdqn] rewind to epoch 7\n"
    lines = (tmp_path / "events.log").read_text().splitlines()
    assert [ln.split(" ", 1)[1] for ln in lines] == ["rewind to epoch 7", "resumed at epoch 9"]


def test_e3_tb_scalars_flatten_vectors_and_split_seeds():
    rec = {
        "epoch": 4,
        "lr": 1e-3,
        "q_gap": [0.1, 0.2, 0.3, 0.4],
        "frozen": [False, True, False, False],
        "detector": "sharpe",
        "big": list(range(100)),
        "val": {"sharpe": None},
    }
    runs = tensorboard.tb_scalars(rec)
    assert list(runs) == [""]
    got = runs[""]
    assert got["lr"] == pytest.approx(1e-3)
    assert [got[f"q_gap/{i}"] for i in range(4)] == pytest.approx([0.1, 0.2, 0.3, 0.4])
    assert [got[f"frozen/{i}"] for i in range(4)] == [0.0, 1.0, 0.0, 0.0]
    assert "val/sharpe" not in got  # None: nothing to plot
    assert (
        "epoch" not in got and "detector" not in got and not any(k.startswith("big") for k in got)
    )

    seeded = tensorboard.tb_scalars(
        {
            "epoch": 1,
            "lr": 0.5,
            "val_sharpe": [1.0, 2.0, 3.0],
            "q_gap": np.arange(12).reshape(3, 4),
        },
        num_seeds=3,
    )
    assert seeded[""] == {"lr": 0.5}
    assert seeded["seed2"]["val_sharpe"] == 3.0
    assert seeded["seed1"]["q_gap/3"] == 7.0


def _read_events(path: Path, event_pb2) -> list:
    """Decode a TFRecord file of Event protos (length, crc, payload, crc)."""
    data, i, events = path.read_bytes(), 0, []
    while i < len(data):
        (n,) = struct.unpack("<Q", data[i : i + 8])
        ev = event_pb2.Event()
        ev.ParseFromString(data[i + 12 : i + 12 + n])
        events.append(ev)
        i += 12 + n + 4
    return events


def _scalars(run_dir: Path, event_pb2) -> dict[tuple[int, str], float]:
    out = {}
    for f in sorted(run_dir.glob("events.out.tfevents.*")):
        for ev in _read_events(f, event_pb2):
            for v in ev.summary.value:
                out[(ev.step, v.tag)] = v.simple_value
    return out


_BACKENDS = [
    ("tensorboardX", "tensorboardX.proto.event_pb2"),
    ("tensorboard", "tensorboard.compat.proto.event_pb2"),
]


@pytest.mark.parametrize(("backend", "proto"), _BACKENDS)
def test_e3_logger_writes_tensorboard_events(tmp_path, backend, proto):
    pytest.importorskip(tensorboard.BACKEND_MODULES[backend][0])
    event_pb2 = pytest.importorskip(proto)
    with RunLogger(tmp_path, tensorboard=backend, console=False) as log:
        assert log.tensorboard_backend == backend
        log.log_epoch(_record(1))
        log.log_epoch(_record(2, loss=float("nan")))
        # Flushed each epoch: readable before close.
        got = _scalars(tmp_path / "tb", event_pb2)
    assert got[(1, "loss")] == pytest.approx(1.5)
    assert math.isnan(got[(2, "loss")])
    assert got[(2, "q_gap/3")] == pytest.approx(0.4)
    assert got[(1, "frozen/1")] == 1.0
    assert got[(1, "lr")] == pytest.approx(3e-4)
    assert not any(tag in ("detector", "action", "epoch") for _, tag in got)

    # Truncation reopens the writer with a purge of the abandoned epochs.
    log = RunLogger(tmp_path, tensorboard=backend, console=False)
    log.truncate_after(1)
    log.log_epoch(_record(2, loss=7.0))
    log.close()
    starts = [
        ev.step
        for f in (tmp_path / "tb").glob("events.out.tfevents.*")
        for ev in _read_events(f, event_pb2)
        if ev.HasField("session_log") and ev.session_log.status == event_pb2.SessionLog.START
    ]
    assert starts == [2]


def test_e3_logger_tensorboard_per_seed_runs(tmp_path):
    event_pb2 = pytest.importorskip("tensorboardX.proto.event_pb2")
    with RunLogger(tmp_path, console=False, num_seeds=3) as log:
        log.log_epoch({"epoch": 1, "lr": 0.1, "val_sharpe": [0.5, 1.0, -0.5]})
    assert _scalars(tmp_path / "tb", event_pb2) == {(1, "lr"): pytest.approx(0.1)}
    for s, v in enumerate([0.5, 1.0, -0.5]):
        assert _scalars(tmp_path / "tb" / f"seed{s}", event_pb2) == {(1, "val_sharpe"): v}


def test_e3_logger_without_tensorboard_writer_warns_and_logs_jsonl(tmp_path, monkeypatch):
    monkeypatch.setattr(tensorboard, "find_backend", lambda choice: None)
    with pytest.warns(RuntimeWarning, match="TensorBoard logging disabled"):
        log = RunLogger(tmp_path, console=False)
    log.log_epoch(_record(1))
    assert log.tensorboard_backend is None
    assert not (tmp_path / "tb").exists()
    assert [r["epoch"] for r in read_metrics(tmp_path)] == [1]


def test_e3_progress_plain_lines_when_not_a_terminal(monkeypatch):
    for var in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(var, raising=False)  # rich would treat the stream as a terminal
    out = io.StringIO()
    with Progress(30, stream=out, start_epoch=2) as prog:
        prog.update(
            {
                "epoch": 3,
                "val_sharpe": 0.4123,
                "lr": 2.9e-4,
                "loss": 3.1234,
                "env_steps_per_s": 123456.0,
                "updates_per_s": 350.2,
                "plateau_epochs": 2,
                "detector": "sharpe",
                "action": "none",
                "restart": True,
            }
        )
        prog.log("a note")
        prog.update({"epoch": 4, "val_sharpe": [0.3, 0.5, None], "lr": 1e-3})
    lines = out.getvalue().splitlines()
    assert lines[0].startswith(
        "epoch 3/30  val_sharpe 0.41  lr 2.9e-04  loss 3.12  env_steps/s 1.2e+05  "
        "updates/s 350  plateau 2 (sharpe)  sgdr_restart  elapsed 0:00:00  eta "
    )
    assert lines[1] == "a note"
    # Per-seed lists show mean±std over the finite seeds; absent fields are left out.
    assert lines[2].startswith("epoch 4/30  val_sharpe 0.40±0.10  lr 1.0e-03  elapsed")
    assert "\x1b[" not in out.getvalue()


def test_e3_progress_disabled_prints_nothing():
    out = io.StringIO()
    with Progress(3, enabled=False, stream=out) as prog:
        prog.update({"epoch": 1, "loss": 1.0})
        prog.log("hidden")
    assert out.getvalue() == ""


def test_e3_progress_rich_bar_on_a_terminal():
    out = io.StringIO()
    with Progress(3, stream=out, force_terminal=True) as prog:
        for e in (1, 2, 3):
            prog.update({"epoch": e, "val_sharpe": 0.5, "loss": 2.0})
    text = out.getvalue()
    assert "3/3" in text and "val_sharpe 0.50" in text
    assert "elapsed 0:00:00  eta" not in text  # not the plain-line format
