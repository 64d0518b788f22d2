"""bench/command_buffers.py: graphs, host-driven loops and Pallas kernels of a thunk sequence."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.command_buffers import pallas_names, parse_thunks, summarize

# The shape XLA (jax 0.11.2, H100) dumped for the learner's scan with the GPU flags: a graph,
# a loop the host drives whose body is one graph (a Pallas kernel recorded in it), a graph
# after the loop. Added: a second Pallas launch run from the host inside the body
# ("gate_grad__1") and a dynamic-slice fusion with its own copy thunk, outside any graph.
LOOP_ON_HOST = """\
000: kCommandBuffer [source       | next=004 (1)]
    001: kCopy         [source | sink] kCopy
    002: kCustomKernel [source | sink] loop_broadcast_fusion_1 grid: [1, 1, 1] threads: [10, 1, 1]
004: kWhile         [prev=000 (1) | next=000 (1)]
condition:
    005: kCustomKernel [source | sink] loop_compare_fusion grid: [1, 1, 1] threads: [1, 1, 1]
  body:
    000: kCommandBuffer [source | sink]
        006: kCustomKernel   [source         | next=007 (1) ] loop_add_fusion_27 grid: [1, 1, 1]
        007: kCublasLtMatmul [prev=006 (1)   | next=008 (1) ] kCublasLtMatmul
        008: kCustomKernel   [prev=007 (1)   | sink ] gate_product_fwd grid: [128, 16, 1]
        025: kAsyncStart     [source         | sink ] stream=computation_stream[3], async_id=25
            027: kDynamicSliceFusion [source | sink] params=1, results=1
                026: kCopy [source | sink] kCopy
    009: kCustomKernel [source | sink] gate_grad__1 grid: [64, 1, 1] threads: [128, 1, 1]
    010: kDynamicSliceFusion [source | sink] params=1, results=1
        011: kCopy [source | sink] kCopy
000: kCommandBuffer [prev=004 (1) | sink        ]
    012: kCustomKernel [source | sink] loop_add_fusion_29 grid: [1, 1, 1] threads: [1, 1, 1]
"""

# The same scan with xla_gpu_command_buffer_unroll_loops: the loop recorded inside one graph.
LOOP_IN_GRAPH = """\
000: kCommandBuffer [source | sink]
    001: kCopy         [source       | next=004 (3)] kCopy
    004: kWhile        [prev=003 (1) | next=211 (1)]
condition:
        005: kCustomKernel [source | sink] loop_compare_fusion grid: [1, 1, 1]
      body:
        006: kCustomKernel   [source         | next=007 (1) ] gate_product_fwd grid: [128, 16, 1]
        007: kCustomKernel   [prev=006 (1)   | sink ] c51_project grid: [8192, 1, 1]
"""

HLO = (
    '%triton = f32[8]{0} custom-call(%call.1), custom_call_target="__gpu$xla.gpu.triton", '
    'backend_config="{debug = false, ir = \\"...\\", name = \\"gate_grad\\", num_warps = 4}"\n'
    '%t2 = f32[8]{0} custom-call(%x), custom_call_target="__gpu$xla.gpu.triton", '
    'backend_config="{ir = \\"...\\", name = \\"gate_product_fwd\\"}"\n'
    '%t3 = f32[8]{0} custom-call(%x), custom_call_target="__cublas$lt$matmul", '
    'backend_config="{name = \\"not_pallas\\"}"\n'
)


def test_command_buffers_names_the_pallas_calls_of_a_module():
    assert pallas_names(HLO) == {"gate_grad", "gate_product_fwd"}


def test_command_buffers_reads_graphs_host_loops_and_pallas_kernels():
    rep = summarize(parse_thunks(LOOP_ON_HOST), pallas_names(HLO))
    assert rep.graphs == 2 and rep.graph_loops == 0
    assert len(rep.loops) == 1 and rep.loops[0]["graphs"] == 1
    # the body's condition kernel, the Pallas launch, the dynamic-slice fusion and its copy
    assert dict(rep.loops[0]["host"]) == {"kCustomKernel": 2, "kDynamicSliceFusion": 1, "kCopy": 1}
    assert dict(rep.host) == dict(rep.loops[0]["host"])
    assert dict(rep.pallas_in) == {"gate_product_fwd": 1}
    assert dict(rep.pallas_out) == {"gate_grad": 1}
    assert rep.in_graphs["kCustomKernel"] == 4 and rep.in_graphs["kCublasLtMatmul"] == 1
    assert rep.in_graphs["kDynamicSliceFusion"] == 1  # nested under the graph's async start


def test_command_buffers_sees_a_loop_recorded_inside_a_graph():
    rep = summarize(parse_thunks(LOOP_IN_GRAPH), {"gate_product_fwd", "c51_project"})
    assert (rep.graphs, rep.graph_loops, rep.loops, sum(rep.host.values())) == (1, 1, [], 0)
    assert dict(rep.pallas_in) == {"gate_product_fwd": 1, "c51_project": 1}
    assert not rep.pallas_out


def test_command_buffers_counts_the_graphs_of_a_conditional_the_host_runs():
    text = """\
000: kConditional [source | sink]
    001: kCommandBuffer [source | sink]
        002: kCustomKernel [source | sink] c51_project grid: [8192, 1, 1]
"""
    rep = summarize(parse_thunks(text), {"c51_project"})
    assert (rep.graphs, dict(rep.host), dict(rep.pallas_in)) == (
        1,
        {"kConditional": 1},
        {"c51_project": 1},
    )


def test_command_buffers_refuses_text_that_is_not_a_thunk_sequence():
    with pytest.raises(ValueError, match="no thunk"):
        parse_thunks("HloModule jit_run\nENTRY %main {}\n")
