"""``python -m jaxdqn.ablate [--config PATH] [--out DIR] [--jobs N] [--only A,B] [key=value ...]``

Ablation of the agent's components: the run with every component on (L3 included, which is
off by default), each of M2, M4, M5, M8–M14, L2–L5, L7, A2 and A3 switched off alone, all of
them off, and the config as shipped (``defaults``), each a population of
``train.num_seeds`` seeds (3 unless overridden) trained by ``python -m jaxdqn.train`` with the
same config. Every run keeps its own directory ``DIR/<variant>`` (a full run directory: report,
metrics, checkpoints); an interrupted ablation started again with the same ``--out`` skips the
variants that finished and resumes the one that did not.

The table (``DIR/ablation.md``, ``DIR/ablation.json``, and stdout) has per variant the test
Sharpe of the best checkpoint (chosen on the population's mean val Sharpe, never on test) as
mean ± std over seeds, its percentage of the reference (the oracle baseline's test Sharpe on
the synthetic market, with the execution chosen on val; buy-and-hold on real data), the
difference to the all-on run with its standard error
``sqrt(s_on²/n + s_off²/n)``, the mean val Sharpe, the annual turnover, and a verdict: switching
the component off **hurts** when the difference is below −2 standard errors, **helps** above +2,
otherwise **no measurable effect** at this number of seeds.
"""

from __future__ import annotations

import concurrent.futures
import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from jaxdqn.config import ALL_OFF, ALL_ON, ConfigError
from jaxdqn.program.launch import cli

__all__ = ["VARIANTS", "verdict"]

#: variant name → (component IDs of docs/DESIGN.md switched off, the component overrides).
#: Every variant except ``defaults`` starts from :data:`ALL_ON` (components that are off by
#: default, L3, are switched on), so "each off alone" is measured against every component on;
#: ``defaults`` is the config as shipped. "all_on" is the reference of every comparison.
_ALONE: dict[str, tuple[str, str]] = {
    "no_vsn": ("M2", "model.vsn"),
    "no_kan": ("M4", "model.kan"),
    "no_dir_conditioning": ("M5", "model.dir_conditioning"),
    "no_q_centering": ("M8", "model.q_centering"),
    "no_q_attention": ("M9", "model.q_attention"),
    "no_graph": ("M10", "model.graph"),
    "no_denoiser": ("M11", "model.denoiser"),
    "no_selectivity": ("M12", "model.selectivity"),
    "no_xlstm": ("M13", "model.xlstm"),
    "no_liquid": ("M14", "dynamics.liquid"),
    "no_sampled_target": ("L2", "loss.sampled_target"),
    "no_spread": ("L3", "loss.spread"),
    "no_entropy": ("L4", "loss.entropy"),
    "no_rank_rewards": ("L5", "loss.rank_rewards"),
    "no_adaptive_support": ("L7", "dynamics.adaptive_support"),
    "no_iqn_blend": ("A2", "acting.iqn_blend"),
    "no_position_sizing": ("A3", "acting.position_sizing"),
}
VARIANTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "all_on": ("-", tuple(ALL_ON)),
    **{name: (spec, (*ALL_ON, f"{key}=false")) for name, (spec, key) in _ALONE.items()},
    "all_off": ("all", tuple(ALL_OFF)),
    "defaults": ("as shipped", ()),
}


def verdict(diff: float, se: float) -> str:
    """``hurts`` / ``helps`` / ``no measurable effect`` for (variant − all on) and its SE."""
    if not (math.isfinite(diff) and math.isfinite(se)):
        return "n/a"
    if diff < -2 * se:
        return "hurts"
    if diff > 2 * se:
        return "helps"
    return "no measurable effect"


def _run_variant(name: str, base: list[str], out: Path) -> tuple[str, int]:
    run = out / name
    if (run / "summary.json").exists():
        return name, 0
    overrides = list(VARIANTS[name][1])
    if (run / "checkpoints").exists():
        cmd = [sys.executable, "-m", "jaxdqn.train", "--resume", str(run), "--no-progress"]
    else:
        if run.exists():  # created but nothing saved yet: nothing to keep
            shutil.rmtree(run)
        cmd = [sys.executable, "-m", "jaxdqn.train", *base, *overrides]
        cmd += ["--run-dir", str(run), "--no-progress"]
    with open(out / f"{name}.log", "a") as log:
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    return name, rc


