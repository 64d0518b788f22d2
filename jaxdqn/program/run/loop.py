"""The training program's epoch loop (host side; O2–O6, E3).

Per epoch: schedule (O2 learning rate, O3 restart, A2 readiness: :mod:`.schedule`) →
``iterations_per_epoch`` calls of the jitted iteration → fault check → deterministic validation
walk of every seed (A1: :mod:`.walks`) → O5 plateau detection (:mod:`.plateau`) → O4
branch-moment reset at the threshold / O6 rewind to the best checkpoint at threshold + 3 → log
line (:mod:`.epoch_log`) → checkpoint; nothing recompiles the iteration. Then :mod:`.finish`.

The train state always carries a leading seed axis ``S = train.num_seeds`` (independent agents,
keys split from the run seed). Everything that decides the future — the train state and the
:class:`.run_state.RunState` — is in every checkpoint, so a resumed run continues bit-exactly.
"""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxdqn.agent import optim
from jaxdqn.agent.build import build_agent
from jaxdqn.agent.state import TrainState, fold_keys
from jaxdqn.config import Config
from jaxdqn.config.members import agent_configs, ranked_members
from jaxdqn.evaluation import metrics as metrics_lib
from jaxdqn.market import market as market_lib
from jaxdqn.program.checkpoints import checkpoint
from jaxdqn.program.records import logger as logger_lib
from jaxdqn.program.run import plateau
from jaxdqn.program.run.epoch_log import EpochMetrics, epoch_means, epoch_record, member_means
from jaxdqn.program.run.finish import finish
from jaxdqn.program.run.placement import place
from jaxdqn.program.run.progress import Progress
from jaxdqn.program.run.recovery import FAULT_SALT, REWIND_SALT, Stopped, TrainingError, recover
from jaxdqn.program.run.run_state import RunState
from jaxdqn.program.run.schedule import apply_schedule, schedule
from jaxdqn.program.run.walks import make_validate

__all__ = ["FAULT_SALT", "REWIND_SALT", "Stopped", "Trainer", "TrainingError"]


