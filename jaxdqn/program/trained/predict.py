"""What a trained agent does after a given bar (what ``python -m jaxdqn.predict`` runs).

:func:`jaxdqn.program.trained.load.load_run` restores a run's checkpoint with the run's own market
(its config's data: the splits, the per-instrument feature normalisers and the reward unit its walks
used). :func:`predict` then takes, for every instrument and seed, the decision after the last bar on
or before ``at`` of the bars given (the run's own, or a file or panel directory with more bars):

1. the bars after ``at`` are cut off before anything is computed (no look-ahead by
   construction);
2. the causal features of those bars are normalised with the run's statistics of that
   instrument (:func:`jaxdqn.market.features.normalise`), the market built as the walks' is;
3. the walk that starts flat at the first decision of the run's split holding the decision bar
   (test from its first bar on, and every later bar, e.g. new ones) is replayed to that bar
   and decides there (:func:`jaxdqn.evaluation.prediction.decide_after`, the walk's own step and
   decision path). For every bar of a split that the run walked, the decision is the walk's
   (``eval_<split>.csv``'s row with ``t`` = that bar).

Refused with a :class:`~jaxdqn.market.errors.DataError` (one line, exit code 2): bars whose
columns (close-only, volume) or bar clock differ from the run's, too few bars before ``at`` for
the observation window, a last bar on or before ``at`` older than the longest gap between bars
of the run's train split, an instrument the run did not train on. A run directory without a
usable checkpoint is a ConfigError or CheckpointError.
"""

from __future__ import annotations

import datetime
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from jaxdqn.branches import ACTION_NAMES, BRANCHES
from jaxdqn.config import ConfigError
from jaxdqn.config.members import population_size
from jaxdqn.market import clock as clock_lib
from jaxdqn.market import data as data_lib
from jaxdqn.market import features as features_lib
from jaxdqn.market.decisions import check_one_frequency
from jaxdqn.market.errors import DataError
from jaxdqn.program.trained.load import InstrumentView, LoadedRun

__all__ = [
    "Decided",
    "Undecidable",
    "decide",
    "make_run_predictor",
    "parse_at",
    "predict",
]

SPLITS_LATEST_FIRST = ("test", "val", "train")
URGENCY_FILL = {0: "the next close", 1: "the next bar's typical price", 2: "the next open"}


def parse_at(text: str | None) -> tuple[pd.Timestamp, pd.Timestamp] | None:
    """``(at, stop)`` of ``--at``: the instant asked about and the first instant after it that
    the bars may not reach (:func:`jaxdqn.config.data_sections.instant_after`: a bare date holds
    its whole day).

    Raises:
      ConfigError: not an ISO date or timestamp.
    """
    from jaxdqn.config.data_sections import instant_after

    if text is None:
        return None
    try:
        at = datetime.datetime.fromisoformat(str(text))
    except ValueError:
        raise ConfigError(
            f"--at: not an ISO date or timestamp (YYYY-MM-DD[THH:MM:SS]): {text!r}"
        ) from None
    return pd.Timestamp(at), pd.Timestamp(instant_after(str(text), at))


class Undecidable(DataError):
    """The bars up to ``--at`` cannot be decided on (none, too few, stale): on a panel the
    instrument is skipped instead of the call."""


def _check_like_run(view: InstrumentView, bars: pd.DataFrame, name: str) -> None:
    """Refuse bars whose columns or bar clock differ from what the run trained on."""
    run_co, run_vol, _ = data_lib.info(view.bars)
    co, vol, _ = data_lib.info(bars)
    if co != run_co:
        kinds = ("open/high/low/close bars", "close-only bars")
        raise DataError(f"{name}: {kinds[co]}, but the run trained on {kinds[run_co]}")
    if vol != run_vol:
        has = ("no volume", "volume")
        raise DataError(f"{name}: bars with {has[vol]}, but the run's bars had {has[run_vol]}")
    check_one_frequency(bars, name)
    index = pd.DatetimeIndex(bars.index)
    lo, hi = view.splits.train
    run_step = float(np.median(np.diff(clock_lib.seconds(view.bars.index[lo:hi]))))
    tail = clock_lib.seconds(index[-1000:])
    if tail.size >= 3:
        step = float(np.median(np.diff(tail)))
        if not 0.5 <= step / run_step <= 2.0:
            raise DataError(
                f"{name}: bars every {clock_lib.spacing_text(step)} (median), but the run's "
                f"train bars came every {clock_lib.spacing_text(run_step)}: another bar clock"
            )


