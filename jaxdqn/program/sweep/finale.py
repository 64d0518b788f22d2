"""The end of a search: the winner, selected on val, walked on test once, and the Deflated
Sharpe Ratio over every trial the search saw (issue 32, "honest selection").

* :func:`search_trials` — every val Sharpe the search compared: each agent (members × seeds) at
  each checkpoint (epoch) of each run the trials trained, read from the runs' ``metrics.jsonl``
  (:func:`jaxdqn.program.report.run_statistics.selection_trials`). A run resumed by a requeued
  trial is one run, counted once. N is their number; V[SR] their variance.
* :func:`finale` — the winner is the complete trial with the best val ``metric`` (test plays
  no part; a population trial's value is its own winning member's). Its run's best checkpoint
  is walked on test (:func:`jaxdqn.program.trained.evaluate.evaluate_run`; a population: only
  the winning member's agents) into ``DIR/winner/``, with the DSR over :func:`search_trials`.
  ``DIR/sweep.json`` and ``DIR/sweep.md`` hold the search: every trial, the winner, its test
  metrics and statistics, and N with where it came from.

Only one worker writes the finale (``DIR/finale.lock``); the others say where it will be.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from jaxdqn import config as config_lib
from jaxdqn.config.members import num_members
from jaxdqn.program.records.formats import cell, fixed, markdown_table, to_jsonable
from jaxdqn.program.records.results import write_text_atomic
from jaxdqn.program.report import run_statistics
from jaxdqn.program.sweep.space import SweepSpec
from jaxdqn.program.sweep.study import SweepError, counts, redact, trial_rows

__all__ = ["LOCK", "SWEEP_JSON", "SWEEP_MD", "WINNER", "SearchTrials", "finale", "search_trials"]

SWEEP_JSON, SWEEP_MD, WINNER, LOCK = "sweep.json", "sweep.md", "winner", "finale.lock"
SELECTED_ON = "the best val {metric} of the complete trials (test played no part)"


class SearchTrials(NamedTuple):
    """Every val Sharpe the search saw (``values``, annualised), what they are, and per run
    its directory and how many it gave."""

    values: np.ndarray | None
    what: str
    runs: list[dict[str, Any]]


def search_trials(study: Any, sweep_dir: Path) -> SearchTrials:
    """:class:`SearchTrials` of every run directory the study's trials trained in."""
    rows = trial_rows(study)
    seen: list[str] = []
    for r in rows:
        if r["run_dir"] and r["run_dir"] not in seen:
            seen.append(r["run_dir"])
    values, runs = [], []
    for rel in seen:
        run_dir = sweep_dir / rel
        if not (run_dir / "config.yaml").exists():
            continue  # the trial failed before its run began: it compared nothing
        cfg = config_lib.load(run_dir / "config.yaml")
        v, _ = run_statistics.selection_trials(run_dir, num_members(cfg))
        n = 0 if v is None else int(v.size)
        runs.append({"run_dir": rel, "val_sharpes": n})
        if n:
            values.append(v)
    c = counts(study)
    total = sum(r["val_sharpes"] for r in runs)
    what = (
        f"every val Sharpe the search compared: each agent (members × seeds) at each checkpoint "
        f"of each of its {len(runs)} runs, {total} in all ({len(rows)} Optuna trials: "
        f"{c.complete} complete, {c.pruned} pruned, {c.failed} failed, {c.died} resumed after "
        "their worker died)"
    )
    return SearchTrials(np.concatenate(values) if values else None, what, runs)


def _lock(sweep_dir: Path) -> bool:
    """Take ``finale.lock``; False when a live worker holds it (a dead one's on this host is
    taken over)."""
    path = sweep_dir / LOCK
    mine = f"{socket.gethostname()} {os.getpid()}"
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            host, _, pid = path.read_text().partition(" ")
            if host == socket.gethostname() and pid.strip().isdigit():
                try:
                    os.kill(int(pid), 0)
                except ProcessLookupError:
                    path.unlink(missing_ok=True)  # its worker died: take the finale over
                    continue
                except PermissionError:
                    pass
            return False
        with os.fdopen(fd, "w") as f:
            f.write(mine)
        return True
    return False


def _winner(study: Any, spec: SweepSpec, sweep_dir: Path) -> dict[str, Any]:
    from optuna.trial import TrialState

    complete = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    if not complete:
        raise SweepError(f"study {spec.study!r}: no complete trial to select")
    best = study.best_trial
    run_dir = sweep_dir / best.user_attrs["run_dir"]
    summary = json.loads((run_dir / "summary.json").read_text())
    entry: dict[str, Any] = {
        "trial": best.number,
        "params": dict(best.params),
        "value": best.value,
        "run_dir": best.user_attrs["run_dir"],
        "val": summary["val"],
        "best_epoch": summary["best_epoch"],
        "selected_on": SELECTED_ON.format(metric=spec.metric),
    }
    if "winner" in summary:  # a population: the winning member's agents only
        member = summary["members"][summary["winner"]["member"]]
        entry["member"] = {"member": member["member"], "overrides": member["overrides"]}
        entry["agents"] = member["agents"]
    return entry


