"""Which kernels of the learner's compiled update run inside XLA's command buffers (CUDA
graphs), which loops the host drives, and what the host launches one by one (issue 33).

XLA (jax 0.11.2) forms command buffers on the compiled program's *thunks*, after the HLO: the
module text never shows them (``compiled.as_text()`` holds no ``command_buffer`` computation even
where every kernel is captured). With ``--xla_dump_to`` XLA writes the final thunk sequence,
``<module>.thunk_sequence_after_thunk_passes.txt``, one thunk a line, children indented:

    000: kCommandBuffer [source | next=004 (1)]        one graph launched by the host
        001: kCopy ...                                  recorded into it
    004: kWhile [prev=000 (1) | next=000 (1)]           a loop the host drives
    condition:
        005: kCustomKernel ... loop_compare_fusion ...
      body:
        000: kCommandBuffer [source | sink]             one graph launch per iteration
            006: kCustomKernel ... gate_product_fwd ...  a Pallas kernel inside it

This tool compiles the learner's ``--updates`` updates in one ``lax.scan`` (configs/gpu.yaml
sizes, B = 4,096, the GPU XLA flags and the training iteration's own XLA options, as
``bench/trace_update.py``) with the dump on, and reads that file: the graphs the host launches,
the loops it drives (and the graphs in their bodies, launched once per iteration), the thunks
it runs outside any graph, and each Pallas kernel (named from the module's
``__gpu$xla.gpu.triton`` calls) inside or outside a graph. The profiler turns command buffers
off while it traces, so ``bench/trace_update.py`` cannot show any of this.

    python bench/command_buffers.py --components on "" "kernels.gated=gate_grad"   # GPU
    python bench/command_buffers.py --thunks a.thunk_sequence_after_thunk_passes.txt ...
    python bench/command_buffers.py --tiny ""        # smoke sizes, any machine (a CPU backend
                                                     # has no command buffers: nothing to read)

Each positional argument is one variant's config overrides (space-separated, "" = the
defaults). ``XLA_FLAGS=--xla_gpu_command_buffer_unroll_loops=false`` (any value the user names)
replaces the iteration's own option. ``--save DIR`` keeps each variant's thunk sequence.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jaxdqn.program.launch.runtime import GPU_XLA_FLAGS, merge_xla_flags  # noqa: E402

#: ``<indent><id>: <kind> [<dependencies>] <rest>``
_THUNK = re.compile(r"^( *)\d+: (k\w+)\s*\[[^\]]*\]\s*(.*)$")
_PALLAS_NAME = re.compile(
    r'custom_call_target="__gpu\$xla\.gpu\.triton"[^\n]*?\bname = \\?"([\w.\-]+)\\?"'
)
#: the module name of the compiled program (``jax.jit`` of a function named so)
MODULE = "jit_learner_updates"
DUMP = "thunk_sequence_after_thunk_passes.txt"


class Thunk(NamedTuple):
    kind: str
    name: str  # a kernel's name; else the kind
    children: list


class Report(NamedTuple):
    """A thunk sequence summed up: ``graphs`` command buffers the host launches once a run,
    ``loops`` one entry per loop the host drives (the command buffers in its body, launched once
    an iteration, and the thunks of its body outside them, by kind), ``graph_loops`` loops
    recorded inside a graph, ``host`` the thunks run outside any graph by kind (loops excluded),
    ``in_graphs`` the thunks inside graphs by kind, and ``pallas_in`` / ``pallas_out`` the
    Pallas kernels inside / outside graphs, by name."""

    graphs: int
    loops: list
    graph_loops: int
    host: collections.Counter
    in_graphs: collections.Counter
    pallas_in: collections.Counter
    pallas_out: collections.Counter


def parse_thunks(text: str) -> list[Thunk]:
    """The top-level thunks of a thunk-sequence dump, each with its children (the lines indented
    deeper under it; ``condition:`` / ``body:`` labels skipped)."""
    root: list[Thunk] = []
    stack: list[tuple[int, Thunk]] = []
    for line in text.splitlines():
        m = _THUNK.match(line)
        if not m:
            continue
        indent, kind, rest = len(m[1]), m[2], m[3]
        name = rest.split()[0] if kind in ("kCustomKernel", "kKernel") and rest else kind
        node = Thunk(kind, name, [])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        (stack[-1][1].children if stack else root).append(node)
        stack.append((indent, node))
    if not root:
        raise ValueError("command_buffers: no thunk in the text (not a thunk-sequence dump?)")
    return root


def pallas_names(hlo: str) -> set[str]:
    """The kernel names of the module's Pallas (Triton) calls."""
    return set(_PALLAS_NAME.findall(hlo))


def _kernel(name: str) -> str:
    return re.sub(r"__\d+$", "", name)  # XLA numbers a second launch of one kernel "name__1"


def summarize(thunks: list[Thunk], pallas: set[str]) -> Report:
    """See :class:`Report`."""
    host, in_graphs, p_in, p_out = (collections.Counter() for _ in range(4))
    loops: list[dict] = []
    graph_loops = 0

    def in_graph(node: Thunk) -> None:
        nonlocal graph_loops
        in_graphs[node.kind] += 1
        graph_loops += node.kind == "kWhile"
        if _kernel(node.name) in pallas:
            p_in[_kernel(node.name)] += 1
        for child in node.children:
            in_graph(child)

    def on_host(nodes: list[Thunk], loop: collections.Counter | None) -> int:
        graphs = 0  # the command buffers launched at this level
        for node in nodes:
            if node.kind == "kCommandBuffer":
                graphs += 1
                for child in node.children:
                    in_graph(child)
            elif node.kind == "kWhile":
                body: collections.Counter = collections.Counter()
                loops.append({"graphs": on_host(node.children, body), "host": body})
            else:
                host[node.kind] += 1
                if loop is not None:
                    loop[node.kind] += 1
                if _kernel(node.name) in pallas:
                    p_out[_kernel(node.name)] += 1
                # e.g. a dynamic-slice fusion's own thunks, a conditional's branch graphs
                graphs += on_host(node.children, loop)
        return graphs

    graphs = on_host(thunks, None)
    return Report(graphs, loops, graph_loops, host, in_graphs, p_in, p_out)


