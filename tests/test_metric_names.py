"""E3 metric names: the registry (jaxdqn.program.records.metric_names) is exactly what a run logs.

The reference runs in ``bench/reference/`` (re-recorded 2026-12-01 with the code of issue 11's
final defaults) log every registered name: the host ``kappa`` (A1's scheduled temperature
factor) and the agent's ``end_atom_mass`` (L7 coverage) added by issue 11, and no longer the
device metric ``learning_rate`` (the host ``lr`` is the learning rate).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jaxdqn.evaluation.metrics import performance
from jaxdqn.program.records import metric_names

REFERENCE = Path(__file__).resolve().parent.parent / "bench" / "reference"
REMOVED = {"learning_rate"}
ADDED = {"kappa": metric_names.HOST, "end_atom_mass": metric_names.AGENT}


def _logged_keys(run: str) -> set[str]:
    lines = (REFERENCE / run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    assert records
    keys = {k for r in records for k in r}
    assert all(set(r) == keys for r in records)  # every epoch logs the same names
    assert not keys & REMOVED and set(ADDED) <= keys
    return keys


def test_e3_metric_names_additions_are_registered_and_documented():
    for name, group in ADDED.items():
        assert name in group and name in metric_names.METRICS
        assert metric_names.METRICS[name]
    assert "A1" in metric_names.HOST["kappa"] and "L7" in metric_names.AGENT["end_atom_mass"]


def test_e3_metric_names_equal_the_single_seed_record():
    single = set(metric_names.METRICS) - set(metric_names.POPULATION)
    assert _logged_keys("smoke_seed3") == single


def test_e3_metric_names_equal_the_population_record():
    assert _logged_keys("smoke_2seeds") == set(metric_names.METRICS)


def test_e3_metric_names_groups_are_disjoint_and_documented():
    groups = metric_names.GROUPS.values()
    assert sum(len(g) for g in groups) == len(metric_names.METRICS)
    assert all(doc and "\n" not in doc for doc in metric_names.METRICS.values())
    assert "learning_rate" not in metric_names.METRICS
    assert metric_names.LOSS_PARTS[0] == "loss"
    assert all(k.startswith("loss") for k in metric_names.LOSS_PARTS)
    # The validation group is val_ + every metric of a walk with positions and trades.
    walk = performance([0.01, -0.02, 0.03], positions=[1.0, 0.5, 0.0], traded=[1.0, 0.5, 0.5])
    assert set(metric_names.VALIDATION) == {f"val_{k}" for k in walk}


def test_e3_metric_names_require_rejects_unknown_names():
    assert metric_names.require("lr", "q_gap") == ("lr", "q_gap")
    with pytest.raises(KeyError, match="learning_rate"):
        metric_names.require("lr", "learning_rate")
