"""The training program's epoch loop (host side; O2–O6, E3).

Per epoch: ``iterations_per_epoch`` calls of the jitted iteration → fault check → deterministic
validation walk of every seed (A1 with a fixed key) → O5 plateau detection → O4 branch-moment
reset at the threshold / O6 rewind to the best checkpoint at threshold + 3 → checkpoint → log.
The learning rate of each epoch (O2 SGDR) and O3's moment scaling at each restart are written
into the optimiser state before the epoch's iterations; nothing here recompiles the iteration.
After the last epoch the best checkpoint (by mean val Sharpe) is walked once on test.

The train state always carries a leading seed axis ``S = train.num_seeds`` (independent agents,
keys split from the run seed). Everything that decides the future — the train state and the
:class:`HostState` (epoch, schedule position, plateau counters, best metric, fault counters) —
is in every checkpoint, so a resumed run continues bit-exactly.
"""

from __future__ import annotations

import dataclasses
import math
import signal
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from jaxdqn import config as config_lib
from jaxdqn.agent import iteration, optim
from jaxdqn.agent import state as train_state
from jaxdqn.agent.build import build_agent, make_init
from jaxdqn.config import Config
from jaxdqn.evaluation import baselines
from jaxdqn.evaluation import walk as evaluate
from jaxdqn.market import market as market_setup
from jaxdqn.program import checkpoint, plateau, report
from jaxdqn.program import logger as logger_lib

__all__ = ["HostState", "Trainer", "TrainingError", "choose_run_dir"]


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. repeated non-finite losses); one-line message."""


@dataclasses.dataclass
class HostState:
    """Host-side loop state saved with every checkpoint (JSON)."""

    epoch: int = 0  # next epoch to run
    iteration: int = 0  # iterations already run in that epoch (an interrupted epoch)
    total_iterations: int = 0  # monotonic; the checkpoint step
    cycle_start: int = 0  # epoch at which the current SGDR cycle began
    best_sharpe: float = -math.inf
    best_epoch: int = -1
    best_step: int = -1
    rewinds: int = 0
    resets: int = 0
    consecutive_faults: int = 0
    fault_events: int = 0
    eval_q_std_ema: list[float] | None = None
    plateau: dict[str, Any] = dataclasses.field(default_factory=dict)
    partial: dict[str, Any] | None = None  # per-iteration metrics of an interrupted epoch
    wall_time: float = 0.0

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["best_sharpe"] = None if not math.isfinite(self.best_sharpe) else self.best_sharpe
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> HostState:
        d = dict(d)
        d["best_sharpe"] = -math.inf if d.get("best_sharpe") is None else d["best_sharpe"]
        return cls(**d)


def choose_run_dir(run_dir: str | None, root: str = "runs") -> Path:
    """A new run directory: ``run_dir`` if it does not exist (or is empty), else an error;
    without a name, ``runs/<timestamp>`` with a numeric suffix if that is taken."""
    if run_dir is not None:
        p = Path(run_dir)
        if p.exists() and (not p.is_dir() or any(p.iterdir())):
            raise config_lib.ConfigError(
                f"--run-dir {p}: already exists and is not empty (use --resume {p} to continue "
                "it, or choose another name)"
            )
        return p
    base = Path(root) / time.strftime("%Y%m%d-%H%M%S")
    p, k = base, 1
    while p.exists():
        p = base.with_name(f"{base.name}-{k}")
        k += 1
    return p


def kept_after_save(ckpt, step: int, metric: float, tc) -> int:
    """Checkpoints on disk once ``step`` is saved: the latest ``keep_latest`` ∪ the best
    ``keep_best`` by metric (non-finite ranks worst), as the checkpointer retains them."""
    metrics = {**ckpt.metrics(), step: metric}
    steps = sorted(metrics)
    latest = set(steps[-tc.keep_latest :])
    ranked = sorted(steps, key=lambda k: (checkpoint.score(metrics[k]), k), reverse=True)
    return len(latest | set(ranked[: tc.keep_best]))


def _stack(records: list[dict[str, jax.Array]]) -> dict[str, jax.Array]:
    return jax.tree.map(lambda *xs: jnp.stack(xs), *records)


def _epoch_means(stacked: dict[str, np.ndarray]) -> dict[str, Any]:
    """Means over the epoch's iterations (axis 0), ignoring warm-up NaNs; seed axis kept."""
    out = {}
    for k, v in stacked.items():
        v = np.asarray(v, np.float64)
        with np.errstate(all="ignore"):
            finite = np.isfinite(v)
            s = np.where(finite, v, 0.0).sum(axis=0)
            c = finite.sum(axis=0)
            out[k] = np.where(c > 0, s / np.maximum(c, 1), np.nan)
    return out


