"""Environment-only throughput (issue 2, E1): env steps per second, vmapped and jitted.

Each jitted call runs ``K`` steps of ``vmap(step_autoreset)`` over ``N`` environments inside one
``lax.scan``; random actions are drawn inside the scan. The observation is part of the scan
carry, so every step really materialises it (``[N, window · F + 3]`` float32), as acting must.
Rewards and done counts are accumulated so nothing is dead code. The market has the size of
the bundled S&P 500 data (5,031 bars, 12 features, window 8) but is built from synthetic
arrays, so the benchmark needs no files.

    python bench/env_throughput.py                      # 1,024 / 16,384 / 131,072 envs
    python bench/env_throughput.py --steps 50 --repeats 3 --diagnose

``--diagnose`` also times partial steps to show where the time goes: the step without
auto-reset, the transition alone (no observation, no reset), and the observation gather
alone. They are diagnostics only; the headline number is the full step.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from jaxdqn.config import EnvConfig
from jaxdqn.market import env as E


def synthetic_market(num_bars: int, num_features: int, seed: int = 0) -> E.MarketData:
    """A random-walk market with the S&P data's shape (values are irrelevant to speed)."""
    rng = np.random.default_rng(seed)
    close = 1000.0 * np.exp(np.cumsum(rng.normal(0.0, 0.012, num_bars)))
    open_ = close * np.exp(rng.normal(0.0, 0.004, num_bars))
    high = np.maximum(open_, close) * np.exp(np.abs(rng.normal(0.0, 0.005, num_bars)))
    low = np.minimum(open_, close) * np.exp(-np.abs(rng.normal(0.0, 0.005, num_bars)))
    volume = rng.uniform(1e9, 5e9, num_bars)
    f32 = lambda x: jnp.asarray(np.asarray(x, np.float32))
    return E.MarketData(
        open=f32(open_),
        high=f32(high),
        low=f32(low),
        close=f32(close),
        volume=f32(volume),
        sigma=f32(np.full(num_bars, 0.012)),
        adv=f32(close * volume),
        features=f32(rng.normal(size=(num_bars, num_features))),
        oracle=f32(np.zeros(num_bars)),
    )


def make_rollout(env_params: E.EnvParams, num_envs: int, steps: int, variant: str):
    """Jitted ``(market, states, obs, key) -> carry`` running ``steps`` batched env steps."""
    ones = jnp.ones((num_envs,), jnp.float32)

    if variant == "full":
        step_fn = jax.vmap(partial(E.step_autoreset, env_params), in_axes=(None, 0, 0, 0))

        def one(market, states, obs, actions):
            states, obs, reward, done, _ = step_fn(market, states, actions, ones)
            return states, obs, reward, done

    elif variant == "no_reset":  # diagnostic: step without auto-reset (episodes run on)
        step_fn = jax.vmap(partial(E.step, env_params), in_axes=(None, 0, 0, 0))

        def one(market, states, obs, actions):
            # keep t inside the data: wrap around instead of resetting
            states = states.replace(t=jnp.minimum(states.t, market.num_bars - 2))
            states, obs, reward, done, _ = step_fn(market, states, actions, ones)
            return states, obs, reward, done

    elif variant == "no_obs":  # diagnostic: transition only (no observation, no reset)
        trans = jax.vmap(partial(E._transition, env_params), in_axes=(None, 0, 0, 0))

        def one(market, states, obs, actions):
            states = states.replace(t=jnp.minimum(states.t, market.num_bars - 2))
            nxt, reward, done, _ = trans(market, states, actions, ones)
            return nxt, obs, reward, done

    elif variant == "obs_only":  # diagnostic: the observation gather of a moving t
        observe = jax.vmap(partial(E.observe, env_params), in_axes=(None, 0))

        def one(market, states, obs, actions):
            lo = env_params.window - 1
            t = lo + (states.t + 1 + actions[:, 0] - lo) % (market.num_bars - 1 - lo)
            states = states.replace(t=t)
            return states, observe(market, states), jnp.zeros_like(ones), t < 0

    else:
        raise ValueError(variant)

    def body(carry, _):
        states, obs, key, rsum, dsum = carry
        key, sub = jax.random.split(key)
        actions = jax.random.randint(sub, (num_envs, 4), 0, 3, dtype=jnp.int32)
        states, obs, reward, done = one(carry_market, states, obs, actions)
        return (states, obs, key, rsum + reward, dsum + done.astype(jnp.int32)), None

    def rollout(market, states, obs, key):
        nonlocal carry_market
        carry_market = market
        zeros = jnp.zeros((num_envs,), jnp.float32)
        init = (states, obs, key, zeros, jnp.zeros((num_envs,), jnp.int32))
        # unroll=1 on purpose: in an unrolled body only the last step's observation reaches
        # the carry and XLA deletes the others, which would overstate throughput.
        carry, _ = jax.lax.scan(body, init, None, length=steps)
        return carry

    carry_market = None
    return jax.jit(rollout, donate_argnums=(1, 2))