def _read(path: str) -> str:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return f.read()


def _compile(base: str, overrides: list[str], updates: int, batch: int) -> str:
    """Compile one variant; returns the module text (its thunks are dumped by XLA)."""
    import jax

    from bench.iteration import build, jit_program
    from jaxdqn.agent import iteration
    from jaxdqn.agent.build import make_init

    sizes = [f"replay.batch_size={batch}", f"replay.learning_starts={batch}"]
    sizes += ["replay.capacity=1048576", f"acting.num_envs={batch}"]
    p, _, agent = build(base, [*sizes, *overrides])
    shapes = jax.eval_shape(make_init(agent), p.market, jax.random.PRNGKey(0))

    def learner_updates(s):
        return iteration.scan_updates(agent, s, updates)

    return jit_program(learner_updates, donate_argnums=0).lower(shapes).compile().as_text()


def _print(label: str, rep: Report) -> None:
    fmt = lambda c: ", ".join(f"{n}× {k}" for k, n in c.most_common()) or "none"
    print(f"\n{label}")
    print(f"  graphs launched once a run: {rep.graphs}; loops recorded inside graphs: "
          f"{rep.graph_loops}; loops the host drives: {len(rep.loops)}")  # fmt: skip
    for i, loop in enumerate(rep.loops):
        print(f"  host-driven loop {i}: {loop['graphs']} graph launches an iteration, "
              f"outside them: {fmt(loop['host'])}")  # fmt: skip
    print(f"  thunks outside any graph: {fmt(rep.host)}")
    print(f"  inside graphs: {fmt(rep.in_graphs)}")
    print(f"  Pallas kernels inside graphs: {fmt(rep.pallas_in)}; outside: {fmt(rep.pallas_out)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variants", nargs="*", help='config overrides per variant ("" = defaults)')
    ap.add_argument("--components", choices=("on", "off"), default="on")
    ap.add_argument("--updates", type=int, default=10)
    ap.add_argument("--tiny", action="store_true", help="configs/smoke.yaml, B = 64")
    ap.add_argument("--thunks", nargs="*", default=[], help="thunk-sequence dumps (.gz ok)")
    ap.add_argument("--hlo", nargs="*", default=[], help="module texts naming their Pallas calls")
    ap.add_argument("--save", default=None, help="copy each variant's thunk sequence here")
    args = ap.parse_args()
    pallas = set().union(*(pallas_names(_read(p)) for p in args.hlo))
    rows = [(path, summarize(parse_thunks(_read(path)), pallas)) for path in args.thunks]
    if args.variants:
        dump = tempfile.mkdtemp(prefix="jaxdqn_thunks_")
        flags = merge_xla_flags(os.environ.get("XLA_FLAGS", ""), GPU_XLA_FLAGS)
        os.environ["XLA_FLAGS"] = f"{flags} --xla_dump_to={dump} --xla_dump_hlo_module_re={MODULE}"
        import jax

        from jaxdqn import config
        from jaxdqn.program.launch.runtime import iteration_compiler_options

        switches = list(config.ALL_ON if args.components == "on" else config.ALL_OFF)
        base = str(ROOT / ("configs/smoke.yaml" if args.tiny else "configs/gpu.yaml"))
        batch = 64 if args.tiny else 4096
        print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; XLA_FLAGS="
              f"{flags!r}; the iteration's options {iteration_compiler_options()}; "
              f"B = {batch}, all {args.components}, {args.updates} updates a scan")  # fmt: skip
        for i, v in enumerate(args.variants):
            seen = set(Path(dump).glob(f"*{DUMP}"))
            hlo = _compile(base, [*switches, *v.split()], args.updates, batch)
            new = sorted(set(Path(dump).glob(f"*{MODULE}*{DUMP}")) - seen)
            if not new:
                print(f"\n{v or 'defaults'}: no thunk sequence dumped (a {jax.default_backend()} "
                      "backend; command buffers are XLA's GPU runtime)")  # fmt: skip
                continue
            if args.save:
                Path(args.save).mkdir(parents=True, exist_ok=True)
                shutil.copy(new[-1], Path(args.save) / f"variant{i}.{DUMP}")
            rows.append((v or "defaults", summarize(parse_thunks(new[-1].read_text()),
                                                    pallas_names(hlo))))  # fmt: skip
        shutil.rmtree(dump, ignore_errors=True)
    for label, rep in rows:
        _print(label, rep)
    if rows:
        print("\n| variant | graphs a run | host-driven loops (graphs an iteration) | loops in "
              "graphs | thunks outside graphs | Pallas kernels outside graphs |")  # fmt: skip
        print("|---|---:|---|---:|---:|---:|")
        for label, rep in rows:
            loops = ", ".join(str(lp["graphs"]) for lp in rep.loops) or "none"
            print(f"| {label} | {rep.graphs} | {len(rep.loops)} ({loops}) | {rep.graph_loops} | "
                  f"{sum(rep.host.values())} | {sum(rep.pallas_out.values())} |")  # fmt: skip


if __name__ == "__main__":
    main()
