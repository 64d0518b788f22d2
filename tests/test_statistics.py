"""E3 and S1 statistics (docs/DESIGN.md): PSR and DSR against skfolio, the stationary
bootstrap's coverage on series with a known Sharpe, the SPA's orientation, the population dict
(jaxdqn.evaluation.statistics)."""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest
from arch.bootstrap import SPA
from scipy import stats as sps
from skfolio import measures as sk

from jaxdqn.evaluation import statistics as st
from jaxdqn.market import data

PPY = 252


def _sp500_returns() -> np.ndarray:
    close = data.load_ohlcv("sp500")["close"].to_numpy(dtype=np.float64)
    return close[1:] / close[:-1] - 1.0


def _series() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    r = _sp500_returns()
    return {
        "normal": 0.0005 + 0.01 * rng.standard_normal(750),
        "student_t3": 0.0004 + 0.01 * rng.standard_t(3, 500),
        "skewed": rng.lognormal(0.0, 0.8, 300) * 0.01 - 0.012,
        "short": 0.01 * rng.standard_normal(5) + 0.003,
        "sp500_all": r,
        "sp500_2016_2018": r[-754:],
        "sp500_2008": r[2250:2503],
    }


def _ar1(rng, n: int, mu: float, phi: float, sigma: float = 1.0) -> np.ndarray:
    u = sigma * rng.standard_normal(n)
    e = np.empty(n)
    e[0] = u[0] / math.sqrt(1 - phi**2)
    for t in range(1, n):
        e[t] = phi * e[t - 1] + u[t]
    return mu + e


# ---------------------------------------------------------------------------------------------
# PSR and DSR
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(_series()))
def test_e3_psr_equals_skfolio(name):
    r = _series()[name]
    for bench in (0.0, 0.03, -0.02, st.per_period_sharpe(0.5, PPY)):
        ours = st.probabilistic_sharpe_ratio(r, bench)
        ref = sk.probabilistic_sharpe_ratio(r, benchmark_sharpe_ratio=bench)
        assert math.isfinite(ref)
        assert ours == pytest.approx(ref, abs=1e-9), (name, bench)