def measure(market, env_params, num_envs, steps, repeats, variant, lo, hi, dump_hlo=None):
    keys = jax.random.split(jax.random.PRNGKey(num_envs), num_envs)
    reset_b = jax.jit(jax.vmap(partial(E.reset, env_params), in_axes=(None, None, None, 0)))
    states, obs = reset_b(market, lo, hi, keys)
    rollout = make_rollout(env_params, num_envs, steps, variant)
    key = jax.random.PRNGKey(1)
    if dump_hlo:
        Path(dump_hlo).write_text(rollout.lower(market, states, obs, key).compile().as_text())
    t0 = time.perf_counter()
    states, obs, key, rsum, dsum = rollout(market, states, obs, key)  # compile + warm-up
    jax.block_until_ready(rsum)
    compile_s = time.perf_counter() - t0
    states, obs, key, rsum, dsum = rollout(market, states, obs, key)  # second warm-up
    jax.block_until_ready(rsum)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        states, obs, key, rsum, dsum = rollout(market, states, obs, key)
        jax.block_until_ready((states, obs, rsum, dsum))
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    assert bool(jnp.isfinite(obs).all()) and bool(jnp.isfinite(rsum).all())
    return {
        "variant": variant,
        "envs": num_envs,
        "steps_per_call": steps,
        "median_s": med,
        "min_s": min(times),
        "max_s": max(times),
        "steps_per_s": num_envs * steps / med,
        "compile_s": compile_s,
        "episodes_done": int(dsum.sum()),
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--envs", default="1024,16384,131072", help="comma-separated env counts")
    ap.add_argument("--steps", type=int, default=None, help="K steps per call (1000 GPU, 20 CPU)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--bars", type=int, default=5031)
    ap.add_argument("--features", type=int, default=12)
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--diagnose", action="store_true", help="also time partial steps (largest N)")
    ap.add_argument("--json", default=None, help="write all rows to this JSON file")
    ap.add_argument("--dump-hlo", default=None, help="write the last full run's compiled HLO here")
    args = ap.parse_args(argv)

    device = jax.devices()[0]
    on_gpu = device.platform == "gpu"
    steps = args.steps or (1000 if on_gpu else 20)
    env_counts = [int(v) for v in args.envs.split(",")]
    env_params = E.EnvParams.from_config(EnvConfig(), args.window)
    market = synthetic_market(args.bars, args.features)
    lo, hi = 252, args.bars

    runs = [("full", n) for n in env_counts]
    if args.diagnose:  # where the time goes, at the largest batch
        runs += [(v, max(env_counts)) for v in ("no_reset", "no_obs", "obs_only")]
    rows = []
    for variant, n in runs:
        dump = args.dump_hlo if (variant, n) == ("full", env_counts[-1]) else None
        r = measure(market, env_params, n, steps, args.repeats, variant, lo, hi, dump)
        rows.append(r)
        print(json.dumps(r), flush=True)

    desc = getattr(device, "device_kind", device.platform)
    header = {
        "date": datetime.date.today().isoformat(),
        "jax": jax.__version__,
        "device": f"{desc} ({device.platform})",
        "python": platform.python_version(),
        "bars": args.bars,
        "features": args.features,
        "window": args.window,
        "obs_dim": E.obs_dim(env_params, args.features),
        "episode_length": env_params.episode_length,
    }
    if args.json:
        Path(args.json).write_text(json.dumps({"header": header, "rows": rows}, indent=1))
    print()
    print(
        f"env throughput  {header['date']}  jax {header['jax']}  device {header['device']}  "
        f"market {args.bars} bars x {args.features} features, window {args.window}, "
        f"obs_dim {header['obs_dim']}, H {env_params.episode_length}"
    )
    print(f"{'variant':<9} {'envs':>8} {'K':>6} {'median ms/call':>15} {'steps/s':>12}")
    for r in rows:
        print(
            f"{r['variant']:<9} {r['envs']:>8,} {r['steps_per_call']:>6} "
            f"{1e3 * r['median_s']:>15.2f} {r['steps_per_s']:>12.3e}"
        )


if __name__ == "__main__":
    main()
