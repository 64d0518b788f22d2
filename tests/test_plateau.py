"""O5 plateau detection and the O4/O6 decisions on scripted metric sequences.

Both detectors are relative (issue 11): a branch is frozen when its Q-gap moved by less than
``plateau_velocity_eps`` × its previous gap, and the Sharpe detector fires when the val Sharpe
moved by less than ``plateau_sharpe_eps`` standard errors of it."""

from __future__ import annotations

import json
import math

import pytest

from jaxdqn.config import TrainConfig
from jaxdqn.evaluation.metrics import sharpe_se
from jaxdqn.program.run.plateau import PlateauState, after_rewind, observe
from jaxdqn.program.run.run_state import RunState

# Binary-exact numbers throughout, so every velocity and Sharpe delta below is exact.
# With a Sharpe standard error of 1 the Sharpe threshold is plateau_sharpe_eps itself.
CFG = TrainConfig(plateau_threshold=2, plateau_velocity_eps=0.25, plateau_sharpe_eps=0.125)
FLAT = (1.0, 2.0, 3.0, 4.0)


def run(seq, cfg=CFG, state=None, se=1.0):
    """Feed ``[(sharpe, q_gap), ...]``; return the final state and every report."""
    state = state or PlateauState()
    reports = []
    for sharpe, gap in seq:
        state, rep = observe(state, sharpe, gap, cfg, sharpe_se=se)
        reports.append(rep)
    return state, reports


def moving(e: int) -> tuple[float, ...]:
    """Q-gaps that double every epoch in every branch (velocity = the previous gap: never
    frozen at eps 0.25)."""
    return tuple(g * 2**e for g in FLAT)


def test_o5_first_epoch_runs_no_detector():
    state, rep = observe(PlateauState(), 0.5, FLAT, CFG, sharpe_se=1.0)
    assert rep.fired == "none"
    assert rep.plateau_epochs == 0 and rep.action == "none"
    assert rep.frozen == (False,) * 4
    assert all(math.isnan(v) for v in rep.velocity) and math.isnan(rep.sharpe_delta)
    assert state.prev_sharpe == 0.5 and state.prev_q_gap == FLAT


def test_o5_q_gap_detector_alone():
    # Sharpe moves by 1.0 per epoch (> 0.125); every branch's gap is constant.
    _, reps = run([(float(e), FLAT) for e in range(3)])
    assert [r.fired for r in reps] == ["none", "q_gap", "q_gap"]
    assert [r.plateau_epochs for r in reps] == [0, 1, 2]
    assert reps[1].velocity == (0.0, 0.0, 0.0, 0.0)
    assert reps[1].frozen == (True,) * 4
    assert reps[1].sharpe_delta == 1.0


def test_o5_sharpe_detector_alone():
    # Sharpe changes by 0.0625 (< 0.125); every gap doubles.
    _, reps = run([(0.5 + 0.0625 * e, moving(e)) for e in range(3)])
    assert [r.fired for r in reps] == ["none", "sharpe", "sharpe"]
    assert [r.plateau_epochs for r in reps] == [0, 1, 2]
    assert reps[2].velocity == (2.0, 4.0, 6.0, 8.0)
    assert reps[2].frozen == (False,) * 4
    assert reps[2].sharpe_delta == 0.0625


def test_o5_both_detectors():
    _, reps = run([(0.5, FLAT), (0.5, FLAT)])
    assert reps[1].fired == "both" and reps[1].plateau_epochs == 1


def test_o5_counter_resets_when_neither_fires():
    seq = [
        (0.5, FLAT),  # first epoch: 0
        (0.5, FLAT),  # both: 1
        (0.5, moving(1)),  # sharpe: 2 -> reset_branches (threshold 2)
        (1.5, moving(2)),  # neither: back to 0
        (1.5, moving(2)),  # both: 1
    ]
    state, reps = run(seq)
    assert [r.fired for r in reps] == ["none", "both", "sharpe", "none", "both"]
    assert [r.plateau_epochs for r in reps] == [0, 1, 2, 0, 1]
    assert [r.action for r in reps] == ["none", "none", "reset_branches", "none", "none"]
    assert state.plateau_epochs == 1 and state.resets == 1 and state.rewinds == 0