def test_e3_psr_uses_raw_kurtosis_and_the_per_period_sharpe_by_hand():
    # Two values ±1 around a: skewness 0 and raw kurtosis 1, so the variance term is
    # 1 − 0 + (1 − 1)/4·SR² = 1 and PSR = Φ(SR·sqrt(T − 1)); SR = a / std(ddof 1).
    a, t = 0.2, 8
    r = a + np.array([1.0, -1.0] * (t // 2))
    sr = a / math.sqrt(t / (t - 1))
    assert st.sharpe_ratio(r) == pytest.approx(sr, abs=1e-12)
    assert st.probabilistic_sharpe_ratio(r) == pytest.approx(
        sps.norm.cdf(sr * math.sqrt(t - 1)), abs=1e-12
    )
    # with the excess kurtosis (γ4 − 3) a fat-tailed series with a large per-period Sharpe
    # would be far off skfolio: the convention matters
    r = 0.3 + np.random.default_rng(5).standard_normal(20)
    r[0] = 5.0  # one outlier: raw kurtosis ≈ 6.3, per-period Sharpe ≈ 0.26
    sr = st.sharpe_ratio(r)
    g3, g4 = sps.skew(r), sps.kurtosis(r, fisher=False)
    wrong = sps.norm.cdf(sr * math.sqrt(len(r) - 1) / math.sqrt(1 - g3 * sr + (g4 - 4) / 4 * sr**2))
    assert abs(wrong - sk.probabilistic_sharpe_ratio(r)) > 1e-3
    assert st.probabilistic_sharpe_ratio(r) == pytest.approx(
        sk.probabilistic_sharpe_ratio(r), abs=1e-9
    )
    # annualised ↔ per period
    assert st.per_period_sharpe(math.sqrt(252), 252) == pytest.approx(1.0)
    assert st.annualised_sharpe(0.1, 252) == pytest.approx(0.1 * math.sqrt(252))


def test_e3_psr_degenerate_inputs_are_nan():
    assert math.isnan(st.probabilistic_sharpe_ratio(np.zeros(50)))
    assert math.isnan(st.probabilistic_sharpe_ratio([0.01, 0.02]))  # T < 3
    assert math.isnan(st.sharpe_ratio([0.01]))
    assert math.isnan(st.sharpe_ratio(np.full(10, 0.003)))
    with_nan = np.array([0.01, np.nan, -0.02, 0.005, 0.0])
    assert st.probabilistic_sharpe_ratio(with_nan) == pytest.approx(
        sk.probabilistic_sharpe_ratio(with_nan), abs=1e-12
    )


@pytest.mark.parametrize("name", list(_series()))
def test_e3_dsr_equals_skfolio(name):
    r = _series()[name]
    rng = np.random.default_rng(1)
    yearly = st.sharpe_ratio  # per-period Sharpe of each S&P year: real trial Sharpes
    sp = _sp500_returns()
    trial_sets = [
        0.05 * rng.standard_normal(20),
        np.array([yearly(sp[i : i + 252]) for i in range(0, len(sp) - 252, 252)]),
        np.array([0.04]),  # N = 1: SR0 = 0, the DSR is the PSR against 0
        np.array([0.02, 0.02, 0.02]),  # V = 0
    ]
    for trials in trial_sets:
        ours = st.deflated_sharpe_ratio(r, trials)
        ref = sk.deflated_sharpe_ratio(r, trials)
        assert ours == pytest.approx(ref, abs=1e-9), (name, trials[:3])
        n, v = len(trials), float(np.var(trials, ddof=1)) if len(trials) > 1 else 0.0
        alt = st.deflated_sharpe_ratio(r, num_trials=n, sharpe_variance=v)
        assert alt == pytest.approx(ref, abs=1e-9)
        assert st.expected_max_sharpe(n, v) == pytest.approx(
            sk.expected_max_sharpe_ratio(n, math.sqrt(v)), abs=1e-12
        )


def test_e3_dsr_benchmark_by_hand_and_argument_checks():
    # N = 2, V = 1: SR0 = (1 − γ)·Φ⁻¹(1/2) + γ·Φ⁻¹(1 − 1/(2e)) = γ·Φ⁻¹(1 − 1/(2e))
    g = 0.5772156649015329
    assert st.expected_max_sharpe(2, 1.0) == pytest.approx(g * sps.norm.ppf(1 - 1 / (2 * math.e)))
    assert st.expected_max_sharpe(1, 4.0) == 0.0
    # more trials, higher bar: the DSR falls with N
    r = _series()["normal"]
    dsr = [st.deflated_sharpe_ratio(r, num_trials=n, sharpe_variance=0.03**2) for n in (2, 10, 100)]
    assert dsr[0] > dsr[1] > dsr[2]
    with pytest.raises(ValueError, match="num_trials"):
        st.expected_max_sharpe(0.5, 1.0)
    with pytest.raises(ValueError, match="not both"):
        st.deflated_sharpe_ratio(r, [0.1, 0.2], num_trials=2, sharpe_variance=0.1)
    with pytest.raises(ValueError, match="both"):
        st.deflated_sharpe_ratio(r, num_trials=2)
    with pytest.raises(ValueError, match="no finite"):
        st.deflated_sharpe_ratio(r, [np.nan])


# ---------------------------------------------------------------------------------------------
# Bootstrap intervals
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("phi", [0.0, 0.3])
def test_e3_bootstrap_interval_covers_the_true_sharpe(phi):
    # AR(1) returns μ + e, e_t = φ e_{t−1} + u_t: per-period Sharpe μ·sqrt(1 − φ²)/σ_u.
    rng = np.random.default_rng(7)
    mu, n, runs = 0.06, 500, 200
    true = st.annualised_sharpe(mu * math.sqrt(1 - phi**2), PPY)
    hits = []
    for i in range(runs):
        ci = st.sharpe_confidence_interval(_ar1(rng, n, mu, phi), reps=200, seed=i)
        assert ci["low"] < ci["sharpe"] < ci["high"]
        hits.append(ci["low"] <= true <= ci["high"])
    coverage = float(np.mean(hits))
    assert 0.88 <= coverage <= 0.99, coverage


def test_e3_bootstrap_interval_size_is_its_coverage():
    # a 50 % interval covers about half the time: the coverage test above can tell them apart
    rng = np.random.default_rng(3)
    true = st.annualised_sharpe(0.06, PPY)
    hits = [
        (
            ci := st.sharpe_confidence_interval(
                _ar1(rng, 500, 0.06, 0.0), size=0.5, reps=200, seed=i
            )
        )["low"]
        <= true
        <= ci["high"]
        for i in range(100)
    ]
    assert 0.35 <= np.mean(hits) <= 0.65


def test_e3_population_mean_interval_covers_and_resamples_jointly():
    rng = np.random.default_rng(11)
    mu, n, seeds = 0.06, 500, 3
    true = st.annualised_sharpe(mu, PPY)  # every seed: mean μ, unit variance
    hits = []
    for i in range(60):
        common = rng.standard_normal((n, 1))
        x = mu + math.sqrt(0.5) * common + math.sqrt(0.5) * rng.standard_normal((n, seeds))
        ci = st.population_sharpe_interval(x, reps=200, seed=i)
        own = np.mean([st.annualised_sharpe(st.sharpe_ratio(x[:, s]), PPY) for s in range(seeds)])
        assert ci["sharpe"] == pytest.approx(own, abs=1e-12)
        hits.append(ci["low"] <= true <= ci["high"])
    assert 0.85 <= np.mean(hits) <= 1.0
    # identical seeds: the joint resample gives exactly the one-seed interval
    r = x[:, 0]
    one = st.sharpe_confidence_interval(r, reps=300, seed=5, block_length=2.0)
    from arch.bootstrap import StationaryBootstrap

    draws = StationaryBootstrap(2.0, np.stack([r, r], 1), seed=5).apply(
        lambda y: y.mean(0)[:1] / y.std(0, ddof=1)[:1], 300
    )[:, 0]
    lo, hi = np.percentile(draws, [2.5, 97.5]) * math.sqrt(PPY)
    assert (one["low"], one["high"]) == pytest.approx((lo, hi), abs=1e-12)


def test_e3_bootstrap_is_reproducible_and_uses_arch_block_length():
    r = _ar1(np.random.default_rng(0), 750, 0.05, 0.4)
    a = st.sharpe_confidence_interval(r, seed=1)
    assert a == st.sharpe_confidence_interval(r, seed=1)
    assert a != st.sharpe_confidence_interval(r, seed=2)
    from arch.bootstrap import optimal_block_length

    b = float(optimal_block_length(r)["stationary"].iloc[0])
    assert a["block_length"] == pytest.approx(max(1.0, b)) and a["block_length"] > 2
    assert st.stationary_block_length(np.zeros(100)) == 1.0
    flat = st.sharpe_confidence_interval(np.zeros(100))
    assert all(math.isnan(v) for v in flat.values())


# ---------------------------------------------------------------------------------------------
# SPA
# ---------------------------------------------------------------------------------------------


def _baselines(rng, n: int) -> dict[str, np.ndarray]:
    market = 0.0003 + 0.01 * rng.standard_normal(n)
    return {
        "flat": np.zeros(n),
        "buy_and_hold": market,
        "momentum": np.sign(rng.standard_normal(n)) * market,
    }


def test_e3_spa_small_p_when_the_agent_beats_every_baseline():
    rng = np.random.default_rng(0)
    n = 750
    base = _baselines(rng, n)
    # every seed earns buy-and-hold plus 15 bps a day: better than each baseline on average
    good = base["buy_and_hold"][:, None] + 0.0015 + 0.005 * rng.standard_normal((n, 2))
    res = st.spa_pvalue(good, base, seed=0)
    for name, p in res["baselines"].items():
        assert p["consistent"] < 0.01, name
    assert res["agent_beats_all"]["consistent"] < 0.01
    assert res["some_baseline_beats_agent"]["consistent"] > 0.5
    # a worse agent: no evidence that it beats them, strong evidence that one beats it
    bad = base["buy_and_hold"][:, None] - 0.0015 + 0.005 * rng.standard_normal((n, 2))
    res = st.spa_pvalue(bad, base, seed=0)
    assert res["baselines"]["buy_and_hold"]["consistent"] > 0.5
    assert res["agent_beats_all"]["consistent"] > 0.5
    assert res["some_baseline_beats_agent"]["consistent"] < 0.01
    for p in res["baselines"].values():
        assert p["lower"] <= p["consistent"] <= p["upper"]


def test_e3_spa_size_under_the_null():
    # the agent's mean return equals the baseline's (H0 at its boundary): the test rejects at
    # 5 % about 5 % of the time (a bootstrap test: a little more at T = 300), not half the time
    rng = np.random.default_rng(21)
    rejected = []
    for i in range(80):
        b = 0.0003 + 0.01 * rng.standard_normal(300)
        a = b + 0.004 * rng.standard_normal(300)
        p = st.spa_pvalue(a, {"buy_and_hold": b}, reps=200, seed=i)["baselines"]["buy_and_hold"]
        rejected.append(p["consistent"] < 0.05)
    assert np.mean(rejected) <= 0.15


def test_e3_spa_each_baseline_is_arch_benchmark_of_the_seeds():
    # orientation: the p of baseline b is arch's SPA(benchmark = −r_b, models = −r_seeds)
    rng = np.random.default_rng(4)
    n = 400
    base = _baselines(rng, n)
    agent = base["buy_and_hold"][:, None] + 0.0004 + 0.008 * rng.standard_normal((n, 3))
    res = st.spa_pvalue(agent, base, reps=500, seed=3)
    diffs = np.concatenate([agent - base[name][:, None] for name in base], axis=1)
    block = max(1, round(st.stationary_block_length(diffs[:, np.ptp(diffs, axis=0) > 0])))
    for name, r_b in base.items():
        test = SPA(-r_b, -agent, block_size=block, reps=500, seed=3)
        test.compute()
        expected = {k: float(test.pvalues[k]) for k in ("consistent", "lower", "upper")}
        assert res["baselines"][name] == pytest.approx(expected, abs=1e-12), name
    reverse = base_stack = np.stack(list(base.values()), axis=1)
    rblock = max(1, round(st.stationary_block_length(base_stack - agent.mean(1, keepdims=True))))
    test = SPA(-agent.mean(1), -reverse, block_size=rblock, reps=500, seed=3)
    test.compute()
    assert res["some_baseline_beats_agent"]["consistent"] == pytest.approx(
        float(test.pvalues["consistent"]), abs=1e-12
    )


def test_e3_spa_an_agent_equal_to_a_baseline_does_not_beat_it():
    # arch's p-value is 0 for a zero differential (its strict '>' never fires); ours is 1
    rng = np.random.default_rng(2)
    base = _baselines(rng, 300)
    res = st.spa_pvalue(np.zeros(300), base)
    assert res["baselines"]["flat"] == {"consistent": 1.0, "lower": 1.0, "upper": 1.0}
    assert res["agent_beats_all"]["consistent"] == 1.0
    # better than the flat baseline by 1 bp on every bar: beaten with certainty
    res = st.spa_pvalue(np.full(300, 1e-4), base)
    assert res["baselines"]["flat"]["consistent"] == 0.0
    with pytest.raises(ValueError, match="bars"):
        st.spa_pvalue(np.zeros(10), {"flat": np.zeros(11)})


# ---------------------------------------------------------------------------------------------
# population_statistics
# ---------------------------------------------------------------------------------------------


def _population(seeds: int = 3, n: int = 500):
    rng = np.random.default_rng(9)
    base = _baselines(rng, n)
    x = base["buy_and_hold"][:, None] * 0.5 + 0.0004 + 0.006 * rng.standard_normal((n, seeds))
    trials = 0.6 + 0.4 * rng.standard_normal(seeds * 5)  # annualised val Sharpes
    return x, base, trials


def _finite_numbers(node) -> bool:
    if isinstance(node, dict):
        return all(_finite_numbers(v) for v in node.values())
    if isinstance(node, list):
        return all(_finite_numbers(v) for v in node)
    if isinstance(node, float):
        return math.isfinite(node)
    return node is not None


def test_e3_population_statistics_keys_json_and_values():
    x, base, trials = _population()
    out = st.population_statistics(
        x, base, trial_sharpes=trials, trials="seeds × checkpoints compared on val", reps=300
    )
    json.dumps(out, allow_nan=False)
    assert _finite_numbers(out)
    assert set(out) == {
        "bars",
        "confidence",
        "seeds",
        "mean",
        "reference",
        "dsr",
        "bootstrap",
        "spa",
    }
    assert out["bars"] == 500 and len(out["seeds"]) == 3
    row_keys = {"seed", "sharpe", "sharpe_low", "sharpe_high", "block_length"}
    row_keys |= {"psr_zero", "psr_reference", "dsr"}
    assert set(out["seeds"][0]) == row_keys
    assert out["dsr"]["trials"] == "seeds × checkpoints compared on val"
    assert out["dsr"]["num_trials"] == 15
    assert out["dsr"]["sharpe_std"] == pytest.approx(np.std(trials, ddof=1))
    sr0 = st.expected_max_sharpe(15, float(np.var(trials / math.sqrt(PPY), ddof=1)))
    assert out["dsr"]["sr0"] == pytest.approx(st.annualised_sharpe(sr0, PPY))
    bh = st.sharpe_ratio(base["buy_and_hold"])
    assert out["reference"] == {"name": "buy_and_hold", "sharpe": st.annualised_sharpe(bh, PPY)}
    for s, row in enumerate(out["seeds"]):
        r = x[:, s]
        assert row["sharpe"] == pytest.approx(st.annualised_sharpe(st.sharpe_ratio(r), PPY))
        assert row["psr_zero"] == pytest.approx(sk.probabilistic_sharpe_ratio(r), abs=1e-9)
        assert row["psr_reference"] == pytest.approx(sk.probabilistic_sharpe_ratio(r, bh), abs=1e-9)
        assert row["dsr"] == pytest.approx(
            sk.deflated_sharpe_ratio(r, trials / math.sqrt(PPY)), abs=1e-9
        )
        assert row["sharpe_low"] < row["sharpe"] < row["sharpe_high"]
    assert set(out["spa"]["baselines"]) == set(base)
    assert out["mean"]["sharpe"] == pytest.approx(np.mean([r["sharpe"] for r in out["seeds"]]))


def test_e3_population_statistics_one_seed_and_no_history():
    x, base, _ = _population(seeds=1)
    out = st.population_statistics(list(x.T), base, reps=200)  # a list of S series
    row, mean = out["seeds"][0], out["mean"]
    assert (mean["sharpe_low"], mean["sharpe_high"]) == (row["sharpe_low"], row["sharpe_high"])
    assert out["dsr"]["num_trials"] == 1 and out["dsr"]["sr0"] == 0.0
    assert row["dsr"] == pytest.approx(row["psr_zero"])
    assert "no selection history" in out["dsr"]["trials"]
    # a flat seed: undefined numbers are None, the dict stays JSON
    flat = st.population_statistics(
        np.zeros((200, 1)), {k: v[:200] for k, v in base.items()}, reps=100
    )
    json.dumps(flat, allow_nan=False)
    assert flat["seeds"][0]["sharpe"] is None and flat["mean"]["sharpe_low"] is None
    assert flat["spa"]["baselines"]["flat"]["consistent"] == 1.0


def test_e3_population_statistics_without_arch(monkeypatch):
    # The GPU machine has no arch: PSR and DSR still come, the bootstrap parts say why not.
    monkeypatch.setitem(sys.modules, "arch", None)
    monkeypatch.setitem(sys.modules, "arch.bootstrap", None)
    x, base, trials = _population()
    out = st.population_statistics(x, base, trial_sharpes=trials, trials="t")
    json.dumps(out, allow_nan=False)
    assert out["unavailable"].startswith("arch not installed")
    assert "spa" not in out
    row = out["seeds"][0]
    assert row["sharpe_low"] is None and row["sharpe_high"] is None
    assert row["psr_zero"] == pytest.approx(sk.probabilistic_sharpe_ratio(x[:, 0]), abs=1e-9)
    assert math.isfinite(row["dsr"]) and math.isfinite(out["mean"]["sharpe"])
    with pytest.raises(ImportError):
        st.sharpe_confidence_interval(x[:, 0])
