"""The longest chain of dependent kernels in a compiled XLA module's loop body (issue 33).

In a CUDA graph with concurrent regions, independent kernels overlap, so an update's time is set
less by the sum of its kernel times than by its longest chain of kernels that wait on one
another (each link also pays the graph's dependency latency). This reads the text of a compiled
module (``compiled.as_text()``, e.g. ``bench/trace_update.py --hlo``), takes the body of its
largest ``while`` loop (the learner's scan of updates; the entry computation when there is no
loop), and returns the longest path through it counted in **kernels**: every instruction except
those that launch nothing (``parameter``, ``get-tuple-element``, ``tuple``, ``bitcast``,
``constant``, the ``*-start`` halves of async pairs). Each instruction's operands are read from
its argument list (tuple-shaped multi-output fusions included); ties keep the first-scheduled
path. Names are :mod:`bench.hlo_source`'s: ``op | file:line fn``.

    python bench/hlo_chain.py module.txt[.gz]     # kernels in the body, the chain, its sources
"""

from __future__ import annotations

import gzip
import re
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.hlo_source import instruction_sources

__all__ = ["Chain", "computations", "longest_chain"]

#: instructions that launch no kernel of their own
FREE = frozenset(
    {"parameter", "get-tuple-element", "tuple", "bitcast", "constant", "copy-start", "fusion-start"}
)
_INSTRUCTION = re.compile(r"^\s+(?:ROOT )?%([\w.\-]+) = (.+?) ([a-z][a-z0-9\-]*)\((.*)$")
_BODY = re.compile(r"body=%?([\w.\-]+)")


@dataclass(frozen=True)
class Chain:
    computation: str  # the computation read (a while body, or ENTRY)
    kernels: int  # kernel-launching instructions in it
    path: tuple[tuple[str, str], ...]  # (instruction, opcode) along the longest chain, in order


def computations(hlo: str) -> dict[str, list[str]]:
    """Computation name (``ENTRY`` for the entry) → its instruction lines."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in hlo.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith("{"):
            name = "ENTRY" if line.startswith("ENTRY") else line.split()[0].lstrip("%")
            current = out.setdefault(name, [])
        elif line.startswith("}"):
            current = None
        elif current is not None and line.strip():
            current.append(line)
    return out


def _arguments(rest: str) -> list[str]:
    """The ``%names`` inside the instruction's argument list (up to its closing parenthesis)."""
    depth, end = 1, 0
    while end < len(rest) and depth:
        depth += {"(": 1, ")": -1}.get(rest[end], 0)
        end += 1
    return re.findall(r"%([\w.\-]+)", rest[:end])


def _loop_body(comps: dict[str, list[str]]) -> str:
    """The body of the ``while`` with the most instructions anywhere in the module, or ENTRY."""
    bodies = [
        m.group(1)
        for lines in comps.values()
        for line in lines
        if " while(" in line and (m := _BODY.search(line)) and m.group(1) in comps
    ]
    return max(bodies, key=lambda b: len(comps[b])) if bodies else "ENTRY"


def longest_chain(hlo: str, computation: str | None = None) -> Chain:
    """The longest dependent chain of kernels in ``computation`` (default: the largest loop
    body). Instructions are visited in their printed (scheduled, so topological) order."""
    comps = computations(hlo)
    name = computation or _loop_body(comps)
    depth: dict[str, int] = {}
    prev: dict[str, str | None] = {}
    ops: dict[str, str] = {}
    for line in comps[name]:
        m = _INSTRUCTION.match(line)
        if not m:
            continue
        inst, _, op, rest = m.groups()
        ops[inst] = op
        before = [a for a in _arguments(rest) if a in depth]
        best = max(before, key=lambda a: depth[a], default=None)
        depth[inst] = (depth[best] if best else 0) + (op not in FREE)
        prev[inst] = best
    path: list[tuple[str, str]] = []
    node = max(depth, key=lambda n: depth[n], default=None)
    while node is not None:
        if ops[node] not in FREE:
            path.append((node, ops[node]))
        node = prev[node]
    kernels = sum(op not in FREE for op in ops.values())
    return Chain(name, kernels, tuple(reversed(path)))


def main() -> int:
    path = Path(sys.argv[1])
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    chain = longest_chain(text)
    sources = instruction_sources(text)
    print(f"{chain.computation}: {chain.kernels} kernels, longest dependent chain "
          f"{len(chain.path)} kernels")  # fmt: skip
    for i, (inst, op) in enumerate(chain.path, 1):
        print(f"{i:3d}  {inst:<40} {op:<13} {sources.get(inst, '')[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