def test_o5_per_branch_frozen_flags():
    # Velocities (0, -0.125, 1.0, -1.0) against 0.25 × the previous gaps (0.25, 0.5, 0.75, 1):
    # the first two branches are frozen, the others are not (the last exactly at its
    # threshold), so the Q-gap detector (all branches) does not fire.
    cur = (1.0, 1.875, 4.0, 3.0)
    _, reps = run([(0.0, FLAT), (5.0, cur)])
    assert reps[1].velocity == (0.0, -0.125, 1.0, -1.0)
    assert reps[1].frozen == (True, True, False, False)
    assert reps[1].fired == "none" and reps[1].plateau_epochs == 0


def test_o5_thresholds_are_strict():
    # |velocity| == eps · |previous gap| and |Δ Sharpe| == eps · SE do not count as zero.
    cur = tuple(g * 1.25 for g in FLAT)
    _, reps = run([(0.0, FLAT), (0.125, cur)])
    assert reps[1].frozen == (False,) * 4
    assert reps[1].fired == "none"
    off = TrainConfig(plateau_threshold=2, plateau_velocity_eps=0.0, plateau_sharpe_eps=0.0)
    _, reps = run([(0.5, FLAT), (0.5, FLAT)], cfg=off)
    assert reps[1].fired == "none"


def test_o5_velocity_threshold_is_relative_to_the_previous_gap():
    """Q is in reward-scale units: the same relative movement gives the same flags whatever the
    scale of the gaps (2⁻²⁰ … 2²⁰, exact in binary)."""
    cur = (1.0, 1.875, 4.0, 3.0)  # relative velocities 0, 1/16, 1/3, 1/4 at eps 1/4
    for scale in (2.0**-20, 1.0, 2.0**20):
        _, reps = run([(0.0, tuple(g * scale for g in FLAT)), (5.0, tuple(g * scale for g in cur))])
        assert reps[1].frozen == (True, True, False, False), scale
    # the same absolute velocity 0.5: frozen on a gap of 4, not on a gap of 1
    _, reps = run([(0.0, (4.0, 1.0, 4.0, 1.0)), (5.0, (4.5, 1.5, 3.5, 0.5))])
    assert reps[1].frozen == (True, False, True, False)
    # a collapsed gap (0): only a velocity below eps · 1e-12 counts as frozen
    _, reps = run([(0.0, (0.0,) * 4), (5.0, (0.0, 1e-13, 1e-11, -1e-13))])
    assert reps[1].frozen == (True, True, False, True)


def test_o5_sharpe_threshold_is_in_standard_errors():
    # Δ Sharpe 0.1875: not a plateau at SE 1 (threshold 0.125), a plateau at SE 2 (0.25)
    seq = [(0.5, moving(0)), (0.6875, moving(1))]
    assert run(seq, se=1.0)[1][1].fired == "none"
    assert run(seq, se=2.0)[1][1].fired == "sharpe"
    # The default: fires below 0.1 SE; on 600 daily val bars SE ≈ 0.65, so Δ 0.05 is noise
    # (a fixed 0.01 could never tell a plateau from noise), and Δ 0.1 is not.
    cfg = TrainConfig()
    assert cfg.plateau_sharpe_eps == 0.1
    se = sharpe_se(0.5, 600, 252)
    assert 0.6 < se < 0.7
    assert run([(0.5, moving(0)), (0.55, moving(1))], cfg=cfg, se=se)[1][1].fired == "sharpe"
    assert run([(0.5, moving(0)), (0.6, moving(1))], cfg=cfg, se=se)[1][1].fired == "none"


def test_o5_nan_sharpe_handling():
    nan = math.nan
    # NaN then NaN: identical "no signal" -> the Sharpe detector fires.
    _, reps = run([(nan, moving(0)), (nan, moving(1))])
    assert reps[1].fired == "sharpe" and reps[1].plateau_epochs == 1
    assert math.isnan(reps[1].sharpe_delta)
    # NaN next to a finite value never fires, in either order.
    _, reps = run([(nan, moving(0)), (0.5, moving(1)), (nan, moving(2))])
    assert [r.fired for r in reps] == ["none", "none", "none"]
    # Equal infinities are identical; different ones are not.
    _, reps = run([(math.inf, moving(0)), (math.inf, moving(1)), (-math.inf, moving(2))])
    assert [r.fired for r in reps] == ["none", "sharpe", "none"]


def test_o5_nan_q_gap_is_not_frozen():
    cur = (1.0, math.nan, 3.0, 4.0)
    _, reps = run([(0.0, FLAT), (5.0, cur)])
    assert reps[1].frozen == (True, False, True, True)
    assert reps[1].fired == "none"