def _cut(
    view: InstrumentView, bars: pd.DataFrame, name: str, at, first_decision: int
) -> pd.DataFrame:
    """``bars`` up to and including the last bar on or before ``at`` (all with ``at`` None)."""
    index = pd.DatetimeIndex(bars.index)
    if at is not None:
        when, stop = at
        n = int(index.searchsorted(stop, side="left"))
        if n == 0:
            raise Undecidable(f"{name}: no bar on or before --at {when.isoformat()}")
        lo, hi = view.splits.train
        run_gap = float(np.max(np.diff(clock_lib.seconds(view.bars.index[lo:hi]))))
        late = (when - index[n - 1]).total_seconds()
        if late > run_gap:
            raise Undecidable(
                f"{name}: the last bar on or before --at {when.isoformat()} is "
                f"{index[n - 1].isoformat()}, {clock_lib.spacing_text(late)} earlier: longer "
                f"than any gap between bars of the run's train split "
                f"({clock_lib.spacing_text(run_gap)}); the bars are stale"
            )
        bars = bars.iloc[:n]
    if len(bars) <= first_decision:
        raise Undecidable(
            f"{name}: {len(bars)} bars up to the decision, too few for the observation window "
            f"(the features' warm-up and the window need {first_decision + 1})"
        )
    return bars


def _walk_start(view: InstrumentView, dates: pd.DatetimeIndex, t: int, first: int):
    """``(t0, split)``: the first decision bar of the run's walk of the split holding bar
    ``t`` (the latest split whose walk starts on or before it), in ``dates``' rows, and the
    split's name (``after test`` for a bar later than the run's last test bar)."""
    run_dates = pd.DatetimeIndex(view.bars.index)
    for split in SPLITS_LATEST_FIRST:
        lo, hi = getattr(view.splits, split)
        start = run_dates[min(max(lo - 1, first), len(run_dates) - 1)]  # eval_range's start
        if start <= dates[t]:
            t0 = max(int(dates.searchsorted(start, side="left")), first)
            after = split == "test" and dates[t] > run_dates[hi - 1]
            return t0, "after test" if after else split
    return first, "train"


def _features(run: LoadedRun, view: InstrumentView, bars: pd.DataFrame, name: str):
    fcfg = run.cfg.features
    raw, sigma = features_lib.raw_features(bars, fcfg)
    names = features_lib.feature_names(fcfg, features_lib.has_volume(bars))
    if names != view.features.names:
        raise DataError(f"{name}: features {names} differ from the run's {view.features.names}")
    warmup = view.features.warmup
    values = features_lib.normalise(raw, view.features.mean, view.features.std, fcfg.clip, warmup)
    return features_lib.Features(
        values, names, warmup, sigma, view.features.mean, view.features.std
    )


class Decided(NamedTuple):
    """One instrument's decision after bar ``t`` (:func:`decide`): ``dates`` its bars' up to
    ``t``, ``t0`` the replayed walk's first decision, ``split`` the run's split holding ``t``,
    ``close`` the last close, ``by_seed`` each seed's
    :class:`~jaxdqn.evaluation.prediction.Prediction` (host arrays)."""

    name: str
    dates: pd.DatetimeIndex
    t: int
    t0: int
    split: str
    close: float
    by_seed: dict[int, Any]


class _Lane(NamedTuple):
    head: Decided  # everything but by_seed (empty)
    bars: pd.DataFrame  # the bars up to t
    features: features_lib.Features


def _lane(run: LoadedRun, view: InstrumentView, bars: pd.DataFrame, at) -> _Lane:
    name = view.name
    _check_like_run(view, bars, name)
    cut = _cut(view, bars, name, at, run.first_decision)
    dates = pd.DatetimeIndex(cut.index)
    t = len(cut) - 1
    t0, split = _walk_start(view, dates, t, run.first_decision)
    head = Decided(name, dates, t, t0, split, float(cut["close"].iloc[-1]), {})
    return _Lane(head, cut, _features(run, view, cut, name))