class Trainer:
    """One training run in ``run_dir`` (new, or resumed from its latest checkpoint).

    Args:
      cfg: the run's config.
      run_dir: its directory (created if missing).
      resume: continue from the latest checkpoint in ``run_dir``.
      progress: a rich bar on a terminal (plain lines otherwise); False: always plain lines.

    ``on_epoch(record) -> bool`` (settable; never by default) sees every epoch's log record
    after its checkpoint is saved; True stops the run there (:class:`Stopped`, unfinished).
    """

    on_epoch: Callable[[dict[str, Any]], bool] = staticmethod(lambda record: False)

    def __init__(self, cfg: Config, run_dir: Path, *, resume: bool = False, progress: bool = True):
        self.cfg, self.run_dir, self.resume, self.progress = cfg, Path(run_dir), resume, progress
        self._stop = False
        self.prepared = market_lib.prepare(cfg)
        self.agent = build_agent(cfg, self.prepared)
        # a population's config per agent (None: cfg for all) and members ranked one by one
        self.agent_cfgs, self.members = agent_configs(cfg), ranked_members(cfg)
        # train.mesh's devices, the iteration, the initialiser (first state, restore template)
        self.placed = place(cfg, self.prepared, self.agent)
        self.iterate, self.num_seeds = self.placed.iterate, self.placed.layout.num_seeds
        self.validate = make_validate(self.agent, self.prepared, cfg.eval, self.num_seeds)

    def init_state(self) -> TrainState:
        """The initial ``[P, ...]`` state; seed ``s`` gets split ``s`` of the run seed's key."""
        return self.placed.fresh(self.cfg.seed, self.cfg.train.num_seeds)

    def _on_sigint(self, signum, frame):
        self._stop = True

    def run(self) -> dict[str, Any]:
        """Train to ``train.epochs`` and finish; returns the summary. SIGINT: the current
        iteration completes, a checkpoint is saved and ``KeyboardInterrupt`` is raised."""
        tc = self.cfg.train
        self.run_dir.mkdir(parents=True, exist_ok=True)
        keep = {"keep_latest": tc.keep_latest, "keep_best": tc.keep_best, "members": self.members}
        self.ckpt = checkpoint.Checkpointer(self.run_dir / "checkpoints", **keep)
        self.log = logger_lib.open_run_log(self.run_dir, self.num_seeds, write=self.placed.primary)
        state = self.init_state()
        if self.resume:
            state, host_json, step = self.ckpt.restore("latest", state)
            run = RunState.from_json(host_json)
            dropped = self.log.truncate_after(run.epoch)
            self.log.note(
                f"resumed from checkpoint {step} (epoch {run.epoch}, iteration "
                f"{run.iteration}); dropped {dropped} later log records"
            )
            logger_lib.write_config(self.log, self.run_dir, self.cfg, resumed=True)
        else:
            logger_lib.write_config(self.log, self.run_dir, self.cfg, resumed=False)
            for line in self.prepared.notes():
                self.log.note(line)
            self.log.note(
                f"reward scale {self.agent.reward_scale:.6g} ({self.cfg.loss.reward_scale}); "
                f"reward unit {self.agent.reward_unit:.6g} in Q (every Q threshold is relative "
                f"to it); {self.placed.layout.describe()}"
            )
            run = RunState()
            self.ckpt.save(0, state, run.to_json(), math.nan)
        self._start_wall = time.time() - run.wall_time
        previous = signal.signal(signal.SIGINT, self._on_sigint)
        stopped = None  # "sigint" inside an epoch, or "on_epoch" after one
        try:
            # progress=False still prints one plain line per epoch (no rich bar); process 0 only.
            shown = dict(
                enabled=self.placed.primary, force_terminal=None if self.progress else False
            )
            with Progress(tc.epochs, start_epoch=run.epoch, **shown) as bar:
                while run.epoch < tc.epochs:
                    state, run, record = self.run_epoch(state, run)
                    if record is None:  # interrupted inside the epoch
                        stopped = "sigint"
                        break
                    if not record.get("fault"):
                        bar.update(record)
                        if self.on_epoch(record):
                            stopped = "on_epoch"
                            break
        finally:
            signal.signal(signal.SIGINT, previous)
        try:
            if stopped == "sigint" or self._stop:  # a SIGINT after the last iteration: all saved
                raise KeyboardInterrupt
            if stopped:
                raise Stopped(f"stopped by on_epoch after epoch {run.epoch} of {tc.epochs}")
            template = self.init_state()
            args = (self.prepared, self.agent, self.ckpt, template, run, self.run_dir)
            return finish(self.cfg, *args, self._start_wall, placed=self.placed)
        finally:
            self.ckpt.close()
            self.log.close()

    def run_epoch(self, state: TrainState, run: RunState):
        """One epoch; returns ``(state, run, record)`` with the epoch's log line as
        ``record``, ``None`` when interrupted, or a fault record after a recovery."""
        cfg, tc = self.cfg, self.cfg.train
        at, ema = (run.epoch, run.cycle_start, run.iteration), run.eval_q_std_ema
        sched = schedule(*at, cfg.optim, cfg.acting, self.agent_cfgs)
        state = self.placed.put(apply_schedule(state, sched, self.agent.dynamics, ema))
        t0 = time.time()
        done_before = run.iteration
        metrics = EpochMetrics(run.partial)
        for i in range(run.iteration, tc.iterations_per_epoch):
            state, m = self.iterate(state, self.placed.market)
            metrics.append(m)
            if self._stop:
                run.iteration = i + 1
                run.total_iterations += i + 1 - done_before
                run.partial = metrics.to_json()
                run.wall_time = time.time() - self._start_wall
                self.ckpt.save(run.total_iterations, state, run.to_json(), math.nan)
                return state, run, None
        stacked = metrics.stacked()
        elapsed = time.time() - t0
        run_iters = tc.iterations_per_epoch - done_before
        run.total_iterations += run_iters
        run.iteration, run.partial = 0, None
        if stacked and not np.all(stacked["finite"]):
            return recover(state, run, cfg=cfg, ckpt=self.ckpt, log=self.log)
        run.consecutive_faults = 0

        view = self.placed.view(state)  # (on every process: the walks decide the future)
        results, spread = self.validate(view)
        val_sharpe = float(np.mean([r.metrics["sharpe"] for r in results]))
        run.eval_q_std_ema = self.agent.dynamics.next_eval_q_std(run.eval_q_std_ema, spread)
        q_gap = np.asarray(jax.device_get(view.dynamics.q_gap)).mean(axis=0)
        se = metrics_lib.sharpe_se(val_sharpe, len(results[0].log), self.prepared.bars_per_year)
        run.plateau, rep = plateau.observe(run.plateau, val_sharpe, tuple(q_gap), tc, sharpe_se=se)
        done = run.epoch + 1
        if rep.action == "reset_branches":
            state = state.replace(opt_state=jax.vmap(optim.reset_branch_moments)(state.opt_state))
            self.log.note(f"epoch {done}: plateau ({rep.fired}); branch Adam moments reset (O4)")
        elif rep.action == "rewind":
            state = self.rewind(state, run)
            self.log.note(
                f"epoch {done}: plateau ({rep.fired}); rewound to the best checkpoint (epoch "
                f"{run.best_epoch}), folded a new key, restarted the LR cycle (O6)"
            )
        run.epoch = done
        # After a rewind the state saved is the restored best one, not the one validated: its
        # checkpoint carries no metric (NaN never ranks as best).
        rewound = rep.action == "rewind"
        metric = checkpoint.score(val_sharpe)
        if not rewound and (metric > run.best_sharpe or run.best_epoch < 0):
            run.best_sharpe, run.best_epoch, run.best_step = metric, done, run.total_iterations
        run.wall_time = time.time() - self._start_wall
        saved_metric = math.nan if rewound else val_sharpe
        saved_members = member_means(results, self.members, blank=rewound)
        kept = self.ckpt.kept_after(run.total_iterations, saved_metric, saved_members)
        env_steps = run_iters * cfg.acting.steps * cfg.acting.num_envs * self.num_seeds
        learned = float(np.nansum(stacked["learning"][-run_iters:])) if stacked else 0.0
        record = epoch_record(
            run,
            epoch_means(stacked),
            results,
            sched,
            rep,
            checkpoints=len(kept),
            best_epoch=run.best_epoch,
            env_steps_per_s=env_steps / elapsed,
            updates_per_s=learned * cfg.optim.updates / elapsed,
        )
        # The log line goes first: a run killed between the two resumes from the previous
        # checkpoint, drops this line (truncate_after) and writes it again identically.
        self.log.log_epoch(record)
        self.ckpt.save(run.total_iterations, state, run.to_json(), saved_metric, saved_members)
        return state, run, record

    def rewind(self, state: TrainState, run: RunState) -> TrainState:
        """O6: restore the best checkpoint's train state, fold a new key, restart the LR
        cycle at the next epoch."""
        best, _, _ = self.ckpt.restore("best", state)
        run.plateau = plateau.after_rewind(run.plateau)
        run.cycle_start = run.epoch + 1
        return fold_keys(best, REWIND_SALT + run.rewinds)
