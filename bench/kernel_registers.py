"""Registers and spills of the acting kernels as ptxas compiles them (GPU machine).

    python bench/kernel_registers.py [--kernels head_statistics,gate_product] [--rows 65536]

Each variant runs in a child process with ``XLA_FLAGS=--xla_dump_to=DIR`` (XLA reads the flag
once per process); the child compiles and runs the kernel once at acting's sizes, XLA writes the
module's PTX (the Pallas/Triton kernels are linked into it), and this script runs ``ptxas -v``
for sm_90a on every dumped PTX that holds a kernel of that name and prints, per kernel entry,
its registers per thread and its spill stores / loads in bytes (a spilling epilogue is one
explanation of a kernel far from its memory and FLOP floors; this tells whether it happens).
Prints a table last. ``ptxas`` is looked up on PATH, then in the installed ``nvidia`` wheels.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (variant name, kernel name in the PTX, code run in the child: compiles and runs it once)
CHILD = """
import sys
sys.path.insert(0, {root!r})
import functools, jax
from bench import head_statistics as hs
from pallas_kernels.head_statistics import HeadStatBlocks, head_statistics_pallas
rows, m = {rows}, {m}
args = hs.inputs(jax.random.key(0), rows, m, 256)
fn = functools.partial(head_statistics_pallas, actions=hs.ACTIONS, levels=hs.LEVELS,
                       blocks=HeadStatBlocks(*{blocks!r}), aligned={aligned}, cdf={cdf!r},
                       per_action={per_action})
jax.block_until_ready(jax.jit(fn)(*args))
print("ran")
"""


def variants(rows: int) -> list[tuple[str, str, str]]:
    out = []
    cases = [((128, 32, 8), False, "scan", False), ((128, 32, 8), True, "scan", False)]
    cases += [((128, 32, 8), False, "products", False), ((64, 32, 4), False, "scan", False)]
    cases += [((128, 32, 4), False, "scan", True), ((64, 32, 4), False, "scan", True)]
    for blocks, aligned, cdf, per_action in cases:
        name = f"head_statistics {blocks[0]}x{blocks[1]}x{blocks[2]}"
        name += " aligned" if aligned else ""
        name += " cdf=products" if cdf != "scan" else ""
        name += " per action" if per_action else ""
        code = CHILD.format(
            root=str(ROOT),
            rows=rows,
            m=3,
            blocks=blocks,
            aligned=aligned,
            cdf=cdf,
            per_action=per_action,
        )
        out.append((name, "head_statistics", code))
    return out


def find_ptxas() -> str | None:
    found = shutil.which("ptxas")
    if found:
        return found
    for entry in sys.path:
        base = Path(entry) / "nvidia"
        if base.is_dir():
            for p in sorted(base.glob("**/bin/ptxas")):
                return str(p)
    return None


def ptxas_report(ptxas: str, ptx: Path, kernel: str) -> list[tuple[str, int, int, int]]:
    """(entry, registers, spill store bytes, spill load bytes) of each entry named ``kernel``."""
    res = subprocess.run(
        [ptxas, "-arch=sm_90a", "-v", str(ptx), "-o", os.devnull],
        capture_output=True,
        text=True,
    )
    text = res.stdout + res.stderr
    rows, entry = [], None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            entry = m.group(1)
        spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if spill and entry:
            stores, loads = int(spill.group(1)), int(spill.group(2))
            rows.append([entry, -1, stores, loads])
        regs = re.search(r"Used (\d+) registers", line)
        if regs and rows and rows[-1][0] == entry:
            rows[-1][1] = int(regs.group(1))
    if res.returncode != 0 and not rows:
        print(f"  ptxas failed on {ptx.name}: {text[-500:]}")
    return [tuple(r) for r in rows if kernel in r[0]]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=65536)
    args = ap.parse_args(argv)
    ptxas = find_ptxas()
    if ptxas is None:
        sys.exit("kernel_registers: no ptxas on PATH or in the nvidia wheels")
    print(f"ptxas: {ptxas}", flush=True)
    table = []
    for name, kernel, code in variants(args.rows):
        with tempfile.TemporaryDirectory() as dump:
            env = dict(os.environ)
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" --xla_dump_to={dump}").strip()
            res = subprocess.run(
                [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
            )
            if "ran" not in res.stdout:
                print(f"  {name}: child failed: {res.stderr[-800:]}")
                continue
            every = sorted(Path(dump).rglob("*.ptx"))
            ptxs = [p for p in every if kernel in p.read_text()]
            found = [r for p in ptxs for r in ptxas_report(ptxas, p, kernel)]
            if not found:
                # what the dump holds instead (the next run can aim at it)
                files = sum(1 for f in Path(dump).rglob("*") if f.is_file())
                entries = sorted(
                    {e for f in every for e in re.findall(r"\.entry\s+(\w+)", f.read_text())}
                )
                print(f"  {name}: no PTX entry named {kernel}: {files} dumped files, "
                      f"{len(every)} .ptx, entries {entries[:12]}")  # fmt: skip
            for entry, regs, stores, loads in found:
                table.append((name, entry, regs, stores, loads))
                print(table[-1], flush=True)
    print()
    print("| variant | entry | registers / thread | spill stores (B) | spill loads (B) |")
    print("|---|---|---:|---:|---:|")
    for name, entry, regs, stores, loads in table:
        print(f"| {name} | `{entry[:40]}` | {regs} | {stores} | {loads} |")


if __name__ == "__main__":
    main()
