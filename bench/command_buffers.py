"""Which kernels of the learner's compiled update run inside XLA's command buffers (CUDA
graphs), and which the host launches one by one (issue 33: why a Pallas kernel can cost idle
GPU time that no per-kernel trace shows).

With the project's GPU XLA flags (:data:`jaxdqn.program.launch.runtime.GPU_XLA_FLAGS`) XLA's
command-buffer scheduling pass wraps each run of capturable instructions (fusions, cuBLAS GEMMs,
while loops whose whole body is capturable, custom calls XLA knows to be capturable) in a
``call`` to a computation named ``command_buffer…``: one graph launch for the run. An
instruction it cannot capture splits the run, and a ``while`` whose body holds one cannot be a
graph itself: its body then runs from the host each iteration, one launch per segment. The
profiler turns command buffers off while it traces (``xla_enable_command_buffers_during_profiling``
is false by default), so ``bench/trace_update.py``'s busy fraction cannot show this; the compiled
module can.

    python bench/command_buffers.py --components on "" "kernels.gated=gate_grad"   # GPU
    python bench/command_buffers.py --hlo module.txt.gz ...   # a module written by
                                                              # trace_update.py --hlo
    python bench/command_buffers.py --tiny ""                 # smoke sizes, any machine (a CPU
                                                              # has no command buffers)

Each positional argument is one variant's config overrides (space-separated, "" = the
defaults); every variant is the learner update of ``bench/trace_update.py`` (configs/gpu.yaml
sizes, B = 4,096, ``--updates`` updates in one ``lax.scan``), compiled in this process with the
GPU flags set before JAX starts. Prints, per variant and per computation that holds graphs or
host launches (the entry and the scan's while body): the graph launches, the instructions
inside them, the host launches and what they are, and last a table.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import os
import re
import sys
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jaxdqn.program.launch.runtime import GPU_XLA_FLAGS, merge_xla_flags  # noqa: E402

_COMPUTATION = re.compile(r"^(ENTRY )?%?([\w.\-]+) [^\n]*\{\s*$")
_INSTRUCTION = re.compile(r"^\s+(?:ROOT )?%?([\w.\-]+) = (.*)$")
_OPCODE = re.compile(r"^(?:\(.*?\)|[\w\[\]{},:\d\s]*?) ?([a-z][\w\-]*)\(")
_TARGET = re.compile(r'custom_call_target="([^"]+)"')
_PALLAS_NAME = re.compile(r'\bname = \\?"([\w.\-]+)\\?"')
_CALLEE = re.compile(r"(?:to_apply|body|calls)=%?([\w.\-]+)")
#: opcodes that launch nothing: no thunk, or a metadata-only one
_FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all"}


class Segments(NamedTuple):
    """One computation's launches: ``graphs`` command-buffer calls holding ``captured``
    instructions in all, of which ``captured_calls`` custom calls by kind; ``host`` the
    instructions launched outside them, by kind (a fusion's kind, a custom call's target and,
    for a Pallas Triton call, its kernel's name, else the opcode)."""

    graphs: int
    captured: int
    host: collections.Counter
    captured_calls: collections.Counter


def _opcode(rhs: str) -> str:
    """The opcode of an instruction's right-hand side ``shape opcode(operands), attrs``."""
    m = _OPCODE.match(rhs)
    if m:
        return m[1]
    head = rhs.split("(", 1)[0].split()
    return head[-1] if head else ""


def computations(hlo: str) -> dict[str, list[tuple[str, str]]]:
    """The module's computations as ``name -> [(instruction, right-hand side)]``; the entry
    computation under the key ``"ENTRY"`` too."""
    out: dict[str, list[tuple[str, str]]] = {}
    current = None
    for line in hlo.splitlines():
        if current is None:
            m = _COMPUTATION.match(line)
            if m and "=" not in line.split("{", 1)[0].split("(", 1)[0]:
                current = m[2]
                out[current] = []
                if m[1]:
                    out["ENTRY"] = out[current]
            continue
        if line.strip() == "}":
            current = None
            continue
        m = _INSTRUCTION.match(line)
        if m:
            out[current].append((m[1], m[2]))
    return out


def _kind(rhs: str) -> str:
    op = _opcode(rhs)
    if op == "custom-call":
        t = _TARGET.search(rhs)
        names = _PALLAS_NAME.findall(rhs)  # the backend config's last name: after its "ir"
        return f"custom-call {t[1] if t else '?'}" + (f" {names[-1]}" if names else "")
    if op == "fusion":
        k = re.search(r"kind=(\w+)", rhs)
        return f"fusion {k[1] if k else '?'}"
    return op


def segments(comps: dict[str, list[tuple[str, str]]], name: str) -> Segments:
    """Graph launches and host launches of computation ``name``."""
    graphs = captured = 0
    host: collections.Counter = collections.Counter()
    calls: collections.Counter = collections.Counter()
    for _, rhs in comps[name]:
        op = _opcode(rhs)
        if op in _FREE:
            continue
        callee = _CALLEE.search(rhs)
        if op == "call" and callee and callee[1].startswith("command_buffer"):
            graphs += 1
            body = [r for _, r in comps.get(callee[1], []) if _opcode(r) not in _FREE]
            captured += len(body)
            calls.update(_kind(r) for r in body if _opcode(r) == "custom-call")
            continue
        host[_kind(rhs)] += 1
    return Segments(graphs, captured, host, calls)


def while_bodies(comps: dict[str, list[tuple[str, str]]]) -> list[str]:
    """The bodies of the ``while`` instructions launched from the host (in the entry or in a
    host-run body), not those captured inside a graph."""
    bodies, todo, seen = [], ["ENTRY"], set()
    while todo:
        name = todo.pop()
        if name in seen or name not in comps:
            continue
        seen.add(name)
        for _, rhs in comps[name]:
            if _opcode(rhs) == "while" and (m := re.search(r"body=%?([\w.\-]+)", rhs)):
                bodies.append(m[1])
                todo.append(m[1])
    return bodies


def report(hlo: str) -> dict[str, Segments]:
    """``{"entry": …, "<body name>": …}`` for the entry and each host-run while body."""
    comps = computations(hlo)
    if "ENTRY" not in comps:
        raise ValueError("command_buffers: no ENTRY computation in the module text")
    out = {"entry": segments(comps, "ENTRY")}
    for body in while_bodies(comps):
        out[body] = segments(comps, body)
    return out


def _compile(base: str, overrides: list[str], updates: int, batch: int):
    import jax

    from bench.iteration import build
    from jaxdqn.agent import iteration
    from jaxdqn.agent.build import make_init

    sizes = [f"replay.batch_size={batch}", f"replay.learning_starts={batch}"]
    sizes += ["replay.capacity=1048576", f"acting.num_envs={batch}"]
    p, _, agent = build(base, [*sizes, *overrides])
    shapes = jax.eval_shape(make_init(agent), p.market, jax.random.PRNGKey(0))
    run = lambda s: iteration.scan_updates(agent, s, updates)
    return jax.jit(run, donate_argnums=0).lower(shapes).compile().as_text()


def _print(label: str, rep: dict[str, Segments]) -> None:
    print(f"\n{label}")
    for where, s in rep.items():
        host = ", ".join(f"{n}× {k}" for k, n in s.host.most_common())
        calls = ", ".join(f"{n}× {k}" for k, n in s.captured_calls.most_common())
        print(f"  {where}: {s.graphs} graph launches ({s.captured} instructions inside; custom "
              f"calls inside: {calls or 'none'}), {sum(s.host.values())} host launches: "
              f"{host or 'none'}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variants", nargs="*", help='config overrides per variant ("" = defaults)')
    ap.add_argument("--components", choices=("on", "off"), default="on")
    ap.add_argument("--updates", type=int, default=10)
    ap.add_argument("--tiny", action="store_true", help="configs/smoke.yaml, B = 64")
    ap.add_argument("--hlo", nargs="*", default=[], help="compiled module texts (.gz ok)")
    ap.add_argument("--save", default=None, help="write each variant's module text here")
    args = ap.parse_args()
    rows = []
    for path in args.hlo:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as f:
            rows.append((path, report(f.read())))
    if args.variants:
        os.environ["XLA_FLAGS"] = merge_xla_flags(os.environ.get("XLA_FLAGS", ""), GPU_XLA_FLAGS)
        import jax

        from jaxdqn import config

        switches = list(config.ALL_ON if args.components == "on" else config.ALL_OFF)
        base = str(ROOT / ("configs/smoke.yaml" if args.tiny else "configs/gpu.yaml"))
        batch = 64 if args.tiny else 4096
        print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; XLA_FLAGS="
              f"{os.environ['XLA_FLAGS']!r}; learner B = {batch}, all {args.components}, "
              f"{args.updates} updates in one scan")  # fmt: skip
        for i, v in enumerate(args.variants):
            text = _compile(base, [*switches, *v.split()], args.updates, batch)
            if args.save:
                Path(args.save).mkdir(parents=True, exist_ok=True)
                with gzip.open(Path(args.save) / f"variant{i}.txt.gz", "wt") as f:
                    f.write(text)
            rows.append((v or "defaults", report(text)))
    for label, rep in rows:
        _print(label, rep)
    print("\n| variant | where | graph launches | instructions in graphs | host launches |")
    print("|---|---|---:|---:|---:|")
    for label, rep in rows:
        for where, s in rep.items():
            print(f"| {label} | {where} | {s.graphs} | {s.captured} | {sum(s.host.values())} |")


if __name__ == "__main__":
    main()
