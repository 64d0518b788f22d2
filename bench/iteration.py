"""Throughput of the jitted training iteration (issues 5 and 33): µs per learner update and
updates/s, acting env steps/s and compile times, each under the programs' own XLA flags and
without them, the update's analytic FLOPs, the fraction of the measured matmul rate they
achieve, and the PyTorch peer of the same update in the same run.

    python bench/iteration.py                 # configs/gpu.yaml sizes (run on the H200)
    python bench/iteration.py --tiny          # smoke sizes, to check the script on a CPU
    python bench/iteration.py --batches 4096 --envs "" --no-iteration   # learner at B = 4,096

**XLA flags.** XLA reads ``XLA_FLAGS`` once, when JAX starts its backend, so the script runs
itself once per column, in a fresh process each (``--child on|off``): ``on`` calls the programs'
:func:`jaxdqn.program.launch.runtime.configure` (``GPU_XLA_FLAGS`` and ``CPU_XLA_FLAGS`` merged
into ``XLA_FLAGS``, a flag already set there keeping its value), ``off`` is ``--no-xla-flags``
(``XLA_FLAGS`` as inherited). No persistent compilation cache: compile times are fresh
compilations. ``--xla-flags on|off`` runs one column only.

**What is timed** (every timed call blocks on its result; medians over ``--repeats`` calls after
one warm-up call). Learner: ``--updates`` (50) updates of ``agent.learner.update`` in one
jitted, state-donating ``lax.scan`` over a replay filled by acting (4,096 envs × 16 steps);
µs per update = median call time / updates. Acting: one jitted act + store (16 steps of E
envs); env steps/s = 16·E / median call time. Compile: the learner's scan, and the whole
iteration (``--no-iteration`` leaves the latter out). "all off": ``config.ALL_OFF``;
"all on": ``config.ALL_ON`` (L3 included); ``--set K=V`` (repeatable) adds an override to every
jaxdqn row (e.g. ``--set kernels.learner_activations=bf16``), named in the table's header.

**FLOPs** (:mod:`bench.flops`, matrix products only, from the config's layer shapes): ``model``
= the update's math (each branch's head its own product: ≈ 7.19 MFLOP per sample all off at
gpu.yaml sizes), ``executed`` = as the JAX program runs them (the fused block-diagonal head
product, on accelerators the bias-gradient GEMMs). XLA's ``cost_analysis`` is not used for
them: it reported 3.9 GFLOP for the ≈ 30 GFLOP update (issue 33); ``--xla-cost`` adds it as a
note. **% of matmul** = FLOPs / µs per update / the rate of a ``[n, n] @ [n, n]`` float32
product at JAX's default precision (TF32 on H100/H200 tensor cores), measured in the same
process (n = 8,192; median of 10); a jaxdqn row whose learner runs in bfloat16
(``kernels.learner_activations=bf16``, e.g. through ``--set``) divides by the rate of the same
product with bfloat16 operands and float32 accumulation (measured beside it; the peer's rows
keep the float32 rate).

**PyTorch peer** (``--peer``, default ``../shared/peer_torch.py``, else ``runs/peer/peer_torch.py``
— the copy to carry to a machine whose tree has no ``../shared``: ``mkdir -p runs/peer && cp
../shared/peer_torch.py runs/peer/`` and ``carry: ["runs/peer"]``; run when ``torch`` is
importable and the file exists, after the JAX columns, in its own process): the same
all-off update at the same batches, eager, ``torch.compile`` and compiled + one CUDA graph
(``--peer-variants``); its µs are its own medians (CUDA events). Its % of matmul uses the
same model FLOPs and the rate of the XLA-flags-on column.

Prints a markdown table last.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import flops as flops_lib  # noqa: E402
from jaxdqn import config  # noqa: E402
from jaxdqn.agent import iteration  # noqa: E402
from jaxdqn.agent.build import build_agent, make_init  # noqa: E402
from jaxdqn.agent.resolve import fused_kernels, head_kernels  # noqa: E402
from jaxdqn.market import market as market_setup  # noqa: E402
from jaxdqn.program.launch import runtime  # noqa: E402

COMPONENTS = {"off": ("all off", list(config.ALL_OFF)), "on": ("all on", list(config.ALL_ON))}
# the project's shared copy, else one carried inside the (ignored) runs folder
PEER_PLACES = (ROOT.parent / "shared" / "peer_torch.py", ROOT / "runs" / "peer" / "peer_torch.py")
DEFAULT_PEER = next((p for p in PEER_PLACES if p.exists()), PEER_PLACES[0])
PEER_NAMES = {"eager": "eager", "compile": "torch.compile", "cuda graph": "compile + CUDA graph"}


# ---------------------------------------------------------------------------------------------
# One column (a child process): every measurement under one setting of XLA_FLAGS
# ---------------------------------------------------------------------------------------------


def median_time(fn, *args, repeats: int = 5):
    """Median wall time (s) of ``repeats`` calls ``fn(*args)`` after one warm-up call."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def time_calls(compiled, state, repeats: int = 5):
    """Median wall time (s) of ``repeats`` calls ``state, _ = compiled(state)`` (a donated,
    compiled scan of learner updates) after one warm-up call; returns it and the last state."""
    state, _ = compiled(state)
    jax.block_until_ready(state)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        state, _ = compiled(state)
        jax.block_until_ready(state)
        times.append(time.perf_counter() - t)
    return statistics.median(times), state


