"""Source lines of the kernels in a compiled XLA module, from its own metadata.

``compiled.as_text()`` ends with four tables — ``FileNames``, ``FunctionNames``,
``FileLocations`` and ``StackFrames`` — and every instruction's metadata names its JAX op
(``op_name``) and a ``stack_frame_id`` into them. :func:`instruction_sources` follows each
top-level instruction's frame chain to the Python lines that created it, so that a kernel of a
profiler trace (``input_reduce_fusion_140``: the trace writes the instruction
``%input_reduce_fusion.140`` with ``_`` for ``.``) can be named by the code it came from.

    python bench/hlo_source.py module.txt [name-fragment ...]   # print instructions → source
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

__all__ = ["instruction_sources", "kernel_instruction"]

_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")
_LOCATION = re.compile(r"(\d+) \{file_name_id=(\d+) function_name_id=(\d+) line=(\d+)")
_FRAME = re.compile(r"(\d+) \{file_location_id=(\d+) parent_frame_id=(\d+)")
_INSTRUCTION = re.compile(r"^\s+(?:ROOT )?%([\w.\-]+) = .*?metadata=\{([^}]*)\}")
#: frames from these files say nothing about which jaxdqn code made the op
_SKIP_FILES = ("linear.py", "api.py", "traceback_util.py", "_tree_math.py")


def _tables(lines: list[str]) -> tuple[dict, dict, dict, dict]:
    files: dict[int, str] = {}
    funcs: dict[int, str] = {}
    locs: dict[int, tuple[int, int, int]] = {}
    frames: dict[int, tuple[int, int]] = {}
    section = None
    for line in lines:
        if line in _TABLES:
            section = line
            continue
        if not line.strip():
            section = None
            continue
        if section == "FileNames":
            i, name = line.split(" ", 1)
            files[int(i)] = Path(name.strip('"')).name
        elif section == "FunctionNames":
            i, name = line.split(" ", 1)
            funcs[int(i)] = name.strip('"')
        elif section == "FileLocations" and (m := _LOCATION.match(line)):
            locs[int(m[1])] = (int(m[2]), int(m[3]), int(m[4]))
        elif section == "StackFrames" and (m := _FRAME.match(line)):
            frames[int(m[1])] = (int(m[2]), int(m[3]))
    return files, funcs, locs, frames


def _chain(frame: int, files, funcs, locs, frames, depth: int = 3) -> str:
    out: list[str] = []
    seen: set[int] = set()
    while frame in frames and frame not in seen and len(out) < depth:
        seen.add(frame)
        loc, parent = frames[frame]
        if loc in locs:
            f, fn, line = locs[loc]
            name = files.get(f, "?")
            if not name.startswith(_SKIP_FILES):
                out.append(f"{name}:{line} {funcs.get(fn, '?').split('.')[-1]}")
        if parent == frame:
            break
        frame = parent
    return " < ".join(out)


def instruction_sources(hlo: str) -> dict[str, str]:
    """Instruction name (``input_reduce_fusion.140``) → ``"op | file:line fn < caller ..."``
    for every instruction with metadata in the module text ``hlo``."""
    lines = hlo.splitlines()
    tables = _tables(lines)
    out: dict[str, str] = {}
    for line in lines:
        m = _INSTRUCTION.match(line)
        if not m:
            continue
        meta = m.group(2)
        op = re.search(r'op_name="([^"]+)"', meta)
        frame = re.search(r"stack_frame_id=(\d+)", meta)
        # the op path below the jit/while/eval_jaxpr prefix keeps flax module names
        # (Network/branch_direction/head_advantage/dot_general)
        op_short = (
            re.sub(r"^(jit\([^)]*\)/|while/|body/|eval_jaxpr/)+", "", op.group(1)) if op else ""
        )
        where = _chain(int(frame.group(1)), *tables) if frame else ""
        out[m.group(1)] = f"{op_short} | {where}" if where else op_short
    return out


def kernel_instruction(kernel: str, sources: dict[str, str]) -> str | None:
    """The instruction of a trace kernel name: ``input_reduce_fusion_140`` →
    ``input_reduce_fusion.140`` (or the name itself); None for library kernels (cuBLAS)."""
    if kernel in sources:
        return kernel
    m = re.fullmatch(r"(.*)_(\d+)", kernel)
    if m and f"{m[1]}.{m[2]}" in sources:
        return f"{m[1]}.{m[2]}"
    return None


def main() -> int:
    text = Path(sys.argv[1]).read_text()
    wanted = sys.argv[2:]
    for name, src in instruction_sources(text).items():
        if not wanted or any(w in name for w in wanted):
            print(f"{name:<40} {src}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
