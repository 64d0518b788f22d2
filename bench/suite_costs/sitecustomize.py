"""Measurement hook of ``bench/suite_costs.py`` (never imported by jaxdqn or the tests).

``bench/suite_costs.py`` puts this folder first on ``PYTHONPATH``, so every Python process of a
test run — pytest, its xdist workers and every program a test starts — runs this file at start.
It appends one JSON line per event to ``$SUITE_COSTS_DIR/<pid>.jsonl``:

- ``start``: the process started (``ppid`` names its parent, so a program maps to the test
  that started it);
- ``trace`` / ``lower`` / ``compile`` / ``cache_load``: JAX's own duration events
  (jaxpr tracing, lowering to StableHLO, the backend compile, a persistent-cache retrieval);
- ``orbax_save`` / ``orbax_restore``: ``Checkpointer.save`` / ``.restore``;
- ``report``: ``write_report`` (the report and its plots);
- ``end``: the process exited (atexit; absent when it was killed).
"""

import atexit
import json
import os
import sys
import time

_DIR = os.environ.get("SUITE_COSTS_DIR")


def _emit(kind, start, dur, name=""):
    line = json.dumps({"pid": os.getpid(), "kind": kind, "t": start, "dur": dur, "name": name})
    with open(os.path.join(_DIR, f"{os.getpid()}.jsonl"), "a") as f:
        f.write(line + "\n")


def _wrap(owner, attr, kind):
    real = getattr(owner, attr)

    def timed(*a, **k):
        t0 = time.time()
        try:
            return real(*a, **k)
        finally:
            _emit(kind, t0, time.time() - t0, attr)

    setattr(owner, attr, timed)


_PATCHES = {
    "jaxdqn.program.checkpoints.checkpoint": [
        ("Checkpointer", "save", "orbax_save"),
        ("Checkpointer", "restore", "orbax_restore"),
    ],
    "jaxdqn.program.report.document": [(None, "write_report", "report")],
}


def _patch_jaxdqn(name, module):
    for cls, attr, kind in _PATCHES[name]:
        _wrap(getattr(module, cls) if cls else module, attr, kind)


_EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": "trace",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
    "/jax/core/compile/backend_compile_duration": "compile",
    "/jax/compilation_cache/cache_retrieval_time_sec": "cache_load",
}


def _listener(event, duration, **kw):
    kind = _EVENTS.get(event)
    if kind:
        _emit(kind, time.time() - duration, duration, str(kw.get("fun_name", "")))


def _after_jax(name, module):
    from jax import monitoring

    monitoring.register_event_duration_secs_listener(_listener)


class _After:
    """A meta-path finder that runs a callback right after a named module has executed."""

    def __init__(self, callbacks):
        self.callbacks = callbacks

    def find_spec(self, name, path, target=None):
        callback = self.callbacks.get(name)
        if callback is None:
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        real_exec = spec.loader.exec_module

        def exec_module(module):
            real_exec(module)
            callback(name, module)

        spec.loader.exec_module = exec_module
        return spec


if _DIR:
    _T0 = time.time()
    _emit("start", _T0, 0.0, json.dumps({"ppid": os.getppid(), "argv": sys.argv[:4]}))
    atexit.register(lambda: _emit("end", time.time(), time.time() - _T0))
    callbacks = {name: _patch_jaxdqn for name in _PATCHES}
    callbacks["jax"] = _after_jax
    sys.meta_path.insert(0, _After(callbacks))
