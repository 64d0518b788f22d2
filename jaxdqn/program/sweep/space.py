"""A sweep file (``python -m jaxdqn.sweep SWEEP.yaml``): the study, each trial's base run and
the search space, typed and checked before any trial starts.

    study: lr_gamma             # the study's name in its storage
    config: configs/smoke.yaml  # every trial's base config (null: the embedded default)
    overrides: [train.epochs=4] # fixed overrides of every trial (a population is allowed)
    trials: 12                  # completed trials the search needs (all workers together)
    metric: sharpe              # the val metric a trial reports (its summary.json "val")
    direction: maximize         # maximize | minimize
    sampler: tpe                # tpe | random (Optuna's samplers)
    seed: 0                     # mixed with each worker's host and pid: workers draw apart
    max_failed: 12              # failed trials (bad values, non-finite runs) that stop it
    pruner: {type: median, warmup: 2, startup: 3}   # optional: stop trials early (below)
    space:                      # a dotted config key per parameter:
      optim.lr: {low: 1.0e-4, high: 3.0e-3, log: true}     # float range (log: log-uniform)
      replay.batch_size: {low: 32, high: 128, step: 32}    # integer range (both ends ints)
      model.sh1: {choices: [64, 128, 256]}                 # categorical

Any config key may be searched, shapes and architectures included (each trial is its own
program); ``seed`` may not (luck is not a hyperparameter: seeds are ``train.num_seeds`` inside
a trial), nor ``population.*`` (a population is a fixed override, trained in one program by
every trial), nor ``eval.walk_test`` (trials never walk test: the winner is walked on test
after the search). Every range end and choice is checked against the config before the study
starts, so a bad key or value is one line, not a failed trial.

``pruner`` (optional; none by default) stops unpromising trials after an epoch, on the
per-epoch val score the run's own checkpoint selection sees (the mean over seeds of
``val_<metric>``; a population trial: its best member's mean val Sharpe, so ``metric`` must be
``sharpe``): ``{type: median, warmup: W, startup: K}`` (Optuna's median rule: a trial whose
score after epoch e is worse than the median of earlier trials' scores after epoch e, once K
trials have finished) or ``{type: threshold, worse_than: X, warmup: W}`` (a score worse than
X). No trial is stopped within its first W epochs (default 1), nor after its last (it
finishes). A stopped trial is *pruned*: its run keeps its checkpoints and log (``python -m
jaxdqn.train --resume RUN`` finishes it), it counts toward ``trials``, and every val Sharpe it
compared counts in the DSR's N.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from jaxdqn import config as config_lib
from jaxdqn.config import Config, ConfigError
from jaxdqn.config.loading import inline_yaml
from jaxdqn.config.members import ranked_members

__all__ = ["Param", "Pruner", "SweepSpec", "load_spec", "trial_overrides"]

REFUSED_PREFIXES = {
    "seed": "seeds are train.num_seeds inside a trial (luck is not a hyperparameter)",
    "population.": "a population is a fixed override (overrides:), trained in one program",
    "eval.walk_test": "trials never walk test; the winner is walked on test after the search",
}
SPEC_KEYS = (
    "study",
    "config",
    "overrides",
    "trials",
    "metric",
    "direction",
    "sampler",
    "seed",
    "max_failed",
    "pruner",
    "space",
)
PRUNERS = ("median", "threshold")
SAMPLERS = ("tpe", "random")
DIRECTIONS = ("maximize", "minimize")


@dataclasses.dataclass(frozen=True)
class Param:
    """One searched config key: a float range ``[low, high]`` (log-uniform with ``log``), an
    integer range (both ends integers, optional ``step``), or ``choices``."""

    key: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple[Any, ...] | None = None

    @property
    def kind(self) -> str:
        if self.choices is not None:
            return "choice"
        return "int" if isinstance(self.low, int) and isinstance(self.high, int) else "float"

    def suggest(self, trial: Any) -> Any:
        """The trial's value (``optuna.Trial.suggest_*``)."""
        if self.kind == "choice":
            return trial.suggest_categorical(self.key, list(self.choices))
        if self.kind == "int":
            return trial.suggest_int(
                self.key, self.low, self.high, step=self.step or 1, log=self.log
            )
        return trial.suggest_float(self.key, self.low, self.high, step=self.step, log=self.log)

    def ends(self) -> tuple[Any, ...]:
        """The values that bound the parameter: both ends, or every choice."""
        return self.choices if self.kind == "choice" else (self.low, self.high)

    def to_json(self) -> dict[str, Any]:
        out = {"choices": list(self.choices)} if self.kind == "choice" else {
            "low": self.low, "high": self.high, "log": self.log, "step": self.step
        }  # fmt: skip
        return {"key": self.key, **out}


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    """A checked sweep file (module docstring)."""

    study: str
    space: tuple[Param, ...]
    trials: int
    config: str | None = None
    overrides: tuple[str, ...] = ()
    metric: str = "sharpe"
    direction: str = "maximize"
    sampler: str = "tpe"
    seed: int = 0
    max_failed: int | None = None
    pruner: Pruner | None = None

    @property
    def failures_allowed(self) -> int:
        return self.trials if self.max_failed is None else self.max_failed

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["space"] = [p.to_json() for p in self.space]
        out["overrides"] = list(self.overrides)
        return out

    def identity(self) -> str:
        """sha256 of everything but ``trials`` and ``max_failed`` (which a resumed study may
        raise): two workers of one study must search the same space over the same runs."""
        same = {k: v for k, v in self.to_json().items() if k not in ("trials", "max_failed")}
        if same["pruner"] is None:  # (studies begun before pruning keep their identity)
            del same["pruner"]
        return hashlib.sha256(json.dumps(same, sort_keys=True).encode()).hexdigest()

    def base_config(self, extra: Sequence[str] = ()) -> Config:
        return config_lib.load(self.config, [*self.overrides, "eval.walk_test=false", *extra])


