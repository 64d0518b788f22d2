"""bench/iteration.py's table: the "% of matmul" column divides by the rate of the products the
jaxdqn rows run (bfloat16 under ``--set kernels.learner_activations=bf16``), the peer's by the
float32 rate."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import iteration as bench_iteration


def _columns(activations: str) -> dict:
    row = {"components": "off", "kind": "learner", "size": 64, "us": 100.0, "compile_s": 1.0,
           "model_flops": 1e9, "executed_flops": 2e9,
           "learner_activations": activations}  # fmt: skip
    column = {"jax": "x", "device": "d", "backend": "gpu", "xla_flags": "",
              "matmul_flops_s": 1e13, "matmul_flops_s_bf16": 2e13, "rows": [row]}  # fmt: skip
    return {"on": column}


def _learner_line(argv: list[str], activations: str) -> tuple[str, str]:
    sizes = ["--tiny", "--batches", "64", "--envs", "", "--components", "off"]
    args = bench_iteration.parse_args([*sizes, "--xla-flags", "on", *argv])
    peer = ([("cuda graph", 64, 50.0, "")], [], "ran")
    text = bench_iteration.table(args, _columns(activations), peer)
    return text, next(line for line in text.splitlines() if line.startswith("| jaxdqn"))


def test_bench_iteration_percent_of_matmul_uses_the_rate_of_the_rows_products():
    # 1e9 FLOP in 100 µs = 1e13 FLOP/s: 100 % of the float32 rate, 50 % of the bfloat16 one
    # (the rows say which products they ran: what the run's config resolved, not the flags)
    text, line = _learner_line([], "f32")
    assert "| 100.0% (200.0%) |" in line and "uses the f32 rate" in text
    text, line = _learner_line(["--set", "kernels.learner_activations=bf16"], "bf16")
    assert "| 50.0% (100.0%) |" in line and "uses the bf16 rate" in text
    assert "jaxdqn rows with kernels.learner_activations=bf16" in text
    peer = next(line for line in text.splitlines() if line.startswith("| PyTorch"))
    assert "| 200.0% |" in peer  # 1e9 FLOP in 50 µs against the float32 rate