def matmul_rate(n: int, repeats: int = 10, dtype=jnp.float32) -> float:
    """FLOP/s of one ``[n, n] @ [n, n]`` product (median): float32 operands at the default
    precision, or ``dtype`` operands (bfloat16) with float32 accumulation, as the bfloat16
    learner's products."""
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32).astype(dtype)
    product = jax.jit(lambda x: jnp.matmul(x, x, preferred_element_type=jnp.float32))
    return 2 * n**3 / median_time(product, a, repeats=repeats)


def build(base: str, overrides: list[str], prepared=None):
    cfg = config.load(base, overrides)
    p = prepared or market_setup.prepare(cfg)
    return p, cfg, build_agent(cfg, p)


def jit_program(fn, **kwargs):
    """``jax.jit(fn, **kwargs)`` with the XLA options the training gives its iteration program
    (:func:`jaxdqn.program.launch.runtime.iteration_compiler_options`: read from this process's
    ``XLA_FLAGS``), so the benches time the program the training runs."""
    return jax.jit(fn, compiler_options=runtime.iteration_compiler_options() or None, **kwargs)


def fill_replay(cfg, agent, state, market):
    """Acting until the replay holds enough transitions to sample a batch."""
    step = jax.jit(
        lambda s, m: iteration.store(agent, *iteration.act(agent, s, m), m), donate_argnums=0
    )
    need = max(cfg.replay.batch_size, cfg.replay.learning_starts)
    while int(state.replay.size) < need:
        state = step(state, market)
    return state


def xla_cost_flops(agent, state) -> float:
    """XLA's FLOP count of ONE learner update, compiled on its own (not the scan's: XLA counts a
    loop body once; issue 12). Undercounts the update's products (issue 33)."""
    cost = jax.jit(agent.learner.update).lower(state).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost.get("flops", float("nan")))


def bench_learner(base, extra, batch, prepared, args) -> dict:
    p, cfg, agent = build(
        base,
        [*extra, f"replay.batch_size={batch}", f"acting.num_envs={args.learner_envs}",
         f"replay.learning_starts={batch}", "acting.steps=16", "replay.capacity=1048576"],
        prepared,
    )  # fmt: skip
    state = make_init(agent)(p.market, jax.random.PRNGKey(0))
    state = fill_replay(cfg, agent, state, p.market)
    run = lambda s: iteration.scan_updates(agent, s, args.updates)
    f = jit_program(run, donate_argnums=0)
    t0 = time.perf_counter()
    compiled = f.lower(state).compile()
    compile_s = time.perf_counter() - t0
    cost = xla_cost_flops(agent, state) if args.xla_cost else None
    median_s, _ = time_calls(compiled, state, args.repeats)
    fused, accelerator = fused_kernels(cfg.kernels.fused), jax.default_backend() != "cpu"
    heads = head_kernels(cfg.kernels.heads, fused)
    return {
        "kind": "learner",
        "size": batch,
        "us": median_s / args.updates * 1e6,
        "compile_s": compile_s,
        "model_flops": flops_lib.model_flops(cfg, batch, agent.obs_dim),
        "executed_flops": flops_lib.executed_flops(
            cfg, batch, agent.obs_dim, fused=fused, bias_gemm=accelerator, heads=heads
        ),
        "xla_cost_flops": cost,
        "obs_dim": agent.obs_dim,
        # the products' precision: the rate the "% of matmul" column divides by
        "learner_activations": cfg.kernels.learner_activations,
    }