@dataclasses.dataclass(frozen=True)
class Pruner:
    """When a trial is stopped after an epoch (module docstring): ``type`` median or
    threshold, ``warmup`` epochs never stopped after, ``startup`` finished trials before the
    median rule acts, ``worse_than`` the threshold's score."""

    type: str
    warmup: int = 1
    startup: int = 2
    worse_than: float | None = None


def _pruner(where: str, body: Any) -> Pruner | None:
    if body is None:
        return None
    if not isinstance(body, Mapping) or body.get("type") not in PRUNERS:
        raise _fail(where, f"pruner: expected {{type: {' | '.join(PRUNERS)}, ...}}, got {body!r}")
    kind = body["type"]
    known = {"type", "warmup"} | ({"startup"} if kind == "median" else {"worse_than"})
    unknown = set(body) - known
    if unknown:
        raise _fail(where, f"pruner: unknown fields {sorted(unknown)} for type {kind} "
                    f"({', '.join(sorted(known))})")  # fmt: skip
    ints = {k: body.get(k, Pruner.warmup if k == "warmup" else Pruner.startup)
            for k in ("warmup", "startup")}  # fmt: skip
    for name, v in ints.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise _fail(where, f"pruner.{name}: expected an integer >= 0, got {v!r}")
    worse = body.get("worse_than")
    if kind == "threshold":
        if isinstance(worse, bool) or not isinstance(worse, (int, float)) or math.isnan(worse):
            raise _fail(where, f"pruner.worse_than: expected a number, got {worse!r}")
        worse = float(worse)
    return Pruner(kind, ints["warmup"], ints["startup"], worse)


def _fail(where: str, msg: str) -> ConfigError:
    return ConfigError(f"{where}: {msg}")


def _param(where: str, key: str, body: Any) -> Param:
    if not isinstance(body, Mapping):
        raise _fail(where, f"space.{key}: expected {{low, high[, log, step]}} or {{choices}}")
    unknown = set(body) - {"low", "high", "log", "step", "choices"}
    if unknown:
        raise _fail(where, f"space.{key}: unknown fields {sorted(unknown)} (low, high, log, "
                    "step, choices)")  # fmt: skip
    if "choices" in body:
        if set(body) != {"choices"}:
            raise _fail(where, f"space.{key}: choices stand alone (no low/high/log/step)")
        choices = body["choices"]
        if not isinstance(choices, list) or len(choices) < 2:
            raise _fail(where, f"space.{key}.choices: expected a list of two or more values")
        if not all(isinstance(c, (bool, int, float, str)) or c is None for c in choices):
            raise _fail(where, f"space.{key}.choices: values must be scalars, got {choices!r}")
        return Param(key, choices=tuple(choices))
    if "low" not in body or "high" not in body:
        raise _fail(where, f"space.{key}: a range needs low and high")
    low, high, log, step = body["low"], body["high"], body.get("log", False), body.get("step")
    for name, v in (("low", low), ("high", high), ("step", step)):
        ok = v is None if name == "step" else False
        if not ok and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise _fail(where, f"space.{key}.{name}: expected a number, got {v!r}")
        if isinstance(v, float) and not math.isfinite(v):
            raise _fail(where, f"space.{key}.{name}: must be finite, got {v!r}")
    if not isinstance(log, bool):
        raise _fail(where, f"space.{key}.log: expected true or false, got {log!r}")
    if not low < high:
        raise _fail(where, f"space.{key}: low must be below high, got {low!r} and {high!r}")
    if log and low <= 0:
        raise _fail(where, f"space.{key}: a log range needs low > 0, got {low!r}")
    if log and step is not None:
        raise _fail(where, f"space.{key}: a log range takes no step")
    if step is not None and step <= 0:
        raise _fail(where, f"space.{key}.step: must be > 0, got {step!r}")
    is_int = isinstance(low, int) and isinstance(high, int)
    if is_int and step is not None and not isinstance(step, int):
        raise _fail(where, f"space.{key}.step: an integer range takes an integer step")
    return Param(key, low, high, log, step)