def _placeholder(run: LoadedRun, view: InstrumentView) -> _Lane:
    """A panel lane for an instrument not decided: its own first decision, dropped after."""
    return _lane(run, view, view.bars.iloc[: run.first_decision + 1], None)


def decide(
    run: LoadedRun,
    bars_by_name: dict[str, pd.DataFrame],
    at: tuple[pd.Timestamp, pd.Timestamp] | None = None,
    seeds: tuple[int, ...] | None = None,
    predictor: Any = None,
) -> tuple[list[Decided], dict[str, str]]:
    """Every instrument's decision after the last bar of its ``bars_by_name`` entry on or
    before ``at`` (the module docstring's steps), for each of ``seeds`` (all when None), and
    the instruments of a panel skipped, with the reason (:class:`Undecidable`).

    On a panel every instrument of the run is one lane of one vmapped program, as in the
    panel's walks (the same batch, so the same bits); an instrument not given or skipped fills
    its lane with its own first decision and is dropped. ``predictor``:
    :func:`make_run_predictor`'s function (made here when None; pass one to decide many dates
    with one compilation).

    Raises:
      DataError: the refusals of the module docstring (on a panel those not skipped, or every
        instrument skipped).
      ConfigError: a seed the run does not have.
    """
    import jax
    import jax.numpy as jnp

    from jaxdqn.evaluation import cost_stress
    from jaxdqn.market import env
    from jaxdqn.program.run.walks import seed_policy_params

    num_seeds = population_size(run.cfg)  # every agent: members × seeds
    seeds = tuple(range(num_seeds)) if seeds is None else tuple(seeds)
    for s in seeds:
        if not 0 <= s < num_seeds:
            raise ConfigError(f"--seed {s}: the run has seeds 0..{num_seeds - 1}")
    predictor = make_run_predictor(run) if predictor is None else predictor
    panel = run.prepared.is_panel
    lanes, skipped = [], {}
    for view in run.views:
        if view.name not in bars_by_name:
            lanes.append(None)
            continue
        try:
            lanes.append(_lane(run, view, bars_by_name[view.name], at))
        except Undecidable as e:
            if not panel:
                raise
            skipped[view.name] = str(e)
            lanes.append(None)
    if not any(lanes):
        raise DataError(f"no instrument can be decided: {'; '.join(skipped.values())}")
    filled = [lane or _placeholder(run, v) for lane, v in zip(lanes, run.views, strict=True)]
    # a row for bar t + 1 (the replay steps its last decision into it), rounded up to a power
    # of two so that every date up to it shares one compiled predictor
    length = 1 << max(max((lane.head.t + 1).bit_length() for lane in filled), 10)
    markets = [
        env.make_market(*_padded(ln.bars, ln.features, length), run.cfg.env) for ln in filled
    ]
    t0s = jnp.asarray([lane.head.t0 for lane in filled], jnp.int32)
    ts = jnp.asarray([lane.head.t for lane in filled], jnp.int32)
    if panel:
        market = jax.tree.map(lambda *x: jnp.stack(x), *markets)
    else:
        (market,), t0s, ts = markets, t0s[0], ts[0]
    _, rate = cost_stress.traced_costs(run.prepared.env_params)
    key = jax.random.PRNGKey(run.cfg.eval.key)
    outs = {}
    for s in seeds:
        # each seed's own (params, v_min, Δz, readiness), sliced as its walks slice them: the
        # support grid of all seeds at once differs from a seed's own in the last bit
        policy = seed_policy_params(run.agent, run.state, s)
        out = jax.device_get(predictor(market, t0s, ts, key, policy, rate))
        outs[s] = (
            [jax.tree.map(lambda x, i=i: x[i], out) for i in range(len(filled))] if panel else [out]
        )
    return [
        lane.head._replace(by_seed={s: outs[s][i] for s in seeds})
        for i, lane in enumerate(lanes)
        if lane is not None
    ], skipped


