"""python -m jaxdqn.ablate: the variants, the verdict rule and the table (issue 11 item 9)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import shared_runs
import yaml

from jaxdqn import ablate
from jaxdqn.config import ALL_OFF, SWITCHES


def test_ablation_has_one_variant_per_component_switch_and_all_off():
    alone = {k: v for k, v in ablate.VARIANTS.items() if k.startswith("no_")}
    switched = {o.split("=")[0] for _, overrides in alone.values() for o in overrides[-1:]}
    every = {f"{section}.{k}" for section, keys in SWITCHES.items() for k in keys}
    # L6 (aux_training) is not among the ablations; every other switch is.
    assert every - switched == {"loss.aux_training"}
    ids = {spec for spec, _ in ablate.VARIANTS.values()}
    for spec in ("M2", "M4", "M5", "M8", "M9", "M10", "M11", "M12", "M13", "M14"):
        assert spec in ids
    for spec in ("L2", "L3", "L4", "L5", "L7", "A2", "A3"):
        assert spec in ids
    assert "loss.sampled_target=false" in ALL_OFF
    assert ablate.VARIANTS["all_off"][1] == tuple(ALL_OFF)
    assert ablate.VARIANTS["defaults"][1] == ()


def test_ablation_switches_each_component_off_from_all_on():
    """L3 is off by default, so "all on" and every "off alone" start from ALL_ON: each variant
    differs from all_on in exactly its own switch."""
    on = dict(o.split("=") for o in ablate.VARIANTS["all_on"][1])
    assert on == {k: "true" for k in on} and "loss.spread" in on
    for name, (_, overrides) in ablate.VARIANTS.items():
        if not name.startswith("no_"):
            continue
        cfg = dict(o.split("=") for o in overrides)  # the later override wins, as in load
        assert {k for k in on if cfg[k] != on[k]} == {overrides[-1].split("=")[0]}


@pytest.mark.parametrize(
    ("diff", "se", "expected"),
    [
        (-0.5, 0.2, "hurts"),
        (0.5, 0.2, "helps"),
        (-0.39, 0.2, "no measurable effect"),
        (0.39, 0.2, "no measurable effect"),
        (float("nan"), 0.2, "n/a"),
    ],
)
def test_ablation_verdict_needs_two_standard_errors(diff, se, expected):
    assert ablate.verdict(diff, se) == expected


def _summary(path, tests, vals, oracle=1.5, turnover=50.0):
    path.mkdir(parents=True)
    seeds = [
        {
            "seed": i,
            "val": {"sharpe": v},
            "test": {"sharpe": t, "annual_turnover": turnover},
        }
        for i, (t, v) in enumerate(zip(tests, vals, strict=True))
    ]
    base = {"oracle": {"test": {"sharpe": oracle}}, "buy_and_hold": {"test": {"sharpe": 0.2}}}
    (path / "summary.json").write_text(
        json.dumps({"seeds": seeds, "baselines": base, "fault_events": 0})
    )


def test_ablation_table_against_hand_computed_means_and_standard_errors(tmp_path):
    _summary(tmp_path / "all_on", [1.0, 1.2, 1.4], [1.5, 1.5, 1.5])
    _summary(tmp_path / "no_spread", [0.4, 0.5, 0.6], [1.0, 1.0, 1.0])
    _summary(tmp_path / "no_kan", [1.1, 1.2, 1.3], [1.4, 1.4, 1.4])
    md, rows = ablate.table(tmp_path, ["all_on", "no_kan", "no_spread", "no_vsn"])
    assert "no_vsn" not in rows  # not run yet: left out, not invented
    on, off = rows["all_on"], rows["no_spread"]
    assert on["test_mean"] == pytest.approx(1.2) and on["test_std"] == pytest.approx(0.2)
    se = math.sqrt(0.2**2 / 3 + 0.1**2 / 3)
    assert off["diff"] == pytest.approx(-0.7) and off["se"] == pytest.approx(se)
    assert off["verdict"] == "hurts"
    assert rows["no_kan"]["verdict"] == "no measurable effect"
    assert "| no_spread | L3 | 0.500 ± 0.100 | 33 % |" in md
    assert "| all_on | - | 1.200 ± 0.200 | 80 % | — |" in md


def test_ablation_refuses_unknown_variants_with_one_line(capsys, tmp_path):
    code = ablate.main(["--only", "no_such_thing", "--out", str(tmp_path / "a")])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no_such_thing" in err[0]
    assert not (tmp_path / "a").exists()


@pytest.mark.slow
def test_ablation_end_to_end_on_the_smoke_config_and_resumes_by_skipping(tmp_path, capsys):
    """The all-on reference is the session's shared population (``shared_runs.population``:
    the smoke config with every component on is exactly ablate's ``all_on`` with the same
    overrides), copied in as a finished variant: this run trains ``no_kan`` only, and skips
    ``all_on`` exactly as a resumed ablation does."""
    out = tmp_path / "abl"
    out.mkdir()
    shutil.copytree(shared_runs.population(), out / "all_on")
    reference = (out / "all_on" / "summary.json").stat().st_mtime_ns
    smoke = Path(__file__).resolve().parent.parent / "configs" / "smoke.yaml"
    args = ["--config", str(smoke), "--only", "no_kan", "--out", str(out)]
    args += shared_runs.POPULATION
    assert ablate.main(args) == 0
    assert (out / "all_on" / "summary.json").stat().st_mtime_ns == reference  # not retrained
    rows = json.loads((out / "ablation.json").read_text())
    assert set(rows) == {"all_on", "no_kan"} and rows["no_kan"]["n"] == 2
    assert rows["all_on"]["n"] == 2
    saved = yaml.safe_load((out / "no_kan" / "config.yaml").read_text())
    assert saved["model"]["kan"] is False and saved["train"]["num_seeds"] == 2
    assert saved["loss"]["spread"] is True  # off by default, on in every "off alone" variant
    on = yaml.safe_load((out / "all_on" / "config.yaml").read_text())
    assert on["model"]["kan"] is True and on["loss"]["spread"] is True
    assert "| no_kan | M4 |" in (out / "ablation.md").read_text()
    stamp = (out / "no_kan" / "summary.json").stat().st_mtime_ns
    assert ablate.main(args) == 0  # finished variants are skipped, not retrained
    assert (out / "no_kan" / "summary.json").stat().st_mtime_ns == stamp


def test_ablation_bad_data_is_refused_once_before_any_variant(tmp_path, capsys):
    out = tmp_path / "abl"
    missing = tmp_path / "missing.csv"
    code = ablate.main(["--out", str(out), "data.source=csv", f"data.path={missing}"])
    err = capsys.readouterr().err
    assert code == 2 and err.strip().count("\n") == 0 and "missing.csv: no such file" in err
    assert not out.exists()  # no variant started, no empty table written