def _refused(key: str) -> str | None:
    for prefix, why in REFUSED_PREFIXES.items():
        if key == prefix or (prefix.endswith(".") and key.startswith(prefix)):
            return why
    return None


def load_spec(path: str | Path, *, trials: int | None = None) -> SweepSpec:
    """Read and check the sweep file at ``path`` (``trials``: replaces the file's).

    Raises:
      ConfigError: unreadable file, unknown field, bad value, a key that may not be searched,
        or a range end or choice the config refuses (one line naming the field).
    """
    p = Path(path)
    where = str(p)
    try:
        tree = yaml.safe_load(p.read_text())
    except OSError as e:
        raise _fail(where, f"cannot read the sweep file ({e.strerror or e})") from None
    except yaml.YAMLError as e:
        raise _fail(where, f"not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(tree, Mapping):
        raise _fail(where, "the top level must be a mapping (study, space, trials, ...)")
    unknown = set(tree) - set(SPEC_KEYS)
    if unknown:
        raise _fail(where, f"unknown fields {sorted(unknown)}; known: {', '.join(SPEC_KEYS)}")
    for needed in ("study", "space", "trials"):
        if tree.get(needed) is None:
            raise _fail(where, f"{needed}: required")
    study = tree["study"]
    if not isinstance(study, str) or not study.strip() or "/" in study:
        raise _fail(where, f"study: expected a name (no '/'), got {study!r}")
    n = tree["trials"] if trials is None else trials
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise _fail(where, f"trials: expected an integer >= 1, got {n!r}")
    max_failed = tree.get("max_failed")
    if max_failed is not None and (isinstance(max_failed, bool) or not isinstance(max_failed, int)
                                   or max_failed < 1):  # fmt: skip
        raise _fail(where, f"max_failed: expected an integer >= 1, got {max_failed!r}")
    overrides = tree.get("overrides") or []
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise _fail(where, "overrides: expected a list of key=value strings")
    for item in overrides:
        if item.split("=", 1)[0].strip() in ("eval.walk_test", "seed"):
            raise _fail(where, f"overrides: {item}: {_refused(item.split('=', 1)[0].strip())}")
    for name, allowed in (("direction", DIRECTIONS), ("sampler", SAMPLERS)):
        if name in tree and tree[name] not in allowed:
            raise _fail(where, f"{name}: {tree[name]!r} is not one of {', '.join(allowed)}")
    seed = tree.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise _fail(where, f"seed: expected an integer, got {seed!r}")
    space = tree["space"]
    if not isinstance(space, Mapping) or not space:
        raise _fail(where, "space: expected a mapping of config keys to ranges or choices")
    params = []
    for key, body in space.items():
        why = _refused(str(key))
        if why:
            raise _fail(where, f"space.{key}: may not be searched ({why})")
        params.append(_param(where, str(key), body))
    config_path = tree.get("config")
    if config_path is not None and not isinstance(config_path, str):
        raise _fail(where, f"config: expected a path, got {config_path!r}")
    spec = SweepSpec(
        study=study,
        space=tuple(params),
        trials=n,
        config=config_path,
        overrides=tuple(overrides),
        metric=str(tree.get("metric", "sharpe")),
        direction=tree.get("direction", "maximize"),
        sampler=tree.get("sampler", "tpe"),
        seed=seed,
        max_failed=max_failed,
        pruner=_pruner(where, tree.get("pruner")),
    )
    _check_against_config(where, spec)
    return spec


def _check_against_config(where: str, spec: SweepSpec) -> None:
    """Every range end and choice must make a config the loader accepts; a pruned population
    trial reports val Sharpe."""
    try:
        base = spec.base_config()
    except ConfigError as e:
        raise _fail(where, f"the trials' base config (config, overrides): {e}") from None
    if spec.pruner is not None and spec.metric != "sharpe" and ranked_members(base):
        raise _fail(where, "pruner: a population trial is pruned on its best member's val "
                    f"Sharpe, so metric must be sharpe (not {spec.metric})")  # fmt: skip
    for p in spec.space:
        for v in p.ends():
            try:
                spec.base_config([f"{p.key}={format_value(v)}"])
            except ConfigError as e:
                raise _fail(where, f"space.{p.key}: {e}") from None


def format_value(v: Any) -> str:
    """``v`` as an override's value (YAML: numbers exact, strings and null as written)."""
    if isinstance(v, float):
        return repr(v)
    return inline_yaml(v)


def trial_overrides(spec: SweepSpec, values: Mapping[str, Any]) -> list[str]:
    """A trial's overrides: the spec's fixed ones, ``eval.walk_test=false`` and the trial's
    value of every searched key (in the space's order)."""
    return [
        *spec.overrides,
        "eval.walk_test=false",
        *(f"{p.key}={format_value(values[p.key])}" for p in spec.space),
    ]
