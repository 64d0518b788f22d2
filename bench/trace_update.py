"""Per-kernel trace of learner updates or acting steps (issues 12, 33: where the GPU time goes,
measured, not guessed).

Builds the learner at configs/gpu.yaml sizes with every component on (``config.ALL_ON``; L3 is
off by default) or off (``--components off``: ``config.ALL_OFF``), compiles ``U`` updates in one
``lax.scan``, and records ``--calls`` calls of it with ``jax.profiler`` (a Perfetto trace).
``--part acting`` traces acting instead: ``act`` + ``store`` at ``--envs`` environments (65,536)
and ``acting.steps`` = U steps per call, the program ``bench/iteration.py`` times; "update" in
the tables then means one step of all environments. Then reads the trace back: every event on
a GPU stream is one kernel (or copy); per update it reports the kernel count, the summed kernel
time, the GPU busy fraction (union of kernel intervals over the traced wall time) and the time by
kernel class and by kernel name, each kernel with the op and Python lines it came from
(:mod:`bench.hlo_source`, from the compiled module's own metadata). Prints a table last;
``--keep DIR`` keeps the raw trace. While the profiler traces, XLA runs the program without its
command buffers (CUDA graphs), op by op, unless ``XLA_FLAGS`` holds
``--xla_enable_command_buffers_during_profiling=true``: the busy fraction is that of the traced
program, not of the timed one (the timing is untraced, graphs on).

    python bench/trace_update.py                 # on the H200
    python bench/trace_update.py --components off                # the all-off update
    python bench/trace_update.py --part acting --updates 16      # acting, E = 65,536
    python bench/trace_update.py --tiny          # smoke sizes on a CPU (no GPU streams: checks
                                                 # that the script runs; the table is empty)
    python bench/trace_update.py key=value ...   # extra config overrides (e.g. replay.batch_size)
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import jax

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: the XLA flag that keeps command buffers on while the profiler traces
GRAPHS_TRACED = "--xla_enable_command_buffers_during_profiling=true"

from bench.hlo_source import instruction_sources, kernel_instruction  # noqa: E402
from bench.iteration import COMPONENTS, build, fill_replay, jit_program, time_calls  # noqa: E402
from jaxdqn.agent import iteration  # noqa: E402
from jaxdqn.agent.build import make_init  # noqa: E402

#: (class, regex on the lower-cased kernel name), first match wins.
CLASSES = (
    ("memcpy/memset", r"memcpy|memset|copy_"),
    ("GEMM", r"gemm|cutlass|cublas|sm\d\d_xmma|nvjet|matmul|dot"),
    ("sort", r"sort"),
    ("scatter/gather", r"scatter|gather"),
    ("reduction", r"reduce"),
    ("Pallas/Triton", r"triton|pallas|kan|projection|gated_value|dueling_heads|statistics"),
    ("fusion (loop/input)", r"fusion|loop_|input_|wrapped_"),
)


def kernel_class(name: str) -> str:
    low = name.lower()
    for label, pattern in CLASSES:
        if re.search(pattern, low):
            return label
    return "other"


def source_group(src: str | None) -> str:
    """A kernel's place in the code for the by-source table: the model module and its first
    sub-module (``Network/trunk``, ``Coordination/denoiser``) for ops traced inside the
    model, else the file of the first Python frame (``targets.py``, ``update.py`` for optax),
    ``(library kernel)`` for cuBLAS/cuDNN/Pallas kernels without metadata."""
    if not src:
        return "(library kernel)"
    op, _, frames = src.partition(" | ")
    path = re.sub(r"\b(?:transpose|jvp|vmap|jit|remat|checkpoint)\(|[()]", "", op)
    parts = [p for p in path.split("/") if p and p not in ("while", "body", "eval_jaxpr")]
    for i, part in enumerate(parts):
        if part[:1].isupper():
            return "/".join(parts[i : i + 2])
    if frames:
        return frames.split()[0].split(":")[0]
    return parts[0] if parts else "?"


def gpu_events(trace_dir: Path) -> tuple[list[dict], float]:
    """Kernel events (``name``, ``ts``, ``dur`` in µs) on GPU streams, and the traced span."""
    files = sorted(trace_dir.rglob("*.trace.json.gz")) + sorted(trace_dir.rglob("perfetto*.json*"))
    if not files:
        raise SystemExit(f"no trace file under {trace_dir}")
    path = files[0]
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    names = {
        e["pid"]: e.get("args", {}).get("name", "")
        for e in events
        if e.get("ph") == "M" and e.get("name") == "process_name"
    }
    gpu_pids = {pid for pid, n in names.items() if "GPU" in n or "gpu" in n}
    threads = {
        (e["pid"], e["tid"]): e.get("args", {}).get("name", "")
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name" and e.get("pid") in gpu_pids
    }
    # A device's lines are its streams plus derived ones ("XLA Ops", "XLA Modules", "Steps")
    # that repeat the same time: count the stream lines only.
    streams = {key for key, n in threads.items() if n.startswith("Stream")}
    kernels = [
        e
        for e in events
        if e.get("ph") == "X"
        and e.get("pid") in gpu_pids
        and (not streams or (e["pid"], e.get("tid")) in streams)
        and float(e.get("dur", 0)) > 0
    ]
    used = sorted({threads.get((e["pid"], e.get("tid")), "?") for e in kernels})
    others = sorted(set(threads.values()) - set(used))
    print(f"trace {path.name}: GPU lines counted {used}; others {others}")
    span = 0.0
    if kernels:
        span = max(e["ts"] + e["dur"] for e in kernels) - min(e["ts"] for e in kernels)
    return kernels, span


def busy_time(kernels: list[dict]) -> float:
    """Length of the union of the kernels' intervals (µs): time the GPU ran anything."""
    total, end = 0.0, -1.0
    for e in sorted(kernels, key=lambda e: e["ts"]):
        s, t = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        if s > end:
            total += t - s
            end = t
        elif t > end:
            total += t - end
            end = t
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--updates", type=int, default=10, help="U updates per traced call")
    ap.add_argument("--calls", type=int, default=3, help="traced calls")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--keep", default=None, help="copy the raw trace directory here")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--hlo", default=None, help="write the compiled module's text here (.gz ok)")
    ap.add_argument("--components", choices=tuple(COMPONENTS), default="on")
    ap.add_argument("--part", choices=("learner", "acting"), default="learner")
    ap.add_argument("--envs", type=int, default=None, help="acting: environments (65,536)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    base = str(ROOT / ("configs/smoke.yaml" if args.tiny else "configs/gpu.yaml"))
    batch = 64 if args.tiny else 4096
    acting = args.part == "acting"
    envs = args.envs or (64 if args.tiny else 65536 if acting else 4096)
    label, switches = COMPONENTS[args.components]
    sizes = [f"replay.batch_size={batch}", f"acting.num_envs={envs}", "replay.capacity=1048576"]
    if acting:  # never learns: the program is act + store, as bench/iteration.py times it
        sizes += [f"acting.steps={args.updates}", "replay.learning_starts=1048576"]
    else:
        sizes += [f"replay.learning_starts={batch}"]
    p, cfg, agent = build(base, [*switches, *sizes, *args.overrides])
    state = make_init(agent)(p.market, jax.random.PRNGKey(0))
    if acting:
        market = p.market
        act = lambda s: (iteration.store(agent, *iteration.act(agent, s, market), market), None)
        compiled = jit_program(act, donate_argnums=0).lower(state).compile()
    else:
        state = fill_replay(cfg, agent, state, p.market)
        run = lambda s: iteration.scan_updates(agent, s, args.updates)
        compiled = jit_program(run, donate_argnums=0).lower(state).compile()
    hlo_text = compiled.as_text()
    sources = instruction_sources(hlo_text)
    if args.hlo:
        opener = gzip.open if args.hlo.endswith(".gz") else open
        with opener(args.hlo, "wt") as f:
            f.write(hlo_text)
    median_s, state = time_calls(compiled, state)
    per_update_us = median_s / args.updates * 1e6

    trace_dir = Path(tempfile.mkdtemp(prefix="jaxdqn_trace_"))
    with jax.profiler.trace(str(trace_dir), create_perfetto_trace=True):
        for _ in range(args.calls):
            state, _ = compiled(state)
            jax.block_until_ready(state)
    kernels, span = gpu_events(trace_dir)
    if args.keep:
        shutil.copytree(trace_dir, args.keep, dirs_exist_ok=True)
    n_upd = args.updates * args.calls
    by_name: dict[str, list[float]] = collections.defaultdict(list)
    for e in kernels:
        by_name[e["name"]].append(float(e["dur"]))
    by_class: dict[str, float] = collections.Counter()
    count_class: dict[str, int] = collections.Counter()
    for name, durs in by_name.items():
        by_class[kernel_class(name)] += sum(durs)
        count_class[kernel_class(name)] += len(durs)
    kernel_us = sum(float(e["dur"]) for e in kernels)
    busy = busy_time(kernels)

    print()
    what = f"acting, E = {envs}" if acting else f"learner, B = {batch}"
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; {what}; {label}; "
          f"{args.updates} {'steps' if acting else 'updates'} x {args.calls} traced calls; "
          f"overrides {args.overrides or 'none'}; XLA_FLAGS {os.environ.get('XLA_FLAGS') or 'none'}")  # fmt: skip  # noqa: E501
    print(f"timed (untraced): {per_update_us:.0f} µs per update = {1e6 / per_update_us:,.0f} "
          f"updates/s (median of 5 calls)")  # fmt: skip
    if acting:
        print(f"acting: {envs * 1e6 / per_update_us:.3e} env steps/s ({envs} environments)")
    if not kernels:
        print("no GPU kernel events in the trace (CPU run): nothing to attribute")
        return
    graphs = GRAPHS_TRACED in os.environ.get("XLA_FLAGS", "").split()
    mode = "on" if graphs else "off: XLA launches op by op while the profiler traces"
    print(f"traced: {len(kernels) / n_upd:.0f} kernels per update, kernel time "
          f"{kernel_us / n_upd:.0f} µs per update, GPU busy {busy / span:.1%} of the traced span "
          f"({span / n_upd:.0f} µs per update; command buffers {mode})")  # fmt: skip
    print()
    print(f"{'class':<22} {'µs/update':>10} {'share':>7} {'kernels/update':>15}")
    for label, us in sorted(by_class.items(), key=lambda kv: -kv[1]):
        print(f"{label:<22} {us / n_upd:>10.1f} {us / kernel_us:>7.1%} "
              f"{count_class[label] / n_upd:>15.1f}")  # fmt: skip
    groups: dict[str, float] = collections.Counter()
    group_count: dict[str, int] = collections.Counter()
    for name, durs in by_name.items():
        inst = kernel_instruction(name, sources)
        g = source_group(sources.get(inst) if inst else None)
        groups[g] += sum(durs)
        group_count[g] += len(durs)
    print()
    print(f"{'by source':<40} {'µs/update':>10} {'share':>7} {'kernels/update':>15}")
    for g, us in sorted(groups.items(), key=lambda kv: -kv[1]):
        print(f"{g[:40]:<40} {us / n_upd:>10.1f} {us / kernel_us:>7.1%} "
              f"{group_count[g] / n_upd:>15.1f}")  # fmt: skip
    print()
    print(f"{'kernel':<44} {'class':<20} {'calls/upd':>9} {'µs/upd':>8} {'µs/call':>8}  source")
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[: args.top]
    for name, durs in top:
        short = name if len(name) <= 44 else name[:41] + "..."
        inst = kernel_instruction(name, sources)
        src = sources[inst] if inst else "(library kernel)"
        per_upd, per_call = sum(durs) / n_upd, statistics.median(durs)
        print(f"{short:<44} {kernel_class(name):<20} {len(durs) / n_upd:>9.1f} "
              f"{per_upd:>8.1f} {per_call:>8.1f}  {src[:110]}")  # fmt: skip


if __name__ == "__main__":
    main()