def _stats(run: Path) -> dict[str, float]:
    s = json.loads((run / "summary.json").read_text())
    seeds = s.get("seeds") or [{"val": s["val"], "test": s["test"]}]
    test = np.array([r["test"]["sharpe"] for r in seeds], dtype=np.float64)
    val = np.array([r["val"]["sharpe"] for r in seeds], dtype=np.float64)
    base = s["baselines"]
    ref_name = "oracle" if "oracle" in base else "buy_and_hold"
    return {
        "n": len(seeds),
        "test_mean": float(np.mean(test)),
        "test_std": float(np.std(test, ddof=1)) if len(test) > 1 else 0.0,
        "val_mean": float(np.mean(val)),
        "turnover": float(np.mean([r["test"]["annual_turnover"] for r in seeds])),
        "reference": ref_name,
        "reference_sharpe": float(base[ref_name]["test"]["sharpe"]),
        "faults": int(s.get("fault_events", 0)),
    }


def table(out: Path, names: Sequence[str]) -> tuple[str, dict]:
    """The markdown table and the JSON rows of the finished variants in ``out``."""
    rows = {n: _stats(out / n) for n in names if (out / n / "summary.json").exists()}
    on = rows.get("all_on")
    ref = next(iter(rows.values()))["reference"] if rows else "oracle"
    lines = [
        f"| variant | off | test Sharpe (mean ± std) | % of {ref} | Δ vs all on (± SE) | "
        "val Sharpe | annual turnover | verdict |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for name in names:
        if name not in rows:
            continue
        r = rows[name]
        pct = 100 * r["test_mean"] / r["reference_sharpe"]
        if on is not None and name != "all_on":
            diff = r["test_mean"] - on["test_mean"]
            se = math.sqrt(on["test_std"] ** 2 / on["n"] + r["test_std"] ** 2 / r["n"])
            r["diff"], r["se"], r["verdict"] = diff, se, verdict(diff, se)
            delta = f"{diff:+.3f} ± {se:.3f}"
        else:
            delta, r["verdict"] = "—", "reference"
        lines.append(
            f"| {name} | {VARIANTS[name][0]} | {r['test_mean']:.3f} ± {r['test_std']:.3f} | "
            f"{pct:.0f} % | {delta} | {r['val_mean']:.3f} | {r['turnover']:.1f} | "
            f"{r['verdict']} |"
        )
    return "\n".join(lines), rows


def _main(argv: Sequence[str] | None) -> int:
    parser = cli.make_parser("python -m jaxdqn.ablate", __doc__.split("\n\n")[1])
    parser.add_argument("--out", type=Path, default=Path("runs/ablation"), help="directory")
    parser.add_argument("--jobs", type=int, default=1, help="variants trained at once")
    parser.add_argument("--only", default=None, help="comma-separated variant names")
    args = parser.parse_args(argv)
    # Bad config or data is refused here, once, before any variant starts.
    cfg = cli.load_config(args)
    cli.require_test_walk(cfg, "an ablation")
    from jaxdqn.market import market as market_setup  # (after the config: --help stays fast)

    market_setup.prepare(cfg)
    names = list(VARIANTS)
    if args.only:
        names = [n.strip() for n in args.only.split(",")]
        unknown = [n for n in names if n not in VARIANTS]
        if unknown:
            raise ConfigError(f"--only: unknown variants {unknown}; known: {', '.join(VARIANTS)}")
        if "all_on" not in names:
            names.insert(0, "all_on")
    if args.jobs < 1:
        raise ConfigError(f"--jobs: must be >= 1, got {args.jobs}")
    base = (["--config", args.config] if args.config else []) + list(args.overrides)
    if not any(o.startswith("train.num_seeds=") for o in args.overrides):
        base.append("train.num_seeds=3")
    args.out.mkdir(parents=True, exist_ok=True)
    failed = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for name, rc in pool.map(lambda n: _run_variant(n, base, args.out), names):
            print(f"{name}: {'done' if rc == 0 else f'FAILED (exit {rc}, see {name}.log)'}")
            if rc != 0:
                failed.append(name)
    md, rows = table(args.out, names)
    (args.out / "ablation.md").write_text(md + "\n")
    (args.out / "ablation.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(md)
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    return cli.run_main("jaxdqn.ablate", _main, argv)


if __name__ == "__main__":
    sys.exit(main())
