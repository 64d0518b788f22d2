"""Process-wide JAX setup of the programs: the persistent compilation cache, jaxdqn's XLA flags
and the garbage collector's thresholds.

Both must be in place before JAX compiles anything (XLA reads ``XLA_FLAGS`` once, when the
first backend starts), so the entry points call :func:`configure` right after parsing their
arguments.

**Compilation cache.** JAX's persistent cache stores every compiled program on disk, keyed by
the program, the jaxlib version and the device, so a repeated run (same config sizes) loads its
executables instead of compiling them again. On by default in :func:`default_cache_dir`:
``$JAXDQN_COMPILE_CACHE`` if set, else ``$XDG_CACHE_HOME/jaxdqn/xla``, else
``~/.cache/jaxdqn/xla``. ``--compile-cache DIR`` chooses another folder and
``--no-compile-cache`` turns it off. Every program is written, however quickly it compiled
(:data:`MIN_COMPILE_SECONDS` = 0; JAX's default writes only those over 1 s): a smoke training
compiles ~26 sub-second programs besides its 4 large ones, and caching them too took a warm
smoke run from 25.3 to 21.4 s and ``python -m jaxdqn.predict`` from ~7 to ~4.5 s (2-core EPYC,
2026-12-03). Deleting the folder is always safe.

**GPU XLA flags** (:data:`GPU_XLA_FLAGS`). XLA command buffers (CUDA graphs) for fusions,
library calls, custom calls (Pallas/Triton) and control flow, with concurrent regions, so that
the ~660 small kernels of one learner update are launched as graphs rather than one by one
(H200, jax 0.11.2, gpu.yaml sizes, B = 4,096: 2,561 → 1,783 µs per update, bench/levers.py).

**The training iteration's own option** (:func:`iteration_compiler_options`). With those flags
the learner's scan body is one graph, Pallas kernels included, but the scan's ``while`` stays on
the host: one graph launch per update (the thunk sequence XLA dumps with ``--xla_dump_to``).
``xla_gpu_command_buffer_unroll_loops`` records a loop of known trip count into the graph
itself: the thunk dump of a 10-update learner scan then shows one graph holding the loop, and
the update took 785 µs instead of 898 all off, 1,277 instead of 1,558 all on (H100, jax 0.11.2,
B = 4,096, bench/levers.py, one call each, 2026-12-07; the whole iteration not yet measured). It
is given to the iteration's program only (``jax.jit(compiler_options=…)``), never process-wide:
the evaluation walks loop over thousands of bars, and with the flag in ``XLA_FLAGS`` a
synthetic_gpu.yaml training's second epoch took 76 s against 6 s for each epoch after it
(bench/learning.py B; no run without the flag in that session to compare). Off where the command
buffers do not cover ``WHILE`` (``--no-xla-flags``) and where the user's ``XLA_FLAGS`` names the
option (the user's value wins).

**CPU XLA flags** (:data:`CPU_XLA_FLAGS`). XLA's CPU backend hands fused groups of matrix
products and elementwise or reduction ops to its YNNPACK library (``ynn_fusion`` kernels); for
this model's small products (e.g. ``[3, 256, 64] @ [64, 153]`` in a branch head) they are slower
than XLA's own kernels. On a 2-core AMD EPYC (AVX2), jax 0.10.2, the iteration of
``configs/synthetic.yaml`` with 3 seeds took 304 ms with them and 250 ms without (median of 18
calls, the two programs compiled in one process and timed in alternation); only the dot
fusions off: 276 ms, only the elementwise/reduce fusions off: 303 ms. The flag only changes the
CPU backend's kernels (the GPU machine's jaxlib accepts it), so CPU float results differ from a
run without it by rounding.

**Garbage collector** (:data:`GC_THRESHOLDS`). Tracing and lowering a program allocate millions
of short-lived Python objects; at CPython's default thresholds (700, 10, 10) the cyclic
collector then runs a young pass every 700 allocations and a full pass over every live object
(JAX's, numpy's, the program's) every 100 of them: 25 % of the tracing time of the smoke
training's iteration (``perf``: ``gc_collect_main`` and its visitors 8.5 % of the whole process,
a quarter of its Python time). At (10,000, 50, 100) the iteration traces in 2.0 s instead of
2.4 and lowers in 0.63 s instead of 0.85 (medians of 3 processes), and a warm-cache smoke
training takes 14.1 s instead of 16.2 (medians of 3; 2-core EPYC, jax 0.10.2, 2026-12-06).
Only the timing of collections changes, never a result; cyclic garbage lives a little longer.

Both sets are appended to ``XLA_FLAGS`` (:data:`XLA_FLAGS`); a flag the user already set there
keeps the user's value; ``--no-xla-flags`` adds none. Each backend accepts and ignores the
other's flags; an unknown flag would abort the process, which a test checks against the
installed jaxlib.
"""

from __future__ import annotations

import argparse
import gc
import os
from collections.abc import MutableMapping
from pathlib import Path

from jaxdqn.config import ConfigError

__all__ = [
    "CPU_XLA_FLAGS",
    "GC_THRESHOLDS",
    "GPU_XLA_FLAGS",
    "ITERATION_XLA_OPTIONS",
    "MIN_COMPILE_SECONDS",
    "XLA_FLAGS",
    "add_arguments",
    "arguments_of",
    "configure",
    "configure_from_args",
    "default_cache_dir",
    "iteration_compiler_options",
    "merge_xla_flags",
]