def bench_acting(base, extra, envs, steps, prepared, repeats) -> dict:
    p, _, agent = build(
        base,
        [*extra, f"acting.num_envs={envs}", f"acting.steps={steps}",
         "replay.learning_starts=1048576", "replay.capacity=1048576"],
        prepared,
    )  # fmt: skip
    state = make_init(agent)(p.market, jax.random.PRNGKey(0))
    act_store = lambda s, m: iteration.store(agent, *iteration.act(agent, s, m), m)
    f = jit_program(act_store, donate_argnums=0)
    state = f(state, p.market)
    jax.block_until_ready(state)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        state = f(state, p.market)
        jax.block_until_ready(state)
        times.append(time.perf_counter() - t)
    return {"kind": "acting", "size": envs, "env_steps_s": envs * steps / statistics.median(times)}


def bench_compile(base, extra, prepared) -> dict:
    p, _, agent = build(base, extra, prepared)
    state = make_init(agent)(p.market, jax.random.PRNGKey(0))
    it = jit_program(lambda s, m: iteration.iteration(agent, s, m), donate_argnums=0)
    t0 = time.perf_counter()
    it.lower(state, p.market).compile()
    return {"kind": "iteration", "size": None, "compile_s": time.perf_counter() - t0}


def run_column(args) -> None:
    """One column (``--child on|off``): configure XLA_FLAGS as the programs do, measure, and
    write the rows to ``--json``."""
    runtime.configure(None, cache=False, xla_flags=args.child == "on")
    flags = os.environ.get("XLA_FLAGS", "")
    prepared = market_setup.prepare(config.load(args.base))
    device = jax.devices()[0]
    print(f"[XLA flags {args.child}] jax {jax.__version__} on {device.device_kind} "
          f"({jax.default_backend()}); XLA_FLAGS={flags!r}", flush=True)  # fmt: skip
    rate = matmul_rate(args.matmul_n)
    rate_bf16 = matmul_rate(args.matmul_n, dtype=jnp.bfloat16)
    print(f"[XLA flags {args.child}] matmul {args.matmul_n}^3: f32 {rate / 1e12:.1f}, bf16 "
          f"{rate_bf16 / 1e12:.1f} TFLOP/s", flush=True)  # fmt: skip
    rows = []
    for key in args.components:
        label, extra = COMPONENTS[key]
        extra = [*extra, *args.set]
        for b in args.batches:
            rows.append({"components": key, **bench_learner(args.base, extra, b, prepared, args)})
            print(f"[XLA flags {args.child}] {label} {rows[-1]}", flush=True)
        for e in args.envs:
            row = bench_acting(args.base, extra, e, args.steps, prepared, args.repeats)
            rows.append({"components": key, **row})
            print(f"[XLA flags {args.child}] {label} {rows[-1]}", flush=True)
        if args.iteration:
            rows.append({"components": key, **bench_compile(args.base, extra, prepared)})
            print(f"[XLA flags {args.child}] {label} {rows[-1]}", flush=True)
    result = {
        "jax": jax.__version__,
        "device": device.device_kind,
        "backend": jax.default_backend(),
        "xla_flags": flags,
        "matmul_flops_s": rate,
        "matmul_flops_s_bf16": rate_bf16,
        "rows": rows,
    }
    Path(args.json).write_text(json.dumps(result))


# ---------------------------------------------------------------------------------------------
# The parent: one child per column, then the PyTorch peer, then the table
# ---------------------------------------------------------------------------------------------


