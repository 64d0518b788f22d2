"""Where one learner update's time goes, from the compiled HLO (issue 5's missed goal).

Compiles ``U`` learner updates (configs/gpu.yaml, B = 4,096, every component on) in one
``lax.scan``, times them, and counts the kernels the compiled module launches per update: every
fusion, custom call (cuBLAS GEMMs, Triton/Pallas kernels), copy, sort, scatter and gather that
stands at the top level of a non-fused computation. Prints a table last and writes the HLO
text to ``--hlo``.

    python bench/profile_update.py --hlo $OUT/update_hlo.txt
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

import jax

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.iteration import build, fill_replay, jit_program, time_calls  # noqa: E402
from jaxdqn import config  # noqa: E402
from jaxdqn.agent import iteration  # noqa: E402
from jaxdqn.agent.build import make_init  # noqa: E402

LAUNCHING = ("fusion", "custom-call", "copy", "sort", "scatter", "gather", "dynamic-update-slice")


def kernel_counts(hlo: str) -> collections.Counter:
    """Top-level kernel-launching instructions of non-fused computations, by kind."""
    counts: collections.Counter = collections.Counter()
    fused = False
    for line in hlo.splitlines():
        header = re.match(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
        if header and not line.startswith(" "):
            fused = "fused" in header.group(2) or "fusion" in header.group(2)
            continue
        if fused or "=" not in line:
            continue
        m = re.search(r"=\s*[^ ]+\s+([a-z\-]+)\(", line)
        if not m or m.group(1) not in LAUNCHING:
            continue
        kind = m.group(1)
        if kind == "custom-call":
            target = re.search(r'custom_call_target="([^"]+)"', line)
            kind = f"custom-call {target.group(1) if target else '?'}"
        counts[kind] += 1
    return counts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--updates", type=int, default=20)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--hlo", default=None)
    args = ap.parse_args()
    base = str(ROOT / ("configs/smoke.yaml" if args.tiny else "configs/gpu.yaml"))
    envs = 64 if args.tiny else 4096
    p, cfg, agent = build(
        base,
        [*config.ALL_ON, f"replay.batch_size={args.batch}", f"acting.num_envs={envs}",
         f"replay.learning_starts={args.batch}", "replay.capacity=1048576"],
    )  # fmt: skip
    state = make_init(agent)(p.market, jax.random.PRNGKey(0))
    state = fill_replay(cfg, agent, state, p.market)
    run = lambda s: iteration.scan_updates(agent, s, args.updates)
    compiled = jit_program(run, donate_argnums=0).lower(state).compile()
    hlo = compiled.as_text()
    if args.hlo:
        Path(args.hlo).write_text(hlo)
    median_s, state = time_calls(compiled, state)
    per_update = median_s / args.updates
    counts = kernel_counts(hlo)
    total = sum(counts.values())
    print()
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; B = {args.batch}; "
          f"{per_update * 1e6:.0f} µs per update; {total} kernel launches in the module "
          f"(the scan body runs once per update)")  # fmt: skip
    print(f"{'kernel kind':<40} {'count':>6}")
    for kind, n in counts.most_common():
        print(f"{kind:<40} {n:>6}")
    print(f"{'µs per update / launches':<40} {per_update * 1e6 / max(total, 1):>6.2f}")


if __name__ == "__main__":
    main()
