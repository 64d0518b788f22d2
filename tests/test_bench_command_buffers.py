"""bench/command_buffers.py: graph launches and host launches of a compiled module's text."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.command_buffers import report

# The shape of a GPU module after XLA's command-buffer scheduling: the entry launches one graph
# and a while loop from the host; the loop's body launches two graphs split by a Pallas
# (Triton) custom call, and a fusion outside any graph.
MODULE = """HloModule jit_run, entry_computation_layout={(f32[8]{0})->f32[8]{0}}

%fused_computation (param_0: f32[8]) -> f32[8] {
  %param_0 = f32[8]{0} parameter(0)
  ROOT %negate.1 = f32[8]{0} negate(%param_0)
}

%command_buffer (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  %loop_negate_fusion = f32[8]{0} fusion(%p), kind=kLoop, calls=%fused_computation
  ROOT %fusion.2 = f32[8]{0} fusion(%loop_negate_fusion), kind=kLoop, calls=%fused_computation
}

%command_buffer.1 (p.1: f32[8]) -> f32[8] {
  %p.1 = f32[8]{0} parameter(0)
  ROOT %gemm = f32[8]{0} custom-call(%p.1), custom_call_target="__cublas$gemm"
}

%command_buffer.2 (p.2: f32[8]) -> f32[8] {
  %p.2 = f32[8]{0} parameter(0)
  ROOT %fusion.9 = f32[8]{0} fusion(%p.2), kind=kInput, calls=%fused_computation
}

%body (arg_tuple: (s32[], f32[8], /*index=2*/f32[8])) -> (s32[], f32[8], /*index=2*/f32[8]) {
  %arg_tuple = (s32[], f32[8]{0}, /*index=2*/f32[8]{0}) parameter(0)
  %gte.0 = s32[] get-tuple-element(%arg_tuple), index=0
  %gte.1 = f32[8]{0} get-tuple-element(%arg_tuple), index=1
  %call.1 = f32[8]{0} call(%gte.1), to_apply=%command_buffer.1
  TRITON_CALL
  %call.2 = f32[8]{0} call(%triton), to_apply=%command_buffer.2
  %loop_add_fusion = f32[8]{0} fusion(%call.2), kind=kLoop, calls=%fused_computation
  ROOT %tuple = (s32[], f32[8]{0}, /*index=2*/f32[8]{0}) tuple(%gte.0, %loop_add_fusion, %call.2)
}

%cond (arg_tuple.1: (s32[], f32[8], /*index=2*/f32[8])) -> pred[] {
  %arg_tuple.1 = (s32[], f32[8]{0}, /*index=2*/f32[8]{0}) parameter(0)
  ROOT %constant.1 = pred[] constant(true)
}

ENTRY %main (Arg_0.1: f32[8]) -> f32[8] {
  %Arg_0.1 = f32[8]{0} parameter(0)
  %call = f32[8]{0} call(%Arg_0.1), to_apply=%command_buffer
  %constant = s32[] constant(0)
  %tuple.1 = (s32[], f32[8]{0}, /*index=2*/f32[8]{0}) tuple(%constant, %call, %call)
  %while = (s32[], f32[8]{0}, /*index=2*/f32[8]{0}) while(%tuple.1), condition=%cond, body=%body
  ROOT %gte.2 = f32[8]{0} get-tuple-element(%while), index=1
}
""".replace(
    "TRITON_CALL",
    '%triton = f32[8]{0} custom-call(%call.1), custom_call_target="__gpu$xla.gpu.triton", '
    'backend_config="{debug = false, ir = \\"...\\", name = \\"gate_grad\\", num_warps = 4 : i32}"',
)


def test_command_buffers_counts_graphs_and_host_launches_per_computation():
    rep = report(MODULE)
    assert list(rep) == ["entry", "body"]
    entry, body = rep["entry"], rep["body"]
    assert (entry.graphs, entry.captured, dict(entry.host)) == (1, 2, {"while": 1})
    assert (body.graphs, body.captured) == (2, 2)
    assert dict(body.captured_calls) == {"custom-call __cublas$gemm": 1}
    assert dict(body.host) == {"custom-call __gpu$xla.gpu.triton gate_grad": 1, "fusion kLoop": 1}


def test_command_buffers_refuses_text_without_an_entry():
    with pytest.raises(ValueError, match="ENTRY"):
        report("HloModule m\n")