def passthrough(args) -> list[str]:
    """The options a child is started with (the parent's own sizes)."""
    out = ["--batches", ",".join(map(str, args.batches)), "--envs", ",".join(map(str, args.envs)),
           "--components", ",".join(args.components), "--updates", str(args.updates),
           "--repeats", str(args.repeats)]  # fmt: skip
    out += ["--tiny"] if args.tiny else []
    out += [a for kv in args.set for a in ("--set", kv)]
    out += [] if args.iteration else ["--no-iteration"]
    return out + (["--xla-cost"] if args.xla_cost else [])


def run_children(args) -> dict[str, dict]:
    columns = {}
    for flag in ("on", "off") if args.xla_flags == "both" else (args.xla_flags,):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "column.json"
            cmd = [sys.executable, str(Path(__file__).resolve()), "--child", flag, "--json",
                   str(out), *passthrough(args)]  # fmt: skip
            rc = subprocess.run(cmd, check=False).returncode
            if rc != 0 or not out.exists():
                print(f"XLA flags {flag}: the column's process failed (exit {rc})", flush=True)
                continue
            columns[flag] = json.loads(out.read_text())
    return columns


def parse_peer(text: str) -> tuple[list[tuple], list[str]]:
    """The peer's rows ``(variant, batch, µs or None, note)`` (printed as Python tuples as it
    goes) and its header lines (versions, sizes, FLOPs)."""
    rows, header = [], []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("(") and s.endswith(")"):
            try:
                row = ast.literal_eval(s)
            except (ValueError, SyntaxError):
                continue
            if isinstance(row, tuple) and len(row) == 4:
                rows.append(row)
        elif s.startswith(("peer_torch:", "GEMM work", "TF32 matmuls")):
            header.append(s)
    return rows, header


def run_peer(args, started: float) -> tuple[list[tuple], list[str], str]:
    """The PyTorch peer in its own process (killed, with the processes it started, after
    ``--peer-timeout`` s or when ``--budget`` s since ``started`` are 15 s away; the rows it
    printed until then are kept)."""
    if args.no_peer:
        return [], [], "not run (--no-peer)"
    if importlib.util.find_spec("torch") is None:
        return [], [], "not run: torch is not importable"
    peer = Path(args.peer)
    if not peer.exists():
        return [], [], f"not run: {peer} does not exist"
    cmd = [sys.executable, str(peer), "--batches", ",".join(map(str, args.batches)),
           "--variants", args.peer_variants]  # fmt: skip
    cmd += ["--tiny", "--device", "cpu"] if args.tiny else []
    cmd += ["--mode", args.peer_mode] if args.peer_mode else []
    timeout = args.peer_timeout
    if args.budget is not None:
        timeout = min(timeout, args.budget - (time.perf_counter() - started) - 15)
        if timeout < 30:
            return [], [], f"not run: {timeout + 15:.0f} s of --budget left"
    print("$ " + " ".join(cmd), flush=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)  # fmt: skip
    status = "ran"
    try:
        text, _ = proc.communicate(timeout=timeout)
        if proc.returncode:
            status = f"exit {proc.returncode}"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        text, _ = proc.communicate()
        status = f"killed after {timeout:.0f} s"
    print(text, flush=True)
    rows, header = parse_peer(text or "")
    return rows, header, status


def _fmt_us(us) -> str:
    return "–" if us is None else f"{us:,.0f}"


def _fmt_ups(us) -> str:
    return "–" if us is None else f"{1e6 / us:,.0f}"


def _gflop(flop) -> str:
    return f"{flop / 1e9:.4g}"


def _pct(flop, us, rate) -> str:
    return "–" if us is None or not rate else f"{flop / (us * 1e-6) / rate:.1%}"


