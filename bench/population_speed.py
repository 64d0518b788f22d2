"""Issue 32: a hyperparameter population in one program against its members run one after
another.

    python bench/population_speed.py                 # 4 lr x 4 gamma at configs/gpu.yaml sizes
    python bench/population_speed.py --tiny          # smoke sizes (a CPU check)

Everything runs the program ``python -m jaxdqn.train`` runs (``program.placement.place``,
state donated), every component on, at the sizes of ``bench/scale.py`` (E = B = 4,096, replay
2^20, ``learning_starts`` 65,536). The population row trains the 16 members (one seed each) in
one vmapped program; the sequential rows train each member alone, one after another, as 16
ordinary runs would. Each configuration is built, initialised, given its learning rates
(``apply_schedule``) and run twice (compilation, then the first learning iteration; the
replay passes ``learning_starts`` in the first), then ``--iters`` iterations are timed one by
one (each blocks on its result) and the median is quoted. One iteration of the population
advances all 16 members; the 16 sequential runs need the sum of their medians for the same
work. Goal (issue 32): the population's iterations/s >= 8x the sequential runs'. Compile
times (the first call) are quoted beside; the programs' XLA flags and persistent compilation
cache are on, as in ``python -m jaxdqn.train``. Prints a table last.

``--trace DIR``: once the population and the member ``--trace-member`` are timed (before the
other members run), ``jax.profiler`` traces of ``--trace-calls`` iterations of the population
program and of that member's program (the programs and states just timed), read back kernel
by kernel with :mod:`bench.trace_update`'s reader (every event on a GPU stream is one kernel
or copy) and named by the compiled modules' metadata (:mod:`bench.hlo_source`): per iteration
the kernel count, the summed kernel time, the GPU busy time (union of the kernel intervals)
against the traced span and the host's wall time, kernels by duration, the time by kernel
class, by phase of the iteration (acting scan, store, learner, metrics:
:func:`instruction_phases`), by source, and the top kernels of each program. The raw traces
stay under ``DIR/population`` and ``DIR/member``. On a CPU the traces hold no GPU streams: a
line says so.

    python bench/population_speed.py --trace /tmp/ptrace   # on the H200

``--variant NAME:K=V,...`` (repeatable): the levers of the trace, each against the baseline in
the same process — the population and ``--sample-members`` members alone (the same γ: one
compilation), the 16 sequential runs estimated as 16 × the sampled members' mean:

    python bench/population_speed.py --variant bf16:kernels.matmul=bf16 \
        --variant bf16-jnp-kan:kernels.matmul=bf16,kernels.kan=reference
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import io
import re
import statistics
import sys
import time
from pathlib import Path

import jax

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.hlo_source import _tables, instruction_sources, kernel_instruction  # noqa: E402
from bench.trace_update import busy_time, gpu_events, kernel_class, source_group  # noqa: E402
from jaxdqn import config  # noqa: E402
from jaxdqn.agent.build import build_agent  # noqa: E402
from jaxdqn.config.members import agent_configs, members  # noqa: E402
from jaxdqn.market import market as market_lib  # noqa: E402
from jaxdqn.program.launch import runtime  # noqa: E402
from jaxdqn.program.run.placement import place  # noqa: E402
from jaxdqn.program.run.schedule import apply_schedule, schedule  # noqa: E402


def overrides(tiny: bool) -> list[str]:
    if tiny:
        return [*config.ALL_ON]
    return [
        *config.ALL_ON,
        "acting.num_envs=4096",
        "replay.batch_size=4096",
        "replay.capacity=1048576",
        "replay.learning_starts=65536",
    ]


def measure(cfg: config.Config, prepared, iters: int, keep: bool = False) -> dict:
    """Median seconds per iteration and the first call's seconds of ``cfg``'s program; with
    ``keep`` also the placement and the last state (``"run"``), to trace it later."""
    agent = build_agent(cfg, prepared)
    placed = place(cfg, prepared, agent)
    state = placed.fresh(cfg.seed, cfg.train.num_seeds)
    sched = schedule(0, 0, 0, cfg.optim, cfg.acting, agent_configs(cfg))
    state = placed.put(apply_schedule(state, sched, agent.dynamics, None))
    first = None
    for i in range(2):
        t = time.perf_counter()
        state, metrics = placed.iterate(state, placed.market)
        jax.block_until_ready((state, metrics))
        first = time.perf_counter() - t if i == 0 else first
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        state, metrics = placed.iterate(state, placed.market)
        jax.block_until_ready((state, metrics))
        times.append(time.perf_counter() - t)
    learning = float(jax.device_get(metrics["learning"]).min())
    out = {"s": statistics.median(times), "first_s": first, "learning": learning}
    if keep:
        out["run"] = (placed, state)
    return out


#: functions of jaxdqn/agent/iteration.py whose frames name a kernel's phase
PHASES = {"act": "acting scan", "store": "store (n-step, replay add)", "learn": "learner"}
UNPLACED = "top level, no iteration.py frame"
_COMPUTATION = re.compile(r"^(?:ENTRY )?%([\w.\-]+) ")
_NAME = re.compile(r"^\s+(?:ROOT )?%([\w.\-]+) = ")
_FRAME_ID = re.compile(r"stack_frame_id=(\d+)")
_CALLED = re.compile(
    r"\b(?:body|condition|calls|to_apply|true_computation|false_computation)=%([\w.\-]+)"
    r"|\b(?:branch_computations|called_computations)=\{([^}]*)\}"
)


def instruction_phases(hlo: str) -> dict[str, str]:
    """Instruction name -> phase of the iteration (:data:`PHASES`, else ``metrics
    (iteration)`` or :data:`UNPLACED`).

    An instruction's own stack names its phase when the innermost frame of
    ``jaxdqn/agent/iteration.py`` in it is one of :data:`PHASES`' functions; JAX keeps only
    the innermost frames of deep stacks, so the kernels inside the scans rarely reach that
    file, and take the phase of the ``while`` that runs them: the acting and learner scans'
    ``while`` instructions are created in ``act`` and ``learn``, and every computation they
    call (bodies, fusions, command buffers, inner loops) inherits their phase. What XLA hoisted
    out of the loops, and top-level code whose kept frames stop short of ``iteration.py``
    (parts of ``store``), stays :data:`UNPLACED`."""
    lines = hlo.splitlines()
    files, funcs, locs, frames = _tables(lines)

    def own(frame: int) -> str | None:
        seen: set[int] = set()
        while frame in frames and frame not in seen:
            seen.add(frame)
            loc, parent = frames[frame]
            if loc in locs:
                f, fn, _ = locs[loc]
                top = funcs.get(fn, "").split(".")[0]
                if files.get(f) == "iteration.py" and top != "make_iteration":
                    return PHASES.get(top, "metrics (iteration)")
            if parent == frame:
                break
            frame = parent
        return None

    comp, entry = None, None
    owner: dict[str, str] = {}  # instruction -> its computation
    phase_of: dict[str, str | None] = {}  # instruction -> its own stack's phase
    calls: dict[str, list[tuple[str, str]]] = collections.defaultdict(list)  # comp -> (inst, c)
    for line in lines:
        if m := _COMPUTATION.match(line):
            comp = m[1]
            entry = comp if line.startswith("ENTRY") else entry
            continue
        m = _NAME.match(line)
        if not m or comp is None:
            continue
        inst = m[1]
        owner[inst] = comp
        frame = _FRAME_ID.search(line)
        phase_of[inst] = own(int(frame[1])) if frame else None
        for c in _CALLED.finditer(line):
            for callee in [c[1]] if c[1] else re.findall(r"%([\w.\-]+)", c[2]):
                calls[comp].append((inst, callee))
    # walk down from the entry: a callee takes the phase of the instruction calling it when
    # that instruction's stack names one of PHASES, else its caller's computation's
    comp_phase: dict[str, str | None] = {}
    todo = [(entry, None)] if entry else []
    while todo:
        c, phase = todo.pop()
        if c in comp_phase:
            continue
        comp_phase[c] = phase
        for inst, callee in calls.get(c, ()):
            mine = phase_of.get(inst)
            todo.append((callee, mine if mine in PHASES.values() else phase))
    return {inst: comp_phase.get(c) or phase_of.get(inst) or UNPLACED for inst, c in owner.items()}


def trace_program(placed, state, calls: int, trace_dir: Path) -> tuple[dict | None, object]:
    """``calls`` traced iterations of ``placed``'s program: its kernels, each with class,
    phase and source, per iteration; None when the trace holds no GPU kernel."""
    t = time.perf_counter()
    hlo = placed.iterate.lower(state, placed.market).compile().as_text()
    print(f"  compiled module text for kernel names: {time.perf_counter() - t:.1f} s")
    sources, phases = instruction_sources(hlo), instruction_phases(hlo)
    trace_dir.mkdir(parents=True, exist_ok=True)
    with jax.profiler.trace(str(trace_dir), create_perfetto_trace=True):
        t = time.perf_counter()
        for _ in range(calls):
            state, metrics = placed.iterate(state, placed.market)
            jax.block_until_ready((state, metrics))
        wall_us = (time.perf_counter() - t) * 1e6
    with contextlib.redirect_stdout(io.StringIO()):  # it lists every stream (thousands)
        kernels, span = gpu_events(trace_dir)
    lines = {(e["pid"], e.get("tid")) for e in kernels}
    print(f"  {trace_dir.name}: {len(kernels)} kernel events on {len(lines)} GPU stream lines")
    if not kernels:
        return None, state
    rows = []
    unnamed = 0
    for e in sorted(kernels, key=lambda e: float(e["ts"])):
        name = e["name"]
        hlo_op = e.get("args", {}).get("hlo_op")
        inst = hlo_op if hlo_op in sources else kernel_instruction(name, sources)
        src = sources.get(inst) if inst else None
        phase = phases.get(inst) if inst else None
        inferred = phase is None
        if inferred:  # a library kernel: the phase of the kernel before it (in time)
            unnamed += 1
            phase = rows[-1]["phase"] if rows else UNPLACED
        rows.append(
            {"name": name, "dur": float(e["dur"]), "class": kernel_class(name),
             "phase": phase, "inferred": inferred, "group": source_group(src),
             "src": src or "(library kernel)"}
        )  # fmt: skip
    durs = sorted(r["dur"] for r in rows)
    small = [d for d in durs if d < 5.0]
    return {
        "calls": calls,
        "rows": rows,
        "n": len(rows) / calls,
        "kernel_us": sum(durs) / calls,
        "busy_us": busy_time(kernels) / calls,
        "span_us": span / calls,
        "wall_us": wall_us / calls,
        "median_us": statistics.median(durs),
        "mean_us": sum(durs) / len(durs),
        "small_share": len(small) / len(durs),
        "small_time": sum(small) / sum(durs),
        "unnamed": unnamed / calls,
    }, state


def _by(report: dict, key: str, inferred: bool | None = None) -> tuple[dict, dict]:
    """µs and kernels per iteration by ``key`` (only kernels whose phase was or was not
    inferred, with ``inferred`` set)."""
    us: dict[str, float] = collections.Counter()
    n: dict[str, float] = collections.Counter()
    for r in report["rows"]:
        if inferred is not None and r["inferred"] != inferred:
            continue
        us[r[key]] += r["dur"] / report["calls"]
        n[r[key]] += 1 / report["calls"]
    return us, n


def print_trace(pop: dict | None, one: dict | None, members_n: int, top: int) -> None:
    """The traces' tables: population against one member, per iteration."""
    print()
    if pop is None or one is None:
        print("trace: no GPU kernel events in the traces (CPU run?): nothing to attribute")
        return
    ratio = lambda a, b: f"{a / b:.2f}x" if b else "-"
    print(f"## Per-kernel traces ({pop['calls']} iterations each; µs per iteration; "
          f"population = {members_n} members, member = one of them alone)")  # fmt: skip
    print()
    print("| per iteration | member | population | population / member |")
    print("|---|---:|---:|---:|")
    for label, key, fmt in (
        ("host wall time (µs, traced)", "wall_us", "{:,.0f}"),
        ("traced span, first kernel start to last end (µs)", "span_us", "{:,.0f}"),
        ("GPU kernels", "n", "{:,.0f}"),
        ("summed kernel time (µs; concurrent kernels overlap)", "kernel_us", "{:,.0f}"),
        ("GPU busy: union of kernel intervals (µs)", "busy_us", "{:,.0f}"),
        ("median kernel duration (µs)", "median_us", "{:.1f}"),
        ("mean kernel duration (µs)", "mean_us", "{:.1f}"),
        ("library kernels without metadata (phase from the kernel before)", "unnamed",
         "{:,.0f}"),
    ):  # fmt: skip
        a, b = one[key], pop[key]
        print(f"| {label} | {fmt.format(a)} | {fmt.format(b)} | {ratio(b, a)} |")
    for label, fn in (
        ("GPU busy / host wall", lambda r: r["busy_us"] / r["wall_us"]),
        ("GPU busy / traced span", lambda r: r["busy_us"] / r["span_us"]),
        ("kernels under 5 µs: share of kernels", lambda r: r["small_share"]),
        ("kernels under 5 µs: share of kernel time", lambda r: r["small_time"]),
    ):
        print(f"| {label} | {fn(one):.1%} | {fn(pop):.1%} | |")
    buckets = ((0, 5), (5, 20), (20, 100), (100, 1000), (1000, float("inf")))
    print()
    print("| kernel duration (µs) | member kernels | member µs | population kernels | "
          "population µs |")  # fmt: skip
    print("|---|---:|---:|---:|---:|")
    for lo, hi in buckets:
        cells = []
        for rep in (one, pop):
            d = [r["dur"] for r in rep["rows"] if lo <= r["dur"] < hi]
            cells += [f"{len(d) / rep['calls']:,.0f}", f"{sum(d) / rep['calls']:,.0f}"]
        print(f"| {lo:g} to {hi:g} | {' | '.join(cells)} |")
    for title, key, limit in (
        ("kernel class", "class", None),
        ("phase of the iteration", "phase", None),
        ("source (model module / file)", "group", top),
    ):
        p_us, p_n = _by(pop, key)
        o_us, o_n = _by(one, key)
        print()
        print(f"| {title} | member µs | member kernels | population µs | population kernels "
              f"| population / member µs | share of population kernel time |")  # fmt: skip
        print("|---|---:|---:|---:|---:|---:|---:|")
        keys = sorted(set(p_us) | set(o_us), key=lambda k: -p_us.get(k, 0.0))
        for k in keys[:limit]:
            a, b = o_us.get(k, 0.0), p_us.get(k, 0.0)
            share = b / pop["kernel_us"]
            print(f"| {k[:48]} | {a:,.0f} | {o_n.get(k, 0):,.0f} | {b:,.0f} | "
                  f"{p_n.get(k, 0):,.0f} | {ratio(b, a)} | {share:.1%} |")  # fmt: skip
        if key == "phase":
            p_lib, _ = _by(pop, key, inferred=True)
            o_lib, _ = _by(one, key, inferred=True)
            print()
            print("Of which library kernels (cuBLAS, Pallas, custom calls: no metadata), their "
                  "phase inferred from the kernel before them in time; concurrent streams make "
                  "that guess unreliable:")  # fmt: skip
            print()
            print("| phase | member µs (inferred) | population µs (inferred) |")
            print("|---|---:|---:|")
            for k in keys:
                print(f"| {k[:48]} | {o_lib.get(k, 0.0):,.0f} | {p_lib.get(k, 0.0):,.0f} |")
    for label, rep in (("population", pop), ("member", one)):
        by_name: dict[str, list[dict]] = collections.defaultdict(list)
        for r in rep["rows"]:
            by_name[r["name"]].append(r)
        print()
        print(f"Top {top} kernels of the {label} program (by µs per iteration; phase?: inferred)")
        print()
        print("| kernel | class | phase | calls/iter | µs/iter | µs/call (median) | source |")
        print("|---|---|---|---:|---:|---:|---|")
        ranked = sorted(by_name.items(), key=lambda kv: -sum(r["dur"] for r in kv[1]))
        for name, rs in ranked[:top]:
            short = name if len(name) <= 80 else name[:77] + "..."
            d = [r["dur"] for r in rs]
            src = rs[0]["src"].replace("|", "/")[:100]
            n, us = len(d) / rep["calls"], sum(d) / rep["calls"]
            phase = rs[0]["phase"] + ("?" if rs[0]["inferred"] else "")
            print(f"| {short} | {rs[0]['class']} | {phase} | {n:.1f} | {us:,.0f} "
                  f"| {statistics.median(d):.1f} | {src} |")  # fmt: skip


