"""The programs' JAX setup (issues 11, 12): XLA flags and the persistent compilation cache."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxdqn.config import ALL_OFF
from jaxdqn.program.launch import runtime

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "configs" / "smoke.yaml"


def _env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["JAX_PLATFORMS"] = "cpu"
    env.update(extra)
    return env


@pytest.mark.slow
def test_xla_flags_are_accepted_by_the_installed_jaxlib():
    """XLA aborts the process on an unknown flag and every backend parses every flag, so this
    checks the GPU and CPU flags' names against the jaxlib that is installed (a renamed flag
    fails here)."""
    code = "import jax, jax.numpy as jnp; print(int(jax.jit(lambda x: x + 1)(jnp.int32(1))))"
    flags = " ".join(runtime.XLA_FLAGS)
    res = subprocess.run(
        [sys.executable, "-c", code], env=_env(XLA_FLAGS=flags), capture_output=True, text=True
    )
    assert res.returncode == 0 and res.stdout.strip() == "2", res.stderr[-2000:]
    bogus = subprocess.run(
        [sys.executable, "-c", code],
        env=_env(XLA_FLAGS="--xla_gpu_no_such_flag=1"),
        capture_output=True,
        text=True,
    )
    assert bogus.returncode != 0 and "Unknown flag" in bogus.stderr  # the check can fail


@pytest.mark.slow
def test_cpu_xla_flags_replace_the_ynnpack_fusions_with_xlas_own_kernels():
    """A branch-head-sized product with its elementwise tail compiles to a YNNPACK fusion by
    default and to none under CPU_XLA_FLAGS, with the same value to float rounding."""
    code = (
        "import jax, jax.numpy as jnp\n"
        "f = jax.jit(lambda h, w: jnp.tanh(h @ w).sum(-1))\n"
        "h = jnp.linspace(-1, 1, 3 * 256 * 64).reshape(3, 256, 64)\n"
        "w = jnp.linspace(-1, 1, 64 * 153).reshape(64, 153)\n"
        "print('ynn_fusion' in f.lower(h, w).compile().as_text(), float(f(h, w).sum()))"
    )

    def run(flags):
        res = subprocess.run(
            [sys.executable, "-c", code], env=_env(XLA_FLAGS=flags), capture_output=True, text=True
        )
        assert res.returncode == 0, res.stderr[-2000:]
        ynn, value = res.stdout.split()
        return ynn == "True", float(value)

    ynn_default, v_default = run("")
    ynn_flagged, v_flagged = run(" ".join(runtime.CPU_XLA_FLAGS))
    assert ynn_default and not ynn_flagged
    assert abs(v_default - v_flagged) <= 1e-4 * abs(v_default)


def test_xla_flags_merge_keeps_the_users_value():
    user = "--xla_gpu_graph_min_graph_size=5 --xla_dump_to=/tmp/x"
    merged = runtime.merge_xla_flags(user).split()
    assert merged[:2] == user.split()  # the user's flags first, unchanged
    assert "--xla_gpu_graph_min_graph_size=1" not in merged  # the user's value wins
    names = [f.split("=")[0] for f in merged]
    assert len(names) == len(set(names))
    for flag in runtime.XLA_FLAGS:
        assert flag.split("=")[0] in names
    assert runtime.merge_xla_flags(runtime.merge_xla_flags("")) == runtime.merge_xla_flags("")


def test_the_iterations_own_options_follow_the_command_buffer_flags():
    """The iteration's program unrolls its loops into command buffers where the process records
    ``while`` loops into them (jaxdqn's GPU flags), not with ``--no-xla-flags``, not where the
    command buffers leave loops out, and never over the user's own value of the option."""
    on = {"XLA_FLAGS": runtime.merge_xla_flags("")}
    assert runtime.iteration_compiler_options(on) == runtime.ITERATION_XLA_OPTIONS
    assert runtime.iteration_compiler_options({}) == {}
    assert runtime.iteration_compiler_options({"XLA_FLAGS": "--xla_dump_to=/tmp/x"}) == {}
    mine = {"XLA_FLAGS": runtime.merge_xla_flags("--xla_gpu_command_buffer_unroll_loops=false")}
    assert runtime.iteration_compiler_options(mine) == {}
    no_loops = {"XLA_FLAGS": "--xla_gpu_enable_command_buffer=FUSION,CUBLAS"}
    assert runtime.iteration_compiler_options(no_loops) == {}
    lower_case = {"XLA_FLAGS": "--xla_gpu_enable_command_buffer=fusion,while"}
    assert runtime.iteration_compiler_options(lower_case) == runtime.ITERATION_XLA_OPTIONS
    # a copy: a caller's change never reaches the module's constant
    runtime.iteration_compiler_options(on)["xla_gpu_command_buffer_unroll_loops"] = False
    assert runtime.ITERATION_XLA_OPTIONS == {"xla_gpu_command_buffer_unroll_loops": True}


def test_the_iterations_own_options_are_accepted_by_the_installed_jaxlib():
    """A compile option XLA does not know is an error at compile time (checked below), so this
    checks the options' names against the installed jaxlib, for any backend."""
    import jax
    import jax.numpy as jnp

    loop = lambda x: jax.lax.fori_loop(0, 4, lambda i, c: c * 2, x)
    f = jax.jit(loop, compiler_options=runtime.ITERATION_XLA_OPTIONS)
    assert float(f(jnp.float32(1.5))) == 24.0
    bogus = jax.jit(loop, compiler_options={"xla_gpu_no_such_option": True})
    with pytest.raises(Exception, match="No such compile option"):
        bogus(jnp.float32(1.5))


def test_the_test_sessions_fast_compile_flags_apply_to_cpu_programs_only():
    """The suite's compile-time flags (tests/conftest.py) are set before JAX starts, only where
    the programs compile for the CPU; GPU kernel tests compile as production runs do."""
    import jax
    from conftest import TEST_XLA_FLAGS, compiles_for_cpu

    assert compiles_for_cpu("cpu") and compiles_for_cpu(" cpu ,cuda")
    assert not compiles_for_cpu("cuda") and not compiles_for_cpu("cuda,cpu")
    assert compiles_for_cpu(None, plugins=("jaxdqn_no_such_plugin",))
    assert not compiles_for_cpu("", plugins=("json",))  # an installed module: a GPU plugin
    on_cpu = jax.default_backend() == "cpu"
    assert all((f in os.environ.get("XLA_FLAGS", "").split()) == on_cpu for f in TEST_XLA_FLAGS)


def test_configure_sets_flags_and_cache_folder_in_the_given_environment(tmp_path):
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    assert runtime.default_cache_dir(env) == tmp_path / "xdg" / "jaxdqn" / "xla"
    env["JAXDQN_COMPILE_CACHE"] = str(tmp_path / "mine")
    assert runtime.default_cache_dir(env) == tmp_path / "mine"
    off = runtime.configure(None, cache=False, xla_flags=False, environ=env)
    assert off is None and "XLA_FLAGS" not in env
    runtime.configure(None, cache=False, xla_flags=True, environ=env)
    assert env["XLA_FLAGS"] == " ".join(runtime.XLA_FLAGS)
    assert "--xla_cpu_experimental_ynn_fusion_type=" in env["XLA_FLAGS"].split()


def test_configure_raises_the_collectors_thresholds():
    """Tracing's millions of short-lived objects would run CPython's collector every 700
    allocations (runtime's docstring: a quarter of the tracing time); configure sets
    GC_THRESHOLDS, also when the cache and the flags are off."""
    import gc

    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        runtime.configure(None, cache=False, xla_flags=False, environ={})
        assert gc.get_threshold() == runtime.GC_THRESHOLDS
        assert runtime.GC_THRESHOLDS[0] >= 10 * 700
    finally:
        gc.set_threshold(*before)


def test_the_training_program_starts_without_matplotlib_or_scipy_stats():
    """What ``python -m jaxdqn.train`` imports before its first trace leaves out matplotlib
    (a report's figures import it when they are drawn) and scipy.stats (the statistics take the
    normal's cdf and ppf from scipy.special): the two cost ~0.8 s of every start of the program
    (2-core EPYC), and of each of the test suite's ~40 programs."""
    code = (
        "import sys\n"
        "from jaxdqn import train\n"
        "from jaxdqn.program.checkpoints import checkpoint\n"
        "from jaxdqn.program.run import loop\n"
        "print(sorted(m for m in ('matplotlib', 'scipy.stats') if m in sys.modules))"
    )
    res = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "[]"


def _smoke_cmd(*args):
    """One short smoke training with every component off: these tests are about the cache
    folder, and the small program compiles in a fraction of the full one's time."""
    cmd = [sys.executable, "-m", "jaxdqn.train", "--no-progress", "--config", str(SMOKE)]
    return [*cmd, *ALL_OFF, "train.epochs=1", "train.iterations_per_epoch=2", *args]


def _smoke_train(tmp_path, *args):
    return subprocess.run(
        _smoke_cmd(*args), cwd=tmp_path, env=_env(), capture_output=True, text=True
    )


@pytest.mark.slow
def test_training_fills_the_compile_cache_and_no_compile_cache_leaves_none(tmp_path):
    cache, off = tmp_path / "cache", tmp_path / "off"
    # both cold, side by side (neither can load the other's programs: one writes none)
    procs = [
        subprocess.Popen(
            _smoke_cmd(*args),
            cwd=tmp_path,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for args in (
            ["--run-dir", "a", "--compile-cache", str(cache)],
            ["--run-dir", "b", "--compile-cache", str(off), "--no-compile-cache"],
        )
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-3000:]
    entries = [p for p in cache.rglob("*") if p.is_file()]
    assert entries, "no compiled program was written to the cache"
    assert not off.exists()


@pytest.mark.slow
def test_an_uncreatable_cache_folder_is_one_line_and_exit_code_2(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    res = _smoke_train(tmp_path, "--run-dir", "c", "--compile-cache", str(blocker / "cache"))
    assert res.returncode == 2
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and "--no-compile-cache" in err[0] and "Traceback" not in res.stderr
    assert not (tmp_path / "c").exists()  # nothing started
