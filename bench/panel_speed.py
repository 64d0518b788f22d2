"""Issue 29: a panel trains at the speed of one instrument.

    python bench/panel_speed.py                # configs/gpu.yaml sizes (run on the H200)
    python bench/panel_speed.py --tiny         # smoke sizes, to check the script on a CPU

For each market — the bundled S&P 500 index (one instrument) and the bundled 20 stocks (a panel,
close-only) — builds the trainer's own program (``jaxdqn.program.run.loop.Trainer``: the placed,
jitted iteration with the market as an argument), runs iterations until the learner is on,
then times ``--iters`` iterations one by one (each blocks on its result): the median gives
learner updates/s (``optim.updates`` per iteration) and env steps/s. Also the validation walk
of every seed (one instrument: one walk per seed; the panel: every instrument's in one vmapped
program per seed), median of 3 after its compilation. Prints a table last, with the panel's
ratios to one instrument measured in the same process.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jaxdqn import config  # noqa: E402
from jaxdqn.program.run import loop  # noqa: E402

MARKETS = {
    "sp500 (1 instrument)": ["data.source=sp500"],
    "sp500_20 (20 stocks)": ["data.source=sp500_20"],
}


def measure(base: str, overrides: list[str], iters: int) -> dict[str, float]:
    cfg = config.load(ROOT / "configs" / base, overrides)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = loop.Trainer(cfg, Path(tmp), progress=False)
        state = trainer.init_state()
        market = trainer.placed.market
        t0 = time.perf_counter()
        state, m = trainer.iterate(state, market)
        jax.block_until_ready(state)
        compile_s = time.perf_counter() - t0
        for _ in range(10_000):  # until the learner runs (replay.learning_starts)
            state, m = trainer.iterate(state, market)
            if float(np.asarray(jax.device_get(m["learning"])).min()) > 0:
                break
        times = []
        for _ in range(iters):
            t = time.perf_counter()
            state, m = trainer.iterate(state, market)
            jax.block_until_ready(state)
            times.append(time.perf_counter() - t)
        assert float(np.asarray(jax.device_get(m["learning"])).min()) > 0
        it = statistics.median(times)
        view = trainer.placed.view(state)
        trainer.validate(view)  # compile
        walks = []
        for _ in range(3):
            t = time.perf_counter()
            trainer.validate(view)
            walks.append(time.perf_counter() - t)
        seeds, a = cfg.train.num_seeds, cfg.acting
        return {
            "bars": trainer.prepared.market.num_bars,
            "iteration_ms": 1e3 * it,
            "updates_per_s": cfg.optim.updates / it,
            "env_steps_per_s": a.num_envs * a.steps * seeds / it,
            "validate_s": statistics.median(walks),
            "first_call_s": compile_s,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="smoke sizes (a CPU check)")
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args()
    base = "smoke.yaml" if args.tiny else "gpu.yaml"
    extra = ["train.iterations_per_epoch=1000"]
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, {base}", flush=True)
    rows = {}
    for name, ov in MARKETS.items():
        rows[name] = measure(base, [*ov, *extra], args.iters)
        print(name, rows[name], flush=True)
    one, panel = rows.values()
    cols = (
        "bars",
        "iteration_ms",
        "updates_per_s",
        "env_steps_per_s",
        "validate_s",
        "first_call_s",
    )
    print()
    print("| market | " + " | ".join(cols) + " |")
    print("| --- |" + " ---: |" * len(cols))
    for name, r in rows.items():
        print(f"| {name} | " + " | ".join(f"{r[c]:.4g}" for c in cols) + " |")
    ratio = {c: panel[c] / one[c] for c in cols}
    print("| panel / one | " + " | ".join(f"{ratio[c]:.3f}" for c in cols) + " |")


if __name__ == "__main__":
    main()
