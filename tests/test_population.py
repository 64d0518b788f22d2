"""Hyperparameter populations (issue 32): members trained as one vmapped program."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest
from model_overrides import MODEL_OFF

from jaxdqn import config
from jaxdqn.agent.build import build_agent, make_init
from jaxdqn.agent.iteration import make_iteration
from jaxdqn.agent.population import make_member_values, population_keys
from jaxdqn.config.members import agent_configs, members, num_members, population_size
from jaxdqn.config.population_sections import LOG_UNIFORM
from jaxdqn.market import market as market_setup
from jaxdqn.program.records.logger import RunLogger
from jaxdqn.program.report import run_statistics
from jaxdqn.program.report.population_results import member_entries, population_section
from jaxdqn.program.run.schedule import apply_schedule, schedule

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
GRID = ["population.optim.lr=[0.002,0.0003]", "population.loss.gamma=[0.9,0.97]"]


def test_h1_grid_is_every_combination_first_key_slowest():
    cfg = config.load(CONFIGS / "smoke.yaml", GRID)
    ms = members(cfg)
    assert [m.overrides for m in ms] == [
        {"optim.lr": 0.002, "loss.gamma": 0.9},
        {"optim.lr": 0.002, "loss.gamma": 0.97},
        {"optim.lr": 0.0003, "loss.gamma": 0.9},
        {"optim.lr": 0.0003, "loss.gamma": 0.97},
    ]
    for m in ms:
        assert (m.cfg.optim.lr, m.cfg.loss.gamma) == (
            m.overrides["optim.lr"],
            m.overrides["loss.gamma"],
        )
        assert not any(members(m.cfg)[0].overrides)  # a member is an ordinary run
        assert m.cfg.model == cfg.model and m.cfg.train == cfg.train
    assert members(config.load(CONFIGS / "smoke.yaml"))[0].cfg == config.load(
        CONFIGS / "smoke.yaml"
    )


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "population.model.ah=[8,16]",
            r"population\.model\.ah: a population varies only optim\.lr",
        ),
        ("population.sampler=4", r"population\.sampler: a population varies only"),
        (
            "population.dynamics.liquid_tau_min=[1,2]",
            r"population\.dynamics\.liquid_tau_min: a population varies only .*acting\.kappa_start",
        ),
        (
            "population.optim.lr=[0.001,-1]",
            r"population member \(optim\.lr=-1\.0\): optim\.lr: must be >= 0",
        ),
        ("population.loss.gamma=[0.9,0.9]", r"population\.loss\.gamma: a value is listed twice"),
        ("population.loss.gamma=0.9", r"population\.loss\.gamma: expected a list"),
    ],
)
def test_h1_bad_keys_and_values_are_one_line_errors(override, message):
    with pytest.raises(config.ConfigError, match=message):
        config.load(CONFIGS / "smoke.yaml", [override])


def test_h1_random_population_draws_each_key_in_its_range():
    ranges = ["population.optim.lr=[1e-4,1e-2]", "population.loss.gamma=[0.8,0.99]"]
    cfg = config.load(CONFIGS / "smoke.yaml", ["population.random=6", "population.seed=3", *ranges])
    ms = members(cfg)
    assert len(ms) == num_members(cfg) == 6 and population_size(cfg) == 6
    u = np.random.default_rng(3).random((6, 2))  # by hand: lr log-uniform, γ uniform
    np.testing.assert_allclose(
        [m.cfg.optim.lr for m in ms], np.exp(np.log(1e-4) + u[:, 0] * np.log(100.0)), rtol=1e-12
    )
    np.testing.assert_allclose([m.cfg.loss.gamma for m in ms], 0.8 + u[:, 1] * 0.19, rtol=1e-12)
    assert [m.overrides["optim.lr"] for m in ms] == [m.cfg.optim.lr for m in ms]
    assert members(cfg) == ms  # the same config draws the same members
    other = config.load(CONFIGS / "smoke.yaml", ["population.random=6", *ranges])
    assert [m.cfg.optim.lr for m in members(other)] != [m.cfg.optim.lr for m in ms]
    for over, message in [
        (["population.random=4", "population.optim.lr=[1e-4,1e-3,1e-2]"], "draws from a range"),
        (["population.random=4", "population.loss.gamma=[0.99,0.9]"], "low < high"),
        (["population.random=4", "population.loss.polyak_tau=[0,0.01]"], "needs low > 0"),
        (["population.random=4"], "list the range of at least one key"),
        (["population.random=-1"], "population.random: must be >= 0"),
    ]:
        with pytest.raises(config.ConfigError, match=message):
            config.load(CONFIGS / "smoke.yaml", over)


def test_h1_member_values_are_member_major_float32():
    cfg = config.load(CONFIGS / "smoke.yaml", GRID)
    v = make_member_values([m.cfg for m in members(cfg)], num_seeds=2)
    np.testing.assert_array_equal(
        v.lr, np.float32([0.002, 0.002, 0.002, 0.002, 3e-4, 3e-4, 3e-4, 3e-4])
    )
    np.testing.assert_array_equal(v.gamma, np.float32([0.9, 0.9, 0.97, 0.97] * 2))
    np.testing.assert_array_equal(v.gamma_n, np.float32([0.9**3, 0.9**3, 0.97**3, 0.97**3] * 2))
    assert v.lr.dtype == np.float32
    keys = population_keys(5, num_agents=8, num_seeds=2)
    np.testing.assert_array_equal(keys[2:4], jax.random.split(jax.random.PRNGKey(5), 2))
    np.testing.assert_array_equal(keys[0:2], keys[6:8])


def _programs(cfg, prepared, n):
    """``(agent, init, iterate)`` of ``cfg`` for ``n`` agents."""
    agent = build_agent(cfg, prepared)
    return agent, make_init(agent, num_seeds=n), make_iteration(agent, num_seeds=n)


def _run(programs, cfg, prepared, keys, agents, iterations):
    agent, init, iterate = programs
    state = init(prepared.market, keys)
    state = apply_schedule(
        state, schedule(0, 0, 0, cfg.optim, cfg.acting, agents), agent.dynamics, None
    )
    history = []
    for _ in range(iterations):
        state, metrics = iterate(state, prepared.market)
        history.append(jax.device_get(metrics))
    return jax.device_get(state), history


@pytest.mark.slow
def test_h1_every_device_and_acting_member_value_follows_its_run():
    """Every member value the device reads — the learning rate (host-written per agent), γ
    (store step) and γⁿ (L7), L2's Polyak rate, L4's base, L8's β₀ and α (the store step's new
    priorities, the learner's updated ones), L3's weight, the statistics' EMA rate (store step
    and learner), L7's rates and width — and A1's κ and A2's readiness (written by the host
    schedule), drawn by a random 2-member population: each member follows its own run over 6
    iterations (float tolerance: a vmapped product may round its last bit differently); without
    their component the keys are refused."""
    ranges = {
        "optim.lr": "[0.0003,0.003]",
        "loss.gamma": "[0.8,0.97]",
        "loss.polyak_tau": "[0.001,0.1]",
        "loss.entropy_base": "[0.001,0.1]",
        "replay.priority_beta0": "[0.1,0.9]",
        "replay.priority_alpha": "[0.2,0.9]",
        "loss.spread_weight": "[0.02,0.5]",
        "dynamics.stats_alpha": "[0.003,0.3]",
        "dynamics.support_sigmas": "[2,8]",
        "dynamics.support_alpha": "[0.001,0.1]",
        "dynamics.support_max_alpha": "[0.2,0.9]",
        "acting.kappa_start": "[0.05,3]",
        "acting.iqn_readiness": "[0,1]",
    }
    grid = ["population.random=2", "population.seed=196"]  # every key >20 % of its range apart
    grid += [f"population.{k}={v}" for k, v in ranges.items()]
    # The network's own components read no member value: off (MODEL_OFF); every component the
    # keys belong to stays on.
    grid += MODEL_OFF
    cfg = config.load(CONFIGS / "smoke.yaml", grid)
    ms = members(cfg)
    for key, span in ranges.items():  # the two members are apart in every key
        ends = [*json.loads(span), ms[0].overrides[key], ms[1].overrides[key]]
        lo, hi, a, b = np.log(ends) if key in LOG_UNIFORM else ends
        assert abs(a - b) > 0.2 * (hi - lo), (key, ends)
    prepared = market_setup.prepare(cfg)
    keys = population_keys(cfg.seed, len(ms), 1)
    pop, pop_history = _run(_programs(cfg, prepared, 2), cfg, prepared, keys, agent_configs(cfg), 6)
    np.testing.assert_allclose(  # the host wrote each agent its member's A1 and A2 values
        pop.dynamics.kappa, [m.cfg.acting.kappa_start for m in ms], rtol=1e-7
    )
    np.testing.assert_allclose(
        pop.dynamics.iqn_readiness, [m.cfg.acting.iqn_readiness for m in ms], rtol=1e-7
    )
    roots = np.asarray(pop.replay.tree[0])[:, 0]  # Σ p_i^α of each member's replay
    watched = ("loss", "loss_c51", "loss_spread", "q_gap", "reward_std_ema", "support_half_width")
    for k in ("loss", "reward_std_ema", "support_half_width"):
        assert not np.allclose(pop_history[-1][k][0], pop_history[-1][k][1], rtol=1e-4), k
    for i, m in enumerate(ms):
        one, one_history = _run(_programs(m.cfg, prepared, 1), m.cfg, prepared, keys[i : i + 1],
                                None, 6)  # fmt: skip
        for pm, om in zip(pop_history, one_history, strict=True):
            for k in watched:
                np.testing.assert_allclose(pm[k][i], om[k][0], rtol=2e-4, atol=1e-6, err_msg=k)
        np.testing.assert_allclose(roots[i], np.asarray(one.replay.tree[0])[0, 0], rtol=1e-4)
        np.testing.assert_array_equal(pop.replay.storage.action[i], one.replay.storage.action[0])
        for a, b in zip(jax.tree.leaves(pop.params), jax.tree.leaves(one.params), strict=True):
            np.testing.assert_allclose(a[i], b[0], rtol=1e-3, atol=1e-5)
    off = {
        "replay.priority_alpha": "replay.prioritised=false",
        "loss.spread_weight": "loss.spread=false",
        "acting.iqn_readiness": "acting.iqn_blend=false",
        "dynamics.support_sigmas": "dynamics.adaptive_support=false",  # the first L7 key
    }
    for key, needs in off.items():
        with pytest.raises(config.ConfigError, match=rf"population\.{key}: .* is off"):
            config.load(CONFIGS / "smoke.yaml", [*grid, needs])


def test_h1_members_average_their_seeds_and_the_best_val_wins(tmp_path):
    cfg = config.load(CONFIGS / "smoke.yaml", [*GRID, "train.num_seeds=2"])
    val = [0.1, 0.3, -0.5, 0.1, 0.9, 0.5, float("nan"), 0.2]  # agents, member-major
    per_agent = [
        {
            "val": {"sharpe": v, "annual_return": 0.01 * p},
            "test": {"sharpe": -v, "annual_return": 0.0},
        }
        for p, v in enumerate(val)
    ]
    entries, winner = member_entries(cfg, per_agent)
    assert [e["agents"] for e in entries] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    np.testing.assert_allclose([e["val"]["sharpe"] for e in entries], [0.2, -0.2, 0.7, 0.2])
    np.testing.assert_allclose(entries[2]["test"]["sharpe"], -0.7)
    assert winner["member"] == 2 and winner["overrides"] == {"optim.lr": 0.0003, "loss.gamma": 0.9}
    assert member_entries(config.load(CONFIGS / "smoke.yaml"), per_agent[:1]) is None
    lines = population_section({"members": entries, "winner": winner})
    assert lines[0] == "## Population"
    assert "| **2** (winner) | 0.0003 | 0.9 | 0.700 | -0.700 | 0.045 | 0.000 |" in lines
    assert population_section({"val": {}}) == []
    with_plot = population_section({"members": entries, "winner": winner}, tmp_path)
    assert with_plot[-2] == "![members](members.png)"
    assert (tmp_path / "members.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_h1_dsr_trials_are_every_agent_of_every_member_at_every_epoch(tmp_path):
    with RunLogger(tmp_path, tensorboard=False, console=False) as log:
        for e in range(1, 4):
            log.log_epoch(
                {"epoch": e, "val_sharpe": 0.1, "val_sharpe_seeds": [0.1 * e, 0.2, 0.3, 0.4]}
            )
    sharpes, what = run_statistics.selection_trials(tmp_path, members=2)
    assert sharpes.size == 12
    assert what.startswith("members × seeds × checkpoints compared on val: 2 × 2 × 3")


@pytest.mark.slow
def test_h1_members_are_walked_at_their_own_best_epoch_and_equal_their_runs(tmp_path):
    """The whole program: a 4-member population (2 lr × 2 γ, 1 seed) trained by the Trainer
    selects each member's own best epoch (by its val Sharpe), and each member's best epoch, val
    and test Sharpe equal those of the ordinary run with its values (float tolerance)."""
    import json

    from jaxdqn.program.checkpoints.checkpoint import score
    from jaxdqn.program.run import loop

    # every component off: the same loop, checkpoints and walks, traced in half the time
    fast = [*config.ALL_OFF, "train.epochs=3", "train.iterations_per_epoch=3"]
    fast += ["eval.bootstrap_reps=20", "eval.cost_multiples=[1]"]
    cfg = config.load(CONFIGS / "smoke.yaml", [*GRID, *fast])
    summary = loop.Trainer(cfg, tmp_path / "pop", progress=False).run()
    records = [
        json.loads(line) for line in (tmp_path / "pop" / "metrics.jsonl").read_text().splitlines()
    ]
    epochs = [r for r in records if "val_sharpe_seeds" in r]
    assert len(epochs) == 3
    for e in summary["members"]:
        curve = [score(r["val_sharpe_seeds"][e["member"]]) for r in epochs]  # NaN: -inf
        best = max(range(3), key=lambda i: (curve[i], i))  # ties: the later epoch
        assert e["best_epoch"] == epochs[best]["epoch"], (e, curve)
        assert score(e["val"]["sharpe"]) == pytest.approx(curve[best], rel=1e-12)
    winner = summary["members"][summary["winner"]["member"]]
    assert summary["best_epoch"] == winner["best_epoch"]
    assert summary["statistics"]["test"]["seeds"][0]["sharpe"] == pytest.approx(
        winner["test"]["sharpe"]
    )
    for m, member in zip(summary["members"], members(cfg), strict=True):
        one = loop.Trainer(member.cfg, tmp_path / f"run{m['member']}", progress=False).run()
        assert one["best_epoch"] == m["best_epoch"], m["overrides"]
        for split in ("val", "test"):
            np.testing.assert_allclose(
                one[split]["sharpe"], m[split]["sharpe"], rtol=1e-3, atol=1e-3, err_msg=split
            )


SCHEDULE_KEYS = [
    "population.optim.sgdr_floor=[0.05,0.5]",
    "population.optim.restart_moment_scale=[0.25,1.0]",
    "population.acting.kappa_start=[0.5,2.0]",
    "population.acting.kappa_end=[0.1,0.4]",
    "population.acting.iqn_readiness=[0.0,0.3]",
    "population.acting.iqn_readiness_end=[0.6,1.0]",
]


def test_h1_schedule_gives_each_agent_its_members_a1_a2_o2_o3_values():
    """The host schedule of a population: every agent's learning rate, readiness, κ and O3
    factor are exactly those its member's own run computes, epoch by epoch (restart included);
    the members differ in each."""
    over = ["population.random=3", "population.optim.lr=[1e-4,1e-3]", *SCHEDULE_KEYS]
    cfg = config.load(CONFIGS / "smoke.yaml", [*over, "train.num_seeds=2", "optim.sgdr_period=3"])
    agents = agent_configs(cfg)
    assert len(agents) == 6 and agents[0] is agents[1] and agents[1] is not agents[2]
    for epoch in range(8):
        got = schedule(epoch, 0, 0, cfg.optim, cfg.acting, agents)
        assert got.restart == (epoch in (3, 6))
        for name in ("lr", "readiness", "kappa", "moment_scale"):
            own = [getattr(schedule(epoch, 0, 0, a.optim, a.acting), name) for a in agents]
            assert getattr(got, name) == tuple(own), (epoch, name)
            if epoch:  # at epoch 0 the floors and end values play no part yet
                assert len(set(own)) == 3, (epoch, name)


def test_h1_m14_validation_ema_runs_at_each_members_rate():
    over = ["population.dynamics.eval_q_std_alpha=[0.1,0.9]", "train.num_seeds=2"]
    cfg = config.load(CONFIGS / "smoke.yaml", over)
    agent = build_agent(cfg, market_setup.prepare(cfg))
    ema = agent.dynamics.next_eval_q_std([1.0, 1.0, 1.0, 1.0], np.float32([2.0, 3.0, 2.0, 3.0]))
    np.testing.assert_allclose(ema, [1.1, 1.2, 1.9, 2.8], rtol=1e-6)
    with pytest.raises(config.ConfigError, match=r"eval_q_std_alpha: dynamics\.liquid is off"):
        config.load(CONFIGS / "smoke.yaml", [*over, "dynamics.liquid=false"])
