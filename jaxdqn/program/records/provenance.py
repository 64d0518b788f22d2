"""What a rerun needs, recorded in ``summary.json`` (``provenance``) and the report's header.

The code (git commit of the package's checkout, ``+dirty`` with uncommitted changes; None
outside a git checkout), the software (Python, jax, jaxlib), the hardware (platform, device
kind and count, processes), the ``XLA_FLAGS`` the process ran with, the compilation cache
folder (None when off), what the kernel settings resolved to on this machine
(:func:`jaxdqn.agent.resolve.resolve_kernels`: the fused branches, heads, statistics, gated
path, acting, acting's product and activations, P1's projection with its kernel, e.g.
``pallas:hat``; ``auto`` picks other kernels
on a GPU than on the CPU), the seed, ``train.deterministic`` and the SHA-256 of the run's
``config.yaml``. With the same code, software, hardware, flags and config, a run with
``train.deterministic`` repeats bit for bit on the CPU; on a GPU also with the same
compilation cache folder, which holds XLA's autotuning choices (JAX keeps its per-fusion
autotuning results there, so even a fresh compilation picks the same kernels; H200
measurements in bench/RESULTS.md, issue 16).
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import jax

from jaxdqn.agent.resolve import resolve_kernels
from jaxdqn.config import Config
from pallas_kernels.projection import default_method

__all__ = ["git_commit", "provenance"]

_PACKAGE_DIR = Path(__file__).resolve().parent.parent


def git_commit(where: Path = _PACKAGE_DIR) -> str | None:
    """``<commit>`` or ``<commit>+dirty`` of the checkout holding ``where``; None if there is
    none (an installed wheel) or git is missing."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(where), *args], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+dirty" if dirty else "") if commit else None


def _kernels(cfg: Config) -> dict[str, str]:
    """:func:`resolve_kernels`, with P1's Pallas backends naming the kernel they run at the
    model's atoms (``pallas:hat``: the hat kernel up to 64 padded atoms, ``pallas:window``
    above), so that the two P1 kernels are told apart."""
    kernels = resolve_kernels(cfg)
    if kernels["projection"] in ("pallas", "interpret"):
        kernels["projection"] += ":" + default_method(cfg.model.num_atoms)
    return kernels


def provenance(
    cfg: Config, run_dir: Path, iteration_xla_options: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The ``provenance`` entry of ``summary.json`` (every value a string, number, bool or
    None); ``iteration_xla_options`` the XLA options the training iteration's program alone was
    compiled with (``program.launch.runtime.iteration_compiler_options``), as ``name=value``."""
    import jaxlib

    config_file = Path(run_dir) / "config.yaml"
    digest = hashlib.sha256(config_file.read_bytes()).hexdigest() if config_file.exists() else None
    dev = jax.devices()[0]
    return {
        "git_commit": git_commit(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "platform": dev.platform,
        "device_kind": dev.device_kind,
        "devices": jax.device_count(),
        "processes": jax.process_count(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "iteration_xla_options": " ".join(
            f"{k}={v}" for k, v in sorted((iteration_xla_options or {}).items())
        ),
        "compile_cache": jax.config.jax_compilation_cache_dir,
        "kernels": " ".join(f"{k}={v}" for k, v in _kernels(cfg).items()),
        "seed": cfg.seed,
        "deterministic": cfg.train.deterministic,
        "config_sha256": digest,
    }
