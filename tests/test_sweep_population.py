"""Issue 32 (docs/DESIGN.md, H2): a sweep whose trials are populations — the trial's value is
its winning member's val score, the winner is walked on test at its member's own best
checkpoint (its agents only), and N counts every member's every epoch."""

from __future__ import annotations

import json

import pytest
from test_sweep import FAST, _spec_file, _sweep


@pytest.mark.slow
def test_h2_a_trial_may_be_a_population(tmp_path):
    grid = ["population.optim.lr=[0.002,0.0003]", "population.loss.gamma=[0.9,0.97]"]
    sweep = _spec_file(
        tmp_path,
        study="pop",
        trials=1,
        overrides=[*FAST, "train.num_seeds=2", *grid],
        space={"model.sh2": {"choices": [16, 32]}},
    )
    r = _sweep([sweep, "--dir", tmp_path / "s"], tmp_path, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads((tmp_path / "s" / "sweep.json").read_text())
    winner = result["winner"]
    summary = json.loads((tmp_path / "s" / winner["run_dir"] / "summary.json").read_text())
    member = summary["members"][summary["winner"]["member"]]
    assert winner["member"]["member"] == member["member"]
    assert winner["agents"] == member["agents"] and len(member["agents"]) == 2
    assert winner["value"] == pytest.approx(member["val"]["sharpe"])
    # test: the winning member's two seeds at its own best checkpoint, nothing else
    assert len(result["test_seeds"]) == 2
    assert result["checkpoint_step"] == member["best_step"]
    payload = json.loads((tmp_path / "s" / "winner" / "metrics_test.json").read_text())
    assert payload["agents"] == member["agents"]
    assert payload["checkpoint_steps"] == [member["best_step"]] * 2
    # N: 4 members × 2 seeds × 2 epochs
    assert result["dsr_trials"]["num_trials"] == 16 == result["statistics"]["dsr"]["num_trials"]
