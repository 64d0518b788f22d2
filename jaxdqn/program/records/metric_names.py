"""The names of the epoch record written to ``metrics.jsonl``: the one registry, name → meaning.

One record per epoch (:class:`jaxdqn.program.records.logger.RunLogger`), made of four groups:

* :data:`AGENT` — the jitted iteration's metrics (:mod:`jaxdqn.agent.learner`,
  :mod:`jaxdqn.agent.dynamics`, :mod:`jaxdqn.agent.iteration`), each the mean over the epoch's
  iterations ignoring NaN (the learner's metrics are NaN while the replay warms up, so an epoch
  that never learned logs ``null``); the learner's own metrics are first averaged over the
  iteration's ``U`` updates.
* :data:`HOST` — what the epoch loop adds: schedule, plateau detection (O5), its actions (O4,
  O6), fault and checkpoint counters, throughput.
* :data:`VALIDATION` — ``val_<metric>`` of the epoch's deterministic validation walk
  (``eval.policy``: greedy by default), :func:`jaxdqn.evaluation.metrics.performance` of each
  seed, averaged over seeds.
* :data:`POPULATION` — only in runs of ``S > 1`` seeds.

Shapes: ``[4]`` is per branch (:data:`jaxdqn.branches.BRANCHES`). With ``S > 1`` seeds every
:data:`AGENT` value carries a leading seed axis (``loss`` ``[S]``, ``q_gap`` ``[S, 4]``); host and
validation values do not, except where ``[S]`` is stated. A metric that is renamed, added or
dropped must change here: ``tests/test_metric_names.py`` compares this registry with a recorded
run, and modules naming a metric check it with :func:`require` when imported.
"""

from __future__ import annotations

__all__ = [
    "AGENT",
    "GROUPS",
    "HOST",
    "LOSS_PARTS",
    "METRICS",
    "POPULATION",
    "VALIDATION",
    "require",
]

AGENT: dict[str, str] = {
    # learner update (L1–L8, M11–M14), mean over the U updates of an iteration
    "loss": "total loss L1 + L3 + L4 + L6",
    "loss_c51": "L1 IS-weighted C51 cross-entropy of the taken actions, summed over branches",
    "loss_spread": "L3 spread surrogate (scaled per branch and by liquid_mod)",
    "loss_entropy": "L4 entropy term, −entropy_coef × mean entropy",
    "loss_denoise": "L6 M11 denoiser MSE against the target network's Q at s",
    "loss_coord": "L6 Huber of the coordinated Q (M9/M10) of the taken actions vs the TD target",
    "loss_select": "L6 M12 selectivity BCE",
    "loss_xlstm": "L6 M13 xLSTM prediction loss of the batch mean Q",
    "grad_norm": "global norm of the gradients",
    "q_mean": "[4] batch mean Q per branch",
    "q_gap": "[4] batch Q-gap per branch",
    "q_std": "[4] batch Q std per branch",
    "support_centre": "L7 support centre",
    "support_half_width": "L7 support half-width",
    "liquid_mod": "[4] M14 liquid_mod per branch (scales L3)",
    "liquid_tau": "[4] M14 time constant τ per branch",
    "liquid_rk4": "M14 fraction of updates integrated with RK4",
    "atom_utilisation": "L4 fraction of atoms the online distributions use",
    "entropy": "mean entropy of the online distributions",
    "entropy_coef": "L4 entropy coefficient after the utilisation ramp",
    "priority_mean": "L8 mean per-sample priority of the batch",
    "priority_max": "L8 largest per-sample priority of the batch",
    "is_weight_mean": "L8 mean importance-sampling weight of the batch",
    "td_target_mean": "mean scalar TD target of the batch",
    "end_atom_mass": "L7 mean projected target mass on the two end atoms (clipped coverage)",
    # iteration (acting and replay)
    "learning": "fraction of iterations whose learner ran (replay warm)",
    "reward_mean": "mean per-bar reward of the rollouts",
    "reward_std_ema": "L5 EMA of the std of the n-step rewards written to replay",
    "episodes_done": "episodes finished per iteration",
    "episode_return_sum": "sum of the finished episodes' returns per iteration",
    "position_abs_mean": "mean |position| held over the rollouts",
    "traded_mean": "mean notional traded per bar",
    "selectivity_mean": "M12 mean selectivity of the acting decisions",
    "replay_size": "items in replay",
}
"""Iteration metrics from the agent (means over the epoch's iterations; ``[S, ...]`` per seed)."""

HOST: dict[str, str] = {
    "epoch": "epochs completed, from 1 (the TensorBoard step)",
    "wall_time": "seconds of training so far (summed over resumed processes)",
    "lr": "O2 SGDR learning rate of the epoch",
    "restart": "O2 an SGDR cycle restarted at this epoch (O3 moment scaling applied)",
    "kappa": "A1 temperature factor κ of the epoch's training exploration",
    "eval_q_std": "[S] M14 EMA of the validation Q spread (host input of the dynamics)",
    "plateau_epochs": "O5 consecutive epochs on which a plateau detector fired",
    "detector": "O5 detector that fired: none, q_gap, sharpe or both",
    "frozen": "[4] O5 branch's Q-gap velocity below ε",
    "q_gap_velocity": "[4] O5 change of the seed-mean Q-gap EMA since the last epoch",
    "action": "O5 decision: none, reset_branches (O4) or rewind (O6)",
    "rewinds": "O6 rewinds so far",
    "branch_resets": "O4 branch moment resets so far",
    "fault_events": "epochs rerun after non-finite loss or parameters so far",
    "checkpoints": "checkpoints kept after this epoch's save",
    "best_epoch": "epoch of the best checkpoint by validation Sharpe so far",
    "env_steps_per_s": "environment steps per second of the epoch (all envs and seeds)",
    "updates_per_s": "learner updates per second of the epoch",
}
"""Fields the epoch loop adds (host side)."""

VALIDATION: dict[str, str] = {
    "val_sharpe": "annualised Sharpe ratio of the validation walk (the checkpoint metric)",
    "val_sortino": "annualised Sortino ratio",
    "val_max_drawdown": "maximum drawdown (≤ 0)",
    "val_annual_return": "annualised return",
    "val_annual_volatility": "annualised volatility",
    "val_calmar": "Calmar ratio, annual return / |max drawdown|",
    "val_hit_rate": "fraction of the non-zero-return bars that gained",
    "val_turnover": "mean notional traded per bar, a fraction of equity",
    "val_annual_turnover": "turnover × bars per year",
    "val_exposure": "mean gross position fraction |position|",
}
"""The validation walk's performance metrics, seed mean."""

POPULATION: dict[str, str] = {
    "val_sharpe_seeds": "[S] validation Sharpe of each seed",
}
"""Only with ``S > 1`` seeds."""

GROUPS: dict[str, dict[str, str]] = {
    "agent": AGENT,
    "host": HOST,
    "validation": VALIDATION,
    "population": POPULATION,
}
METRICS: dict[str, str] = {name: doc for group in GROUPS.values() for name, doc in group.items()}
"""Every name of the epoch record → its one-line meaning."""

LOSS_PARTS: tuple[str, ...] = tuple(name for name in AGENT if name.startswith("loss"))
"""The total loss and its terms."""


def require(*names: str) -> tuple[str, ...]:
    """``names``, checked to be registered (a module naming a metric calls this on import).

    Raises:
      KeyError: a name that is not in :data:`METRICS`.
    """
    unknown = [n for n in names if n not in METRICS]
    if unknown:
        raise KeyError(f"not metric names of the epoch record: {', '.join(unknown)}")
    return names
