"""bench/hlo_source.py: kernels of a compiled module named by the Python lines that made them."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.hlo_source import instruction_sources, kernel_instruction


def _reduce_twice(x):
    y = jnp.sin(x) * 3.0  # an elementwise op ...
    return jnp.sum(y, axis=0), jnp.max(jnp.cos(x), axis=1)  # ... and two reductions


def test_instruction_sources_point_at_this_file():
    x = jnp.ones((64, 32))
    hlo = jax.jit(_reduce_twice).lower(x).compile().as_text()
    sources = instruction_sources(hlo)
    assert sources
    mine = {k: v for k, v in sources.items() if "test_hlo_source.py" in v}
    assert mine, sources  # some instruction resolves to this file
    lines = {int(v.split("test_hlo_source.py:")[1].split()[0]) for v in mine.values()}
    first = _reduce_twice.__code__.co_firstlineno
    assert lines <= {first + 1, first + 2}  # the two lines of the body, nothing else
    ops = " ".join(mine.values())
    assert "reduce_sum" in ops or "reduce_max" in ops


def test_kernel_instruction_maps_trace_names_to_hlo_names():
    sources = {"input_reduce_fusion.140": "reduce_sum | a.py:1 f", "loop_add_fusion": "add"}
    assert kernel_instruction("input_reduce_fusion_140", sources) == "input_reduce_fusion.140"
    assert kernel_instruction("loop_add_fusion", sources) == "loop_add_fusion"
    assert kernel_instruction("sm90_xmma_gemm_f32f32", sources) is None