def predict(
    run: LoadedRun,
    bars_by_name: dict[str, pd.DataFrame],
    at: tuple[pd.Timestamp, pd.Timestamp] | None = None,
    seeds: tuple[int, ...] | None = None,
    predictor: Any = None,
) -> list[dict[str, Any]]:
    """:func:`decide`'s decisions as the rows of ``python -m jaxdqn.predict --json`` (see the
    CLI's docstring), one per instrument and seed; a skipped instrument of a panel gives one
    row ``{"instrument", "skipped": reason}``."""
    decided, skipped = decide(run, bars_by_name, at, seeds, predictor)
    rows = [
        _row(d, s, run, out, run.prepared.env_params)
        for d in decided
        for s, out in d.by_seed.items()
    ]
    return rows + [{"instrument": n, "skipped": why} for n, why in skipped.items()]


def _padded(bars: pd.DataFrame, feats: features_lib.Features, length: int):
    """``bars`` and ``feats`` with their last row repeated up to ``length`` rows: markets of
    every length up to a power of two share one compiled predictor (and the host → device
    copies one shape). Only the dropped step of the replay's last decision reads a copy."""
    rows = np.concatenate([np.arange(len(bars)), np.full(length - len(bars), len(bars) - 1)])
    grown = feats._replace(values=feats.values[rows], sigma=feats.sigma[rows])
    return bars.iloc[rows], grown


def make_run_predictor(run: LoadedRun):
    """The jitted predictor of :func:`decide` for ``run`` (one per process serves every date):
    one instrument's, or on a panel every instrument's lanes vmapped (markets ``[I, L]``, first
    and decision bars ``[I]``)."""
    import jax

    from jaxdqn.evaluation import prediction

    agent = run.agent
    one = prediction.make_predictor(
        agent.model, run.prepared.env_params, agent.acting.eval_policy, jit=False
    )
    if run.prepared.is_panel:
        one = jax.vmap(one, in_axes=(0, 0, 0, None, None, None))
    return jax.jit(one)


def _order_text(order: int, urgency: int, wants: bool, buy: bool, limit: float, held: bool) -> str:
    if not wants:
        return "none (already at the target)"
    side = "buy" if buy else "sell"
    if order == 0:
        return f"market {side} at {URGENCY_FILL[urgency]}" + (" (held: close-only)" if held else "")
    text = f"limit {side} at {limit:.6g} in the next bar"
    return text + (", else market at the next close" if order == 2 else ", else expires")


def _row(d: Decided, seed: int, run: LoadedRun, p: Any, env_params: Any) -> dict[str, Any]:
    action = [int(a) for a in p.action]
    order, urgency = action[2], action[3]
    wants, buy = bool(p.order.wants), bool(p.order.buy)
    q = {
        branch: {
            ACTION_NAMES[branch][a]: {
                "mean": float(p.q_mean[b, a]),
                "q10": float(p.quantiles[b, a, 0]),
                "q50": float(p.quantiles[b, a, 1]),
                "q90": float(p.quantiles[b, a, 2]),
                "acted": float(p.q_acted[b, a]),
            }
            for a in range(3)
        }
        for b, branch in enumerate(BRANCHES)
    }
    return {
        "instrument": d.name,
        "seed": seed,
        "date": d.dates[d.t].isoformat(),
        "t": int(d.t),
        "close": d.close,
        "checkpoint_step": int(run.step),
        "split": d.split,
        "walk_from": d.dates[d.t0].isoformat(),
        "actions": dict(zip(BRANCHES, action, strict=True)),
        "action_names": {b: ACTION_NAMES[b][a] for b, a in zip(BRANCHES, action, strict=True)},
        "target_position": float(p.target_position),
        "scale": float(p.scale),
        "position": float(p.position),
        "equity": float(p.equity),
        "order": {
            "type": ACTION_NAMES["order"][order] if wants else "none",
            "side": ("buy" if buy else "sell") if wants else "none",
            "urgency": ACTION_NAMES["urgency"][urgency],
            "limit_price": float(p.order.limit) if wants and order != 0 else None,
            "shares": float(p.order.delta) * env_params.capital if wants else 0.0,
            "text": _order_text(
                order, urgency, wants, buy, float(p.order.limit), env_params.hold_orders
            ),
        },
        "q": q,
    }
