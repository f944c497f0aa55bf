"""One planning run: source -> demand -> model selection -> forecast -> planner -> state.

The I/O shell around the pure planner. Fail-safe: when the source cannot answer, returns
nothing or its latest bucket is missing, the decision holds the last persisted one (never a
scale-down on missing data), a warning is logged and ``promptedge_forecaster_holds_total``
counts it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace

import numpy as np
from prometheus_client import Counter, Gauge

from forecaster.errors import SourceUnavailable
from forecaster.models.band import bound_upper
from forecaster.models.base import Forecast, clean
from forecaster.models.select import Selection, build_candidates, select
from forecaster.plan import (
    Decision,
    PlannerConfig,
    PlannerState,
    PlanStep,
    advance,
    decide,
    hold,
    horizon_steps,
    lead_steps,
    plan_steps,
)
from forecaster.series import Traffic, demand, mask_outages, trailing_mean, zero_run
from forecaster.settings import ForecasterSettings
from forecaster.sources import Source
from forecaster.state import RedisStateStore

log = logging.getLogger("forecaster")

HOLDS = Counter("promptedge_forecaster_holds", "Runs that held the last decision", ["cause"])
DESIRED = Gauge("promptedge_forecaster_desired_replicas", "Replicas decided by the last run")
HOLDING = Gauge("promptedge_forecaster_holding", "1 when the last run held the last decision (data missing), else 0")
DEMAND = Gauge("promptedge_forecaster_demand", "Demand of the last observed bucket (demand unit per s; NaN: missing)")
FORECAST = Gauge(
    "promptedge_forecaster_forecast",
    "Forecast demand one lead time ahead (demand unit per s): band mean or upper (the planner's quantile)",
    ["band"],
)


@dataclass
class RunResult:
    """What one run saw and decided; ``to_json`` is the CLI's --json document."""

    decision: Decision
    now: float
    model: str = "none"
    note: str = ""
    steps: list[PlanStep] = field(default_factory=list)
    scores: dict[str, float] = field(default_factory=dict)
    series: dict[str, object] = field(default_factory=dict)
    planner: PlannerConfig | None = None
    # The last complete bucket's demand (demand unit per s) as counted, before any smoothing;
    # None when the source gave none (a hold on an unreachable or empty source, a missing bucket).
    demand: float | None = None

    def to_json(self) -> dict[str, object]:
        """JSON document: model, series, planner (the settings each step's replicas follow from),
        plan [{minute, forecast, upper, replicas}], decision."""
        return {
            "model": self.model,
            "model_note": self.note,
            "now": self.now,
            "series": self.series,
            "scores_mae_at_lead": self.scores,
            "planner": None
            if self.planner is None
            else {
                "capacity_per_replica": self.planner.capacity_per_replica,
                "headroom": self.planner.headroom,
                "upper_headroom": self.planner.upper_headroom,
                "min_replicas": self.planner.min_replicas,
                "max_replicas": self.planner.max_replicas,
                "lead_time_s": self.planner.lead_time_s,
                "decision_interval_s": self.planner.decision_interval_s,
            },
            "plan": [
                {
                    "minute": int(s.start // 60),
                    "minutes_ahead": round((s.start - self.now) / 60, 2),
                    "forecast": round(s.forecast, 4),
                    "upper": round(s.upper, 4),
                    "replicas": s.replicas,
                }
                for s in self.steps
            ],
            "decision": {
                "replicas": self.decision.replicas,
                "reason": self.decision.reason,
                "action": self.decision.action,
                "current": self.decision.current,
                "at": self.decision.at,
            },
        }


def _describe(traffic: Traffic, y: np.ndarray, unit: str) -> dict[str, object]:
    """The series summary. missing_before_first: the missing buckets before the first counted
    one (a window reaching back before any router counted; counted in missing_buckets too)."""
    counted = np.flatnonzero(~np.isnan(y))
    return {
        "name": traffic.name,
        # demand() reads misses when the source counts them: say so, not "requests"
        "demand_unit": "cache misses/s" if unit == "requests" and traffic.misses is not None else f"{unit}/s",
        "step_s": traffic.step,
        "start": traffic.start,
        "end": traffic.end,
        "buckets": len(traffic),
        "missing_buckets": int(np.isnan(y).sum()),
        "missing_before_first": int(counted[0]) if counted.size else len(y),
    }


@dataclass
class SelectionCache:
    """A daemon's last model selection, reused for ``reselect_s`` (simulated s) as the backtest
    reuses its choice between refits: in between, the chosen model is carried over the newer
    buckets with ``forward`` (no refit) and calibrated with the stored residuals. Selection is
    most of a run's CPU (seconds per run on days of 1-minute counters), and choosing again every
    minute made the choice itself noisy. A short-history choice (last value) is never kept."""

    reselect_s: float
    selection: Selection | None = None
    at: float = float("-inf")
    key: tuple[object, ...] = ()

    def get(self, now: float, key: tuple[object, ...]) -> Selection | None:
        """The kept selection when made for ``key`` less than ``reselect_s`` before ``now``."""
        if self.selection is None or key != self.key or not 0 <= now - self.at < self.reselect_s:
            return None
        return self.selection

    def put(self, selection: Selection, now: float, key: tuple[object, ...]) -> None:
        """Keep ``selection``, made at ``now`` (simulated Unix s) for ``key``; a short-history one clears the cache."""
        if selection.note.startswith("short history"):
            self.selection = None
            return
        self.selection, self.at, self.key = selection, now, key


def run_once(
    settings: ForecasterSettings,
    source: Source,
    now: float | None = None,
    store: RedisStateStore | None = None,
    current: int | None = None,
    lead_time_s: float | None = None,
    cache: SelectionCache | None = None,
) -> RunResult:
    """Plan once. now: Unix s (None: the source's present, i.e. wall clock or end of trace);
    store: where the planner state lives (None: stateless what-if run); current: observed
    replica count when the caller knows it; lead_time_s: warm-up measured from pods (default
    the ``warmup_s`` setting); cache: the daemon's kept model selection (None: select now).
    Never raises for source trouble: it holds."""
    config = settings.planner(lead_time_s)
    state = _load(store)
    try:
        traffic = source.fetch(now)
    except SourceUnavailable as exc:
        at = time.time() if now is None else now
        decision = _hold(state, at, f"source unavailable ({exc})", config, "source", current)
        return _finish(RunResult(decision, at), store, state, config)
    at = traffic.end if now is None else now
    raw = demand(traffic, settings.demand_unit)
    series = _describe(traffic, raw, settings.demand_unit)
    window = max(1, round(settings.rate_window_s / traffic.step))
    # Zero buckets that read as an outage of the demand signal are missing data, not demand:
    # neither the models nor the band learn from them, and the planner holds through them.
    zeros = zero_run(raw, traffic.step)
    y = trailing_mean(mask_outages(raw, traffic.step), window)
    # A trailing mean of ``window`` buckets is the rate at its centre, ``lag`` buckets back: the
    # models forecast that smoothed series ``lag`` buckets further, and the plan is read from
    # the forecast shifted back into place (a seasonal step is then not forecast late).
    lag = (window - 1) // 2
    config = replace(config, smoothing_s=lag * traffic.step)
    if y.size == 0 or np.isnan(y).all():
        # the Traffic's name: only the part of the source that returned nothing (PopsCounterSource)
        decision = _hold(state, at, f"{traffic.name or source.name} returned no data", config, "empty", current)
        return _finish(RunResult(decision, at, series=series), store, state, config)
    if zeros.outage:  # its zeros are missing data, not a demand of 0
        decision = _hold(state, at, zeros.describe(traffic.step), config, "outage", current)
        return _finish(RunResult(decision, at, series=series), store, state, config)
    last = float(raw[-1]) if raw.size and np.isfinite(raw[-1]) else None
    planned = horizon_steps(settings.horizon_s, traffic.step, config)
    horizon = planned + lag
    lead = min(horizon, lead_steps(config.lead_time_s, traffic.step) + lag)
    season = max(1, round(settings.season_s / traffic.step))
    band_window = round(settings.band_window_s / traffic.step)
    key = (tuple(settings.models), horizon, season, traffic.step, settings.level, band_window, settings.band_scale)
    kept = cache.get(at, key) if cache is not None else None
    seen = clean(y)
    if kept is not None:
        chosen = kept
        forecast = chosen.calibrate(chosen.model.forward(seen, horizon, settings.level), history=seen)
    else:
        candidates = build_candidates(settings.models, season, traffic.step, settings.level)
        chosen = select(
            y,
            horizon,
            lead,
            candidates,
            settings.level,
            settings.time_budget_s,
            span=season,
            band_window=band_window,
            band_scale=settings.band_scale,
        )
        forecast = chosen.calibrate(chosen.model.predict(horizon, settings.level), history=seen)
        if cache is not None:
            cache.put(chosen, at, key)
    forecast = Forecast(forecast.mean, bound_upper(forecast.mean, forecast.upper, seen, traffic.step))
    steps = plan_steps(forecast.mean[lag:], forecast.upper[lag:], traffic.end, traffic.step, config)
    observe_forecast(steps, float(raw[-1]), traffic.end + config.lead_time_s)
    if np.isnan(raw[-1]):  # a trailing mean would hide it: still a hold, never a scale-down
        HOLDS.labels("stale").inc()
        log.warning("hold: last bucket of %s is missing", source.name)
    current_demand = float(y[-1]) if np.isfinite(raw[-1]) else float("nan")
    decision = decide(steps, current_demand, at, traffic.step, config, state, current)
    if decision.action != "hold" and chosen.note.startswith("short history"):
        decision = replace(decision, reason=f"{decision.reason}; {chosen.note}")
    if decision.action != "hold" and zeros.buckets:
        decision = replace(decision, reason=f"{decision.reason}; {zeros.describe(traffic.step)}")
    result = RunResult(decision, at, chosen.model.name, chosen.note, steps, chosen.scores, series, demand=last)
    return _finish(result, store, state, config)


def _hold(
    state: PlannerState | None,
    at: float,
    why: str,
    config: PlannerConfig,
    cause: str,
    current: int | None,
) -> Decision:
    HOLDS.labels(cause).inc()
    log.warning("hold: %s", why)
    return hold(state, at, why, config, current)


def _load(store: RedisStateStore | None) -> PlannerState | None:
    if store is None:
        return None
    try:
        return store.load()
    except SourceUnavailable as exc:
        log.warning("%s; planning without the last decision", exc)
        return None


def observe_forecast(steps: list[PlanStep], last_demand: float, lead_at: float) -> None:
    """Export the last observed demand and the forecast (mean, upper) of the first plan step
    starting at or after ``lead_at`` (Unix s: the end of the last bucket plus the lead time;
    the last step when the horizon ends before it), so that a dashboard or an alert can set
    today's demand against the forecast made one lead time earlier (PromQL ``offset``)."""
    DEMAND.set(last_demand)
    if not steps:
        return
    step = next((s for s in steps if s.start >= lead_at), steps[-1])
    FORECAST.labels("mean").set(step.forecast)
    FORECAST.labels("upper").set(step.upper)


def _finish(
    result: RunResult, store: RedisStateStore | None, state: PlannerState | None, config: PlannerConfig
) -> RunResult:
    result = replace(result, planner=config)
    DESIRED.set(result.decision.replicas)
    HOLDING.set(1 if result.decision.action == "hold" else 0)
    if store is not None and result.decision.action != "hold":  # a hold changes nothing
        try:
            store.save(advance(state, result.decision, config.down_cooldown_s))
        except SourceUnavailable as exc:
            log.warning("%s", exc)
    return result