def _jsonable(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, (np.floating, np.integer, np.bool_)):
        return x.item()
    return x


class Trainer:
    """One training run in ``run_dir`` (new, or resumed from its latest checkpoint).

    Args:
      cfg: the run's config.
      run_dir: its directory (created; see :func:`choose_run_dir`).
      resume: continue from the latest checkpoint in ``run_dir``.
      progress: a rich bar on a terminal (plain lines otherwise); False: always plain lines.
    """

    def __init__(self, cfg: Config, run_dir: Path, *, resume: bool = False, progress: bool = True):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.resume = resume
        self.progress = progress
        self._stop = False
        self.prepared = market_setup.prepare(cfg)
        p = self.prepared
        self.agent = build_agent(cfg, p)
        self.num_seeds = cfg.train.num_seeds
        self.iterate = iteration.make_iteration(self.agent, num_seeds=self.num_seeds)
        # One jitted initialiser: also the restore template of run, finish and evaluate.
        self._init = make_init(self.agent, num_seeds=self.num_seeds)
        self.policy = self.agent.acting.eval_policy
        vlo, vhi = p.eval_range("val")
        model, env_params = self.agent.model, p.env_params
        self._spread = jax.jit(
            jax.vmap(
                lambda params, vmin, dz: evaluate.value_spread(
                    model, params, p.market, env_params, vlo, vhi, vmin, dz
                )
            )
        )

    # ----------------------------------------------------------------------------- state
    def seed_keys(self) -> jax.Array:
        """``[S, 2]`` keys split from the run seed (seed s always gets the same key)."""
        return jax.random.split(jax.random.PRNGKey(self.cfg.seed), self.num_seeds)

    def init_state(self) -> train_state.TrainState:
        return self._init(self.prepared.market, self.seed_keys())

    @staticmethod
    def fold_key(state: train_state.TrainState, salt: int) -> train_state.TrainState:
        return state.replace(key=jax.vmap(lambda k: jax.random.fold_in(k, salt))(state.key))

    def seed_params(self, state: train_state.TrainState, s: int):
        """``(params, v_min, Δz, readiness)`` of seed ``s`` for the evaluation policy."""
        take = lambda x: x[s]
        v_min, dz = self.agent.dynamics.grid(jax.tree.map(take, state.dynamics))
        return (
            jax.tree.map(take, state.params),
            v_min,
            dz,
            state.dynamics.iqn_readiness[s],
        )

    # ------------------------------------------------------------------------ evaluation
    def walk(self, state, split: str, s: int) -> evaluate.EvalResult:
        p = self.prepared
        lo, hi = p.eval_range(split)
        return evaluate.walk(
            p.market,
            p.env_params,
            lo,
            hi,
            self.policy,
            jax.random.PRNGKey(self.cfg.eval.key),
            p.dates,
            periods_per_year=self.cfg.eval.periods_per_year,
            policy_params=self.seed_params(state, s),
        )

    def validate(self, state) -> tuple[list[evaluate.EvalResult], np.ndarray]:
        results = [self.walk(state, "val", s) for s in range(self.num_seeds)]
        v_min, dz = self.agent.dynamics.grid(state.dynamics)  # [S] each
        spread = np.asarray(self._spread(state.params, v_min, dz))
        return results, spread

    # ------------------------------------------------------------------------- schedule
    def schedule(self, state, host: HostState) -> tuple[Any, float, bool]:
        """O2 learning rate (+ O3 at a restart) and the A2 readiness for ``host.epoch``."""
        oc, ac = self.cfg.optim, self.cfg.acting
        cycle_epoch = host.epoch - host.cycle_start
        lr = optim.sgdr_learning_rate(cycle_epoch, oc.lr, oc.sgdr_period, oc.sgdr_floor)
        restart = optim.is_restart(cycle_epoch, oc.sgdr_period) and host.iteration == 0
        opt_state = state.opt_state
        if restart:
            opt_state = jax.vmap(lambda o: optim.scale_adam_moments(o, oc.restart_moment_scale))(
                opt_state
            )
        opt_state = jax.vmap(lambda o: optim.set_learning_rate(o, lr))(opt_state)
        r0 = ac.iqn_readiness
        readiness = min(1.0, r0 + (1.0 - r0) * host.epoch / ac.iqn_readiness_epochs)
        eval_std = host.eval_q_std_ema if host.eval_q_std_ema else [0.0] * self.num_seeds
        state = state.replace(opt_state=opt_state)
        dynamics = self.agent.dynamics.set_host_inputs(
            state.dynamics,
            iqn_readiness=np.full(self.num_seeds, readiness, np.float32),
            eval_q_std_ema=np.asarray(eval_std, np.float32),
        )
        state = state.replace(dynamics=dynamics)
        return state, lr, restart

    # ----------------------------------------------------------------------------- run
    def _on_sigint(self, signum, frame):
        self._stop = True

    def run(self) -> dict[str, Any]:
        cfg, tc = self.cfg, self.cfg.train
        self.run_dir.mkdir(parents=True, exist_ok=True)
        ckpt = checkpoint.Checkpointer(
            self.run_dir / "checkpoints", keep_latest=tc.keep_latest, keep_best=tc.keep_best
        )
        log = logger_lib.RunLogger(self.run_dir, num_seeds=self.num_seeds)
        self.log = log
        state = self.init_state()
        if self.resume:
            state, host_json, step = ckpt.restore("latest", state)
            host = HostState.from_json(host_json)
            dropped = log.truncate_after(host.epoch)
            log.note(
                f"resumed from checkpoint {step} (epoch {host.epoch}, iteration "
                f"{host.iteration}); dropped {dropped} later log records"
            )
        else:
            (self.run_dir / "config.yaml").write_text(config_lib.dump(cfg))
            host = HostState()
            ckpt.save(0, state, host.to_json(), math.nan)
        plateau_state = (
            plateau.PlateauState.from_dict(host.plateau)
            if host.plateau
            else (plateau.PlateauState())
        )
        start_wall = time.time() - host.wall_time
        previous = signal.signal(signal.SIGINT, self._on_sigint)
        interrupted = False
        try:
            # progress=False still prints one plain line per epoch (no rich bar).
            with logger_lib.Progress(
                tc.epochs,
                start_epoch=host.epoch,
                force_terminal=None if self.progress else False,
            ) as bar:
                while host.epoch < tc.epochs:
                    state, host, plateau_state, record = self.run_epoch(
                        state, host, plateau_state, ckpt, start_wall
                    )
                    if record is None:  # interrupted inside the epoch
                        interrupted = True
                        break
                    if record.get("fault"):
                        continue
                    bar.update(record)
        finally:
            signal.signal(signal.SIGINT, previous)
        if interrupted or self._stop:  # a SIGINT after the last iteration: every epoch saved
            ckpt.close()
            log.close()
            raise KeyboardInterrupt
        summary = self.finish(ckpt, host, start_wall)
        ckpt.close()
        log.close()
        return summary

    def run_epoch(self, state, host: HostState, plateau_state, ckpt, start_wall):
        cfg, tc = self.cfg, self.cfg.train
        state, lr, restart = self.schedule(state, host)
        t0 = time.time()
        records = []
        done_before = host.iteration
        # Per-iteration metrics of an interrupted epoch's first part (from its checkpoint).
        earlier = {k: np.asarray(v) for k, v in (host.partial or {}).items()}

        def epoch_metrics() -> dict[str, np.ndarray]:
            now = jax.device_get(_stack(records)) if records else {}
            if not earlier:
                return now
            if not now:
                return earlier
            return {k: np.concatenate([earlier[k], np.asarray(v)]) for k, v in now.items()}

        for i in range(host.iteration, tc.iterations_per_epoch):
            state, metrics = self.iterate(state, self.prepared.market)
            records.append(metrics)
            if self._stop:
                host.iteration = i + 1
                host.total_iterations += i + 1 - done_before
                host.partial = {k: _jsonable(v) for k, v in epoch_metrics().items()}
                host.wall_time = time.time() - start_wall
                ckpt.save(host.total_iterations, state, host.to_json(), math.nan)
                return state, host, plateau_state, None
        stacked = epoch_metrics()
        elapsed = time.time() - t0
        run_iters = tc.iterations_per_epoch - done_before
        host.total_iterations += run_iters
        host.iteration = 0
        host.partial = None

        finite = bool(np.all(stacked["finite"])) if stacked else True
        if not finite:
            return self.recover(state, host, plateau_state, ckpt, start_wall)
        host.consecutive_faults = 0
        means = _epoch_means(stacked)

        results, spread = self.validate(state)
        val = {k: float(np.nanmean([r.metrics[k] for r in results])) for k in results[0].metrics}
        val_sharpe = float(np.mean([r.metrics["sharpe"] for r in results]))
        host.eval_q_std_ema = self.agent.dynamics.next_eval_q_std(host.eval_q_std_ema, spread)

        q_gap = np.asarray(jax.device_get(state.dynamics.q_gap)).mean(axis=0)
        plateau_state, rep = plateau.observe(plateau_state, val_sharpe, tuple(q_gap), tc)
        done = host.epoch + 1
        if rep.action == "reset_branches":
            state = state.replace(opt_state=jax.vmap(optim.reset_branch_moments)(state.opt_state))
            host.resets += 1
            self.log.note(f"epoch {done}: plateau ({rep.fired}); branch Adam moments reset (O4)")
        elif rep.action == "rewind":
            state = self.rewind(state, host, ckpt)
            plateau_state = plateau.after_rewind(plateau_state)
            self.log.note(
                f"epoch {done}: plateau ({rep.fired}); rewound to the best checkpoint (epoch "
                f"{host.best_epoch}), folded a new key, restarted the LR cycle (O6)"
            )
        host.epoch = done
        host.plateau = plateau_state.to_dict()
        # After a rewind the state saved below is the restored best one, not the state that was
        # validated: its checkpoint carries no metric (NaN never ranks as best).
        rewound = rep.action == "rewind"
        metric = checkpoint.score(val_sharpe)
        if not rewound and (metric > host.best_sharpe or host.best_epoch < 0):
            host.best_sharpe, host.best_epoch = metric, host.epoch
            host.best_step = host.total_iterations
        host.wall_time = time.time() - start_wall
        saved_metric = math.nan if rewound else val_sharpe

        ac = cfg.acting
        record: dict[str, Any] = {"epoch": host.epoch, "wall_time": host.wall_time}
        record.update(
            {
                k: _jsonable(np.squeeze(v, 0) if self.num_seeds == 1 else v)
                for k, v in means.items()
                if k != "finite"
            }
        )
        record.update({f"val_{k}": v for k, v in val.items()})
        if self.num_seeds > 1:
            record["val_sharpe_seeds"] = [r.metrics["sharpe"] for r in results]
        record.update(
            lr=lr,
            restart=restart,
            eval_q_std=host.eval_q_std_ema,
            plateau_epochs=rep.plateau_epochs,
            detector=rep.fired,
            frozen=list(rep.frozen),
            q_gap_velocity=list(rep.velocity),
            action=rep.action,
            rewinds=host.rewinds,
            branch_resets=host.resets,
            fault_events=host.fault_events,
            checkpoints=kept_after_save(ckpt, host.total_iterations, saved_metric, tc),
            best_epoch=host.best_epoch,
            env_steps_per_s=run_iters * ac.steps * ac.num_envs * self.num_seeds / elapsed,
            updates_per_s=float(np.nansum(stacked["learning"][-run_iters:]))
            * cfg.optim.updates
            / elapsed
            if stacked
            else 0.0,
        )
        # The log line goes first: a run killed between the two resumes from the previous
        # checkpoint, drops this line (truncate_after) and writes it again identically.
        self.log.log_epoch(record)
        ckpt.save(host.total_iterations, state, host.to_json(), saved_metric)
        return state, host, plateau_state, record

    def rewind(self, state, host: HostState, ckpt) -> Any:
        """O6: restore the best checkpoint's train state, fold a new key, restart the LR
        cycle at the next epoch."""
        best, _, _ = ckpt.restore("best", state)
        host.rewinds += 1
        host.cycle_start = host.epoch + 1
        return self.fold_key(best, 1_000 + host.rewinds)

    def recover(self, state, host: HostState, plateau_state, ckpt, start_wall):
        """Non-finite loss or parameters: the state is dropped (never checkpointed); restore
        the last good checkpoint, fold a new key, run the epoch again."""
        host.consecutive_faults += 1
        host.fault_events += 1
        if host.consecutive_faults >= self.cfg.train.max_faults:
            raise TrainingError(
                f"non-finite loss or parameters in {host.consecutive_faults} consecutive epochs "
                f"(last at epoch {host.epoch}); stopping. Lower optim.lr or check the data."
            )
        good, good_host, step = ckpt.restore("latest", state)
        restored = HostState.from_json(good_host)
        # Keep the fault counters and the step counter; everything else comes from the good
        # checkpoint.
        restored.consecutive_faults = host.consecutive_faults
        restored.fault_events = host.fault_events
        restored.total_iterations = host.total_iterations
        state = self.fold_key(good, 10_000 + host.fault_events)
        self.log.note(
            f"non-finite loss or parameters in epoch {host.epoch + 1}; restored checkpoint "
            f"{step}, folded a new key (fault {host.consecutive_faults}/"
            f"{self.cfg.train.max_faults} in a row)"
        )
        pstate = (
            plateau.PlateauState.from_dict(restored.plateau) if restored.plateau else plateau_state
        )
        fault = {"epoch": restored.epoch, "fault": True, "fault_events": host.fault_events}
        return state, restored, pstate, fault

    # ---------------------------------------------------------------------------- finish
    def finish(self, ckpt, host: HostState, start_wall: float) -> dict[str, Any]:
        """Walk the best checkpoint on val and test once; baselines; summary; report."""
        cfg = self.cfg
        template = self.init_state()
        best, best_host, best_step = ckpt.restore("best", template)
        logs: dict[str, list[pd.DataFrame]] = {"val": [], "test": []}
        per_seed = []
        for s in range(self.num_seeds):
            seed_metrics = {}
            for split in ("val", "test"):
                res = self.walk(best, split, s)
                logs[split].append(res.log)
                seed_metrics[split] = res.metrics
            per_seed.append({"seed": s, **seed_metrics})
        for split, frames in logs.items():
            report.write_eval_log(self.run_dir / f"eval_{split}.csv", frames)
        base_logs: dict[tuple[str, str], pd.DataFrame] = {}
        table = baselines.run_baselines(cfg, self.prepared, logs=base_logs)
        base_summary = {
            name: {
                split: {k: float(v) for k, v in table.loc[name, split].items()}
                for split in ("val", "test")
            }
            for name in table.index
        }
        test_dates = logs["test"][0]["date"]
        report.write_baseline_equity(
            self.run_dir / "baselines_test.csv",
            test_dates,
            {name: base_logs[(name, "test")]["equity"].to_numpy() for name in table.index},
        )
        mean = lambda split: {
            k: float(np.nanmean([m[split][k] for m in per_seed])) for k in per_seed[0][split]
        }
        summary = {
            "best_epoch": HostState.from_json(best_host).epoch,
            "best_step": best_step,
            "val": mean("val"),
            "test": mean("test"),
            "baselines": base_summary,
            "wall_time_s": time.time() - start_wall,
            "epochs": host.epoch,
            "rewinds": host.rewinds,
            "fault_events": host.fault_events,
        }
        if self.num_seeds > 1:
            summary["seeds"] = per_seed
        report.write_summary(self.run_dir, summary)
        report.write_report(self.run_dir)
        return summary