GPU_XLA_FLAGS: tuple[str, ...] = (
    "--xla_gpu_enable_command_buffer="
    "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,DYNAMIC_SLICE_FUSION,WHILE,CONDITIONAL",
    "--xla_gpu_graph_min_graph_size=1",
    "--xla_gpu_graph_enable_concurrent_region=true",
)
#: XLA debug options of the training iteration's program (see :func:`iteration_compiler_options`)
ITERATION_XLA_OPTIONS: dict[str, bool] = {"xla_gpu_command_buffer_unroll_loops": True}
CPU_XLA_FLAGS: tuple[str, ...] = ("--xla_cpu_experimental_ynn_fusion_type=",)
XLA_FLAGS: tuple[str, ...] = GPU_XLA_FLAGS + CPU_XLA_FLAGS
MIN_COMPILE_SECONDS = 0.0
GC_THRESHOLDS: tuple[int, int, int] = (10_000, 50, 100)


def default_cache_dir(environ: MutableMapping[str, str] | None = None) -> Path:
    """The compilation cache folder (see the module docstring for the order of precedence)."""
    env = os.environ if environ is None else environ
    if env.get("JAXDQN_COMPILE_CACHE"):
        return Path(env["JAXDQN_COMPILE_CACHE"]).expanduser()
    base = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "jaxdqn" / "xla"


def _flag_name(flag: str) -> str:
    return flag.split("=", 1)[0].strip()


def iteration_compiler_options(environ: MutableMapping[str, str] | None = None) -> dict[str, bool]:
    """``jax.jit`` compiler options for the training iteration's program:
    :data:`ITERATION_XLA_OPTIONS` when this process's ``XLA_FLAGS`` records ``while`` loops into
    command buffers (``--xla_gpu_enable_command_buffer`` lists ``WHILE``, as
    :data:`GPU_XLA_FLAGS` does) and does not name those options itself; else ``{}`` (the
    program as XLA's defaults and the user's flags make it). Read after :func:`configure`."""
    env = os.environ if environ is None else environ
    flags = [f for f in env.get("XLA_FLAGS", "").split() if f.startswith("--")]
    named = {_flag_name(f).removeprefix("--") for f in flags}
    if named & set(ITERATION_XLA_OPTIONS):
        return {}
    kinds: set[str] = set()
    for f in flags:
        if _flag_name(f) == "--xla_gpu_enable_command_buffer":
            kinds = {k.strip().upper() for k in f.split("=", 1)[-1].split(",")}
    return dict(ITERATION_XLA_OPTIONS) if kinds & {"WHILE", "+WHILE"} else {}


def merge_xla_flags(existing: str, flags: tuple[str, ...] = XLA_FLAGS) -> str:
    """``existing`` (the user's ``XLA_FLAGS``) plus every flag of ``flags`` whose name it does
    not already set: the user's value of a flag always wins."""
    have = {_flag_name(f) for f in existing.split() if f.startswith("--")}
    added = [f for f in flags if _flag_name(f) not in have]
    return " ".join([*existing.split(), *added])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--compile-cache DIR``, ``--no-compile-cache`` and ``--no-xla-flags``."""
    parser.add_argument(
        "--compile-cache",
        metavar="DIR",
        default=None,
        help="persistent compilation cache folder (default: $JAXDQN_COMPILE_CACHE, else "
        "~/.cache/jaxdqn/xla)",
    )
    parser.add_argument(
        "--no-compile-cache",
        action="store_true",
        help="compile every program afresh (no persistent compilation cache)",
    )
    parser.add_argument(
        "--no-xla-flags",
        action="store_true",
        help="do not add jaxdqn's XLA flags (GPU command buffers, CPU kernels without YNNPACK "
        "fusions) to XLA_FLAGS",
    )


def arguments_of(args: argparse.Namespace) -> list[str]:
    """The options of :func:`add_arguments` that ``args`` set, as a command line (what a child
    process of the same program is started with)."""
    out = ["--compile-cache", str(args.compile_cache)] if args.compile_cache else []
    out += ["--no-compile-cache"] if args.no_compile_cache else []
    return out + (["--no-xla-flags"] if args.no_xla_flags else [])


def configure(
    cache_dir: str | Path | None,
    *,
    cache: bool = True,
    xla_flags: bool = True,
    environ: MutableMapping[str, str] | None = None,
) -> Path | None:
    """Set up the compilation cache, jaxdqn's XLA flags and the collector's thresholds
    (:data:`GC_THRESHOLDS`); returns the cache folder (None when off). Call before the first JAX
    computation of the process."""
    env = os.environ if environ is None else environ
    gc.set_threshold(*GC_THRESHOLDS)
    if xla_flags:
        env["XLA_FLAGS"] = merge_xla_flags(env.get("XLA_FLAGS", ""))
    if not cache:
        return None
    import jax

    folder = Path(cache_dir).expanduser() if cache_dir else default_cache_dir(env)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(
            f"compilation cache {folder}: cannot create it ({e.strerror}); choose another folder "
            "with --compile-cache DIR or turn it off with --no-compile-cache"
        ) from None
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
    return folder


def configure_from_args(args: argparse.Namespace) -> Path | None:
    """:func:`configure` from the arguments that :func:`add_arguments` added."""
    return configure(
        args.compile_cache, cache=not args.no_compile_cache, xla_flags=not args.no_xla_flags
    )