def table(args, columns: dict[str, dict], peer: tuple[list[tuple], list[str], str]) -> str:
    flags = [f for f in ("on", "off") if f in columns]
    if not flags:
        return "no column was measured"
    first = columns[flags[0]]
    name = {"on": "XLA flags on", "off": "--no-xla-flags"}
    lines = [
        f"jax {first['jax']} on {first['device']} ({first['backend']}); "
        + ", ".join(f"{name[f]}: XLA_FLAGS={columns[f]['xla_flags']!r}" for f in flags)
    ]
    rates = {f: columns[f]["matmul_flops_s"] for f in flags}
    bf16_rates = {f: columns[f]["matmul_flops_s_bf16"] for f in flags}

    def own(f, row):
        """The rate of the products a jaxdqn row ran (the peer's are float32)."""
        return (bf16_rates if row.get("learner_activations") == "bf16" else rates)[f]

    used = {
        "bf16" if r.get("learner_activations") == "bf16" else "f32"
        for f in flags
        for r in columns[f]["rows"]
        if r["kind"] == "learner"
    }
    if args.set:
        lines.append("jaxdqn rows with " + " ".join(args.set) + " (the peer as always)")
    lines.append(
        f"matmul {args.matmul_n}^3, median of 10: f32 at the default precision "
        + ", ".join(f"{rates[f] / 1e12:.1f} TFLOP/s ({name[f]})" for f in flags)
        + "; bf16 operands, f32 accumulation "
        + ", ".join(f"{bf16_rates[f] / 1e12:.1f} TFLOP/s ({name[f]})" for f in flags)
        + f"; the jaxdqn rows' % of matmul uses the {' and '.join(sorted(used)) or 'f32'} rate"
    )
    peer_rows, peer_header, peer_status = peer
    lines += [f"PyTorch peer: {peer_status}"] + [f"  {h}" for h in peer_header]
    lines.append(
        "FLOPs: matrix products per update (bench/flops.py): model = the update's math "
        "(each branch's head its own product), executed = as the JAX program runs "
        "them (block-diagonal heads, bias-gradient GEMMs on accelerators); % of "
        "matmul = model FLOPs / time / the matmul rate (executed in brackets)"
    )
    lines.append("")
    head = ["learner update", "B", "model GFLOP", "executed GFLOP"]
    for f in flags:
        head += [f"µs ({name[f]})", "updates/s", "% of matmul"]
    head += ["compile s (" + " / ".join(name[f] for f in flags) + ")", "note"]
    lines += ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 2) + "---|"]
    rows = {f: columns[f]["rows"] for f in flags}

    def find(f, comp, kind, size):
        return next((r for r in rows[f] if (r["components"], r["kind"], r["size"]) ==
                     (comp, kind, size)), None)  # fmt: skip

    def learner_line(comp, b):
        cells = [f"jaxdqn, {COMPONENTS[comp][0]}", f"{b:,}"]
        got = [find(f, comp, "learner", b) for f in flags]
        ref = next((r for r in got if r), None)
        if ref is None:
            return None
        cells += [_gflop(ref["model_flops"]), _gflop(ref["executed_flops"])]
        for f, r in zip(flags, got, strict=True):
            us = r["us"] if r else None
            rate = own(f, r) if r else None
            pct = _pct(ref["model_flops"], us, rate)
            pct += f" ({_pct(ref['executed_flops'], us, rate)})" if us else ""
            cells += [_fmt_us(us), _fmt_ups(us), pct]
        cells.append(" / ".join("–" if r is None else f"{r['compile_s']:.1f}" for r in got))
        cost = [r["xla_cost_flops"] for r in got if r and r.get("xla_cost_flops")]
        cells.append(f"XLA cost analysis {cost[0] / 1e9:.2f} GFLOP" if cost else "")
        return "| " + " | ".join(cells) + " |"

    for b in args.batches:
        if "off" in args.components:
            lines.append(learner_line("off", b))
            model = find(flags[0], "off", "learner", b)
            for variant, batch, us, note in peer_rows:
                if batch != b:
                    continue
                cells = [f"PyTorch, all off, {PEER_NAMES.get(variant, variant)}", f"{b:,}",
                         *[_gflop(model["model_flops"]) if model else "–"] * 2]  # fmt: skip
                pct = _pct(model["model_flops"], us, rates[flags[0]]) if model else "–"
                cells += [_fmt_us(us), _fmt_ups(us), pct]
                cells += ["–"] * 3 * (len(flags) - 1)
                cells += ["", f"XLA flags n/a; {note}"]
                lines.append("| " + " | ".join(cells) + " |")
        if "on" in args.components:
            lines.append(learner_line("on", b))
    lines = [line for line in lines if line is not None]
    other = []
    for comp in args.components:
        for e in args.envs:
            got = [find(f, comp, "acting", e) for f in flags]
            other.append(
                f"| acting, {COMPONENTS[comp][0]} | E = {e:,} | "
                + " | ".join(
                    "–" if r is None else f"{r['env_steps_s']:.3e} env steps/s" for r in got
                )
                + " |"
            )
        if args.iteration:
            got = [find(f, comp, "iteration", None) for f in flags]
            other.append(
                f"| full iteration, {COMPONENTS[comp][0]} | compile | "
                + " | ".join("–" if r is None else f"{r['compile_s']:.1f} s" for r in got)
                + " |"
            )
    if other:
        lines += ["", "| measurement | size | " + " | ".join(name[f] for f in flags) + " |",
                  "|---|---|" + "---:|" * len(flags), *other]  # fmt: skip
    return "\n".join(lines)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="smoke.yaml sizes (a CPU check)")
    ap.add_argument("--batches", default=None, help="learner batches, comma list "
                    "(default 1024,4096,16384; tiny 64,128)")  # fmt: skip
    ap.add_argument("--envs", default=None, help="acting env counts, comma list, '' for none "
                    "(default 4096,65536; tiny 64,256)")  # fmt: skip
    ap.add_argument("--components", default="off,on", help="off,on (config.ALL_OFF, ALL_ON)")
    ap.add_argument("--updates", type=int, default=None, help="updates per timed call (50; 8)")
    ap.add_argument("--repeats", type=int, default=5, help="timed calls (median)")
    ap.add_argument("--set", action="append", default=[], metavar="K=V",
                    help="a config override for every jaxdqn row (repeatable), e.g. "
                    "kernels.learner_activations=bf16")  # fmt: skip
    ap.add_argument("--no-iteration", dest="iteration", action="store_false",
                    help="leave out the full iteration's compile time")  # fmt: skip
    ap.add_argument(
        "--xla-cost",
        action="store_true",
        help="also XLA's cost analysis of one update (one more compile)",
    )
    ap.add_argument(
        "--xla-flags",
        choices=("both", "on", "off"),
        default="both",
        help="the columns: the programs' XLA flags on, off (--no-xla-flags), both",
    )
    ap.add_argument("--peer", default=str(DEFAULT_PEER), help="the PyTorch peer script")
    ap.add_argument("--no-peer", action="store_true", help="do not run the PyTorch peer")
    ap.add_argument("--peer-variants", default="eager,compile,graph")
    ap.add_argument(
        "--peer-mode",
        default=None,
        help="the peer's torch.compile mode (its default: max-autotune-no-cudagraphs, whose "
        "autotuning took over 150 s at B = 4,096 on the H200)",
    )
    ap.add_argument("--peer-timeout", type=float, default=600.0, help="seconds")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds for the whole script: the peer is stopped in time to print "
                    "the table (default: none)")  # fmt: skip
    ap.add_argument("--child", choices=("on", "off"), help=argparse.SUPPRESS)
    ap.add_argument("--json", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    split = lambda s: [int(x) for x in s.split(",") if x.strip()]
    if args.tiny:
        args.base = str(ROOT / "configs/smoke.yaml")
        args.batches = split(args.batches if args.batches is not None else "64,128")
        args.envs = split(args.envs if args.envs is not None else "64,256")
        args.updates, args.steps, args.matmul_n, args.learner_envs = args.updates or 8, 4, 512, 64
    else:
        args.base = str(ROOT / "configs/gpu.yaml")
        args.batches = split(args.batches if args.batches is not None else "1024,4096,16384")
        args.envs = split(args.envs if args.envs is not None else "4096,65536")
        args.updates, args.steps, args.matmul_n = args.updates or 50, 16, 8192
        args.learner_envs = 4096
    args.components = [c.strip() for c in args.components.split(",") if c.strip()]
    if any(c not in COMPONENTS for c in args.components):
        ap.error(f"--components: choose from {sorted(COMPONENTS)}")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.child:
        run_column(args)
        return
    t0 = time.perf_counter()
    columns = run_children(args)
    peer = run_peer(args, t0)
    print(f"\n(bench/iteration.py: {time.perf_counter() - t0:.0f} s)\n")
    print(table(args, columns, peer))


if __name__ == "__main__":
    main()