def test_o6_actions_at_threshold_and_threshold_plus_3():
    # A permanent plateau: constant metrics for 9 epochs, threshold 2.
    state, reps = run([(0.5, FLAT)] * 9)
    assert [r.plateau_epochs for r in reps] == [0, 1, 2, 3, 4, 5, 6, 7, 8]
    actions = [r.action for r in reps]
    assert actions == ["none", "none", "reset_branches", "none", "none", "rewind"] + ["none"] * 3
    # The caller did not rewind: no second rewind or reset follows, the counter keeps going.
    assert state.resets == 1 and state.rewinds == 0 and state.plateau_epochs == 8


def test_o6_after_rewind_restarts_the_cycle():
    state, reps = run([(0.5, FLAT)] * 6)
    assert reps[-1].action == "rewind"
    state = after_rewind(state)
    assert state == PlateauState(None, None, plateau_epochs=0, rewinds=1, resets=1)
    # First epoch after the rewind: nothing to compare with, even though metrics repeat.
    state, reps = run([(0.5, FLAT)] * 6, state=state)
    assert reps[0].fired == "none" and reps[0].plateau_epochs == 0
    assert [r.action for r in reps] == ["none", "none", "reset_branches", "none", "none", "rewind"]
    assert after_rewind(state).rewinds == 2 and state.resets == 2


@pytest.mark.parametrize(
    ("branch_reset", "rewind", "expected"),
    [
        (True, True, {2: "reset_branches", 5: "rewind"}),
        (False, True, {5: "rewind"}),
        (True, False, {2: "reset_branches"}),
        (False, False, {}),
    ],
)
def test_o6_switches(branch_reset, rewind, expected):
    cfg = TrainConfig(
        plateau_threshold=2,
        plateau_velocity_eps=0.25,
        plateau_sharpe_eps=0.125,
        branch_reset=branch_reset,
        rewind=rewind,
    )
    state, reps = run([(0.5, FLAT)] * 8, cfg=cfg)
    assert {i: r.action for i, r in enumerate(reps) if r.action != "none"} == expected
    assert state.resets == int(branch_reset)


def test_o5_threshold_follows_config():
    cfg = TrainConfig(plateau_threshold=4, plateau_velocity_eps=0.25, plateau_sharpe_eps=0.125)
    _, reps = run([(0.5, FLAT)] * 9, cfg=cfg)
    assert {i: r.action for i, r in enumerate(reps) if r.action != "none"} == {
        4: "reset_branches",
        7: "rewind",
    }


def test_o5_state_survives_json():
    state, rep = run([(math.nan, FLAT), (math.nan, FLAT)])
    back = PlateauState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert back.prev_q_gap == state.prev_q_gap and back.plateau_epochs == 1
    assert math.isnan(back.prev_sharpe)
    # Same next decision from the restored state as from the original.
    a = observe(back, math.nan, FLAT, CFG, sharpe_se=1.0)[1]
    b = observe(state, math.nan, FLAT, CFG, sharpe_se=1.0)[1]
    assert (a.fired, a.plateau_epochs, a.action) == (b.fired, b.plateau_epochs, "reset_branches")
    json.dumps(rep[-1].to_dict())
    assert PlateauState.from_dict(PlateauState().to_dict()) == PlateauState()


def test_o5_rejects_wrong_number_of_branches():
    with pytest.raises(ValueError, match="q_gap"):
        observe(PlateauState(), 0.0, (1.0, 2.0, 3.0), CFG, sharpe_se=1.0)


def test_o6_run_state_holds_the_plateau_state_and_each_counter_once():
    state, _ = run([(0.5, FLAT)] * 6)
    host = RunState(
        epoch=6,
        cycle_start=6,
        best_sharpe=0.5,
        best_epoch=3,
        eval_q_std_ema=[0.125],
        plateau=after_rewind(state),
        partial={"loss": [[math.nan], [1.5]]},
    )
    d = json.loads(json.dumps(host.to_json()))
    assert "rewinds" not in d and "resets" not in d  # kept by the plateau state only
    assert d["plateau"]["rewinds"] == 1 and d["plateau"]["resets"] == 1
    back = RunState.from_json(d)
    assert (back.rewinds, back.resets) == (1, 1) and back.plateau == host.plateau
    assert math.isnan(back.partial["loss"][0][0]) and back.partial["loss"][1] == [1.5]
    back.partial = host.partial
    assert back == host
    # A fresh run state (best Sharpe -inf, stored as null) survives JSON too.
    assert RunState.from_json(json.loads(json.dumps(RunState().to_json()))) == RunState()