def finale(study: Any, spec: SweepSpec, sweep_dir: Path, storage: str) -> dict[str, Any] | None:
    """Write ``winner/``, ``sweep.json`` and ``sweep.md`` (module docstring) and return
    ``sweep.json``'s content; None when another worker is writing them."""
    from jaxdqn.program.trained.evaluate import evaluate_run

    sweep_dir = Path(sweep_dir)
    if not _lock(sweep_dir):
        return None
    try:
        winner = _winner(study, spec, sweep_dir)
        trials = search_trials(study, sweep_dir)
        tmp = sweep_dir / f"{WINNER}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        ev = evaluate_run(
            sweep_dir / winner["run_dir"],
            "test",
            "best",
            [],
            tmp,
            trials=(trials.values, trials.what),
            agents=winner.get("agents"),
        )
        final = sweep_dir / WINNER
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        seeds = ev.payload["seeds"]
        c = counts(study)
        payload = {
            "study": spec.study,
            "storage": redact(storage),
            "spec": spec.to_json(),
            "counts": {
                "optuna_trials": len(study.get_trials(deepcopy=False)),
                **c._asdict(),
                "runs": len(trials.runs),
            },
            "trials": trial_rows(study),
            "winner": winner,
            "test": {k: float(np.nanmean([s[k] for s in seeds])) for k in seeds[0]},
            "test_seeds": seeds,
            "checkpoint_step": ev.payload["checkpoint_step"],
            "statistics": ev.payload["statistics"],
            "dsr_trials": {
                "num_trials": 0 if trials.values is None else int(trials.values.size),
                "what": trials.what,
                "runs": trials.runs,
            },
        }
        write_text_atomic(sweep_dir / SWEEP_JSON, json.dumps(to_jsonable(payload), indent=2))
        write_text_atomic(sweep_dir / SWEEP_MD, "\n".join(report_lines(payload)))
        return payload
    finally:
        (sweep_dir / LOCK).unlink(missing_ok=True)


def _pruner_text(pruner: Mapping[str, Any] | None) -> str:
    if not pruner:
        return "no pruner"
    if pruner["type"] == "median":
        w = pruner["warmup"]
        return (f"median pruner after {pruner['startup']} finished trials, never within a trial's "
                f"first {w} epoch{'' if w == 1 else 's'}")  # fmt: skip
    return f"pruned when worse than {pruner['worse_than']} after epoch {pruner['warmup']}"


def _param_cell(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _trial_table(rows: Sequence[Mapping[str, Any]], keys: Sequence[str], winner: int) -> list[str]:
    body = []
    for r in rows:
        name = f"**{r['number']}** (winner)" if r["number"] == winner else str(r["number"])
        state = r["state"] + (f" (resumes {r['resumes']})" if r.get("resumes") is not None else "")
        params = [_param_cell(r["params"][k]) if k in r["params"] else "" for k in keys]
        note = r.get("error") or ""  # (a pruned trial's: where and on what it was stopped)
        value = "" if r["value"] is None else cell(r["value"])  # (only complete trials have one)
        body.append([name, state, *params, value, r.get("run_dir") or "", note])
    return markdown_table(["trial", "state", *keys, "val score", "run", "note"], body)


def report_lines(payload: Mapping[str, Any]) -> list[str]:
    """``sweep.md``: the search, every trial, the winner on test, and the DSR's N."""
    spec, w, c = payload["spec"], payload["winner"], payload["counts"]
    keys = [p["key"] for p in spec["space"]]
    stats = payload["statistics"]
    dsr = payload["dsr_trials"]
    lines = [
        f"# Sweep {payload['study']}",
        "",
        f"Storage `{payload['storage']}`; base config `{spec['config'] or 'the default'}` with "
        f"`{' '.join(spec['overrides']) or 'no overrides'}`; sampler {spec['sampler']} (seed "
        f"{spec['seed']}); {spec['direction']} val {spec['metric']}.",
        "",
        f"{c['optuna_trials']} Optuna trials: {c['complete']} complete, {c['pruned']} pruned "
        f"({_pruner_text(spec.get('pruner'))}), {c['failed']} failed, {c['died']} whose worker "
        f"died (each resumed by a later trial); {c['runs']} runs.",
        "",
        "## Trials",
        "",
        *_trial_table(payload["trials"], keys, w["trial"]),
        "",
        "## Winner on test",
        "",
        f"Trial {w['trial']} ({w['run_dir']}), selected on {w['selected_on']}: val "
        f"{spec['metric']} {fixed(w['value'])}"
        + (f", member {w['member']['member']} {w['member']['overrides']}" if "member" in w else "")
        + f". Its best checkpoint (step {payload['checkpoint_step']}) walked on test once, "
        "after the search (`winner/`):",
        "",
        *markdown_table(["metric", "test"], [[k, cell(v)] for k, v in payload["test"].items()]),
        "",
        "```",
        *run_statistics.summary_lines(stats),
        "```",
        "",
        "## The Deflated Sharpe Ratio's N",
        "",
        f"N = {dsr['num_trials']}: {dsr['what']}. V[SR] is their variance. Per run:",
        "",
        *markdown_table(
            ["run", "val Sharpes"], [[r["run_dir"], str(r["val_sharpes"])] for r in dsr["runs"]]
        ),
        "",
    ]
    return lines