def compare_variants(args) -> int:
    """The population and ``--sample-members`` members alone under the baseline and every
    ``--variant``, in one process; prints one table row per variant."""
    runtime.configure(args.compile_cache)
    base = str(ROOT / ("configs/smoke.yaml" if args.tiny else "configs/gpu.yaml"))
    grid = [f"population.optim.lr=[{args.lrs}]", f"population.loss.gamma=[{args.gammas}]"]
    named = [("baseline", [])]
    for item in args.variant:
        name, _, body = item.partition(":")
        named.append((name, [o for o in body.split(",") if o]))
    print(f"# {datetime.date.today()}  jax {jax.__version__}  {jax.devices()[0].device_kind}")
    rows = []
    for name, extra in named:
        cfg = config.load(base, [*overrides(args.tiny), *grid, *extra])
        prepared = market_lib.prepare(cfg)
        ms = members(cfg)
        step = max(1, len(ms) // args.sample_members)  # first key slowest: the same gamma
        pop = measure(cfg, prepared, args.iters)
        alone = [measure(ms[i].cfg, prepared, args.iters) for i in range(0, len(ms), step)]
        assert pop["learning"] == 1.0 and all(r["learning"] == 1.0 for r in alone)
        est = len(ms) * statistics.mean(r["s"] for r in alone)
        rows.append((name, " ".join(extra) or "-", pop, alone, est))
        print(f"{name}: population {pop['s'] * 1e3:.1f} ms, members alone "
              f"{[round(r['s'] * 1e3, 1) for r in alone]} ms", flush=True)  # fmt: skip
    print()
    print("| variant | overrides | population ms/it | one member ms/it (mean of sampled) | "
          "16 runs, estimated ms | ratio | population first call (s) |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, extra, pop, alone, est in rows:
        one = statistics.mean(r["s"] for r in alone)
        print(f"| {name} | {extra} | {pop['s'] * 1e3:.1f} | {one * 1e3:.1f} | {est * 1e3:.1f} | "
              f"{est / pop['s']:.2f}x | {pop['first_s']:.1f} |")  # fmt: skip
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lrs", default="1e-4,2e-4,3e-4,5e-4", help="population.optim.lr values")
    ap.add_argument("--gammas", default="0.9,0.95,0.97,0.99", help="population.loss.gamma")
    ap.add_argument("--iters", type=int, default=5, help="timed iterations per configuration")
    ap.add_argument("--tiny", action="store_true", help="smoke sizes (a CPU check)")
    ap.add_argument("--compile-cache", default=None, help="persistent compilation cache folder")
    ap.add_argument(
        "--trace",
        default=None,
        metavar="DIR",
        help="after the timing, trace the population's and one member's program per kernel",
    )
    ap.add_argument("--trace-calls", type=int, default=2, help="traced iterations per program")
    ap.add_argument("--trace-member", type=int, default=0, help="the member traced alone")
    ap.add_argument("--top", type=int, default=15, help="kernels and sources listed per table")
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:K=V,...",
        help="also time the population and sampled members with these overrides (repeatable); "
        "e.g. bf16:kernels.matmul=bf16",
    )
    ap.add_argument(
        "--sample-members",
        type=int,
        default=4,
        help="with --variant: members timed alone per variant (same gamma, one compilation); "
        "the sequential time is estimated as members x their mean",
    )
    args = ap.parse_args()
    if args.variant:
        return compare_variants(args)
    # The programs' own XLA flags and compilation cache: sixteen ordinary runs would share the
    # cache (members with the same γ compile the same program; the learning rate is state).
    runtime.configure(args.compile_cache)
    base = str(ROOT / ("configs/smoke.yaml" if args.tiny else "configs/gpu.yaml"))
    grid = [f"population.optim.lr=[{args.lrs}]", f"population.loss.gamma=[{args.gammas}]"]
    cfg = config.load(base, [*overrides(args.tiny), *grid])
    prepared = market_lib.prepare(cfg)
    ms = members(cfg)
    dev = jax.devices()[0]
    print(f"# {datetime.date.today()}  jax {jax.__version__}  {dev.device_kind}  {len(ms)} members")
    tracing = args.trace is not None
    pop = measure(cfg, prepared, args.iters, keep=tracing)
    print(f"population: {pop['s'] * 1e3:.1f} ms/iteration, first call {pop['first_s']:.1f} s")
    seq = []
    for i, m in enumerate(ms):
        row = measure(m.cfg, prepared, args.iters, keep=tracing and i == args.trace_member)
        seq.append(row)
        print(
            f"member {m.overrides}: {row['s'] * 1e3:.1f} ms/iteration, first {row['first_s']:.1f} s"
        )
        if tracing and i == args.trace_member:
            # traced once both programs are timed, before the other members run (their states
            # are freed and the traces' tables are out early); the timing table stays last
            print(f"\ntracing the population and member {m.overrides}")
            out = Path(args.trace)
            pop_trace, _ = trace_program(*pop.pop("run"), args.trace_calls, out / "population")
            one_trace, _ = trace_program(*row.pop("run"), args.trace_calls, out / "member")
            print_trace(pop_trace, one_trace, len(ms), args.top)
            print()
    assert pop["learning"] == 1.0 and all(r["learning"] == 1.0 for r in seq), "not learning"
    seq_s = sum(r["s"] for r in seq)
    seq_first = sum(r["first_s"] for r in seq)
    print()
    print("| program | ms per iteration of all members | iterations/s | first calls (s) |")
    print("|---|---:|---:|---:|")
    print(f"| population, {len(ms)} members, one program | {pop['s'] * 1e3:.1f} | "
          f"{1 / pop['s']:.2f} | {pop['first_s']:.1f} |")  # fmt: skip
    print(f"| {len(ms)} runs one after another | {seq_s * 1e3:.1f} | {1 / seq_s:.3f} | "
          f"{seq_first:.1f} |")  # fmt: skip
    print(f"| ratio (goal >= 8) | | {seq_s / pop['s']:.2f}x | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
