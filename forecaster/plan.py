"""Pure planner: forecast of demand -> desired replicas, with a reason for every decision.

No I/O here: the runner hands in the forecast, the last observed demand and the persisted
state (last decision, last scale times); the planner returns the plan over the horizon and
one Decision. Units: demand and capacity in the same unit (requests/s or tokens/s of cache
misses); times in Unix s.

Rules (issue 5):
- replicas(x) = ceil(x / capacity_per_replica * (1 + headroom)), clipped to [min, max];
- predictive target = replicas(upper forecast at t + lead time): the most replicas needed in
  the buckets that replicas ordered now will serve before the next decision's replicas are
  ready: the buckets overlapping [now + lead, now + lead + decision interval);
- reactive floor = replicas(current demand): a forecast only adds capacity, never removes it;
- no scale-down while a rise above the target is forecast within the warm-up window;
- no forecast-driven scale-up within ``up_cooldown_s`` of the last scale-up (growth to the
  reactive floor is never delayed);
- scale-down stabilisation, the HPA's rule (``behavior.scaleDown.stabilizationWindowSeconds``,
  default 300 s): down only to the highest recommendation of the last ``down_cooldown_s``, so a
  quiet minute between busy ones (noise in counts of a few requests a minute) does not give
  back replicas that take a whole warm-up to return; at most ``max_step`` replicas per decision
  up; down at most ``max_scale_down_fraction`` of the current replicas (at least one; issue 31:
  a first decision once took a pool 4 -> 1);
- cold start: no scale-down before the forecaster has observed a whole stabilisation window
  (``down_cooldown_s``) of decisions, in this process or in the saved state it restored
  (``PlannerState.observed_since``); a saved state older than that window restores nothing;
- missing or stale data: hold the last decision, never scale down on missing data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PlannerConfig:
    """The planner's knobs, and the one place their defaults live: the settings
    (``ForecasterSettings``), the backtest (``BacktestConfig``), the CLI's flags and the bench
    take theirs from ``PLANNER_DEFAULTS``.

    capacity_per_replica: demand one replica serves at target latency (> 0, demand unit);
    headroom: extra fraction (0.2 = 20 %); lead_time_s: replica warm-up; up_cooldown_s: no
    forecast-driven scale-up this long after the last one (s); down_cooldown_s: the scale-down
    stabilisation window (s; HPA's default);
    decision_interval_s: time until the next decision (cron or daemon interval);
    upper_headroom: headroom over the upper forecast (None: ``headroom``). A plan step needs
    max(replicas of the mean at ``headroom``, replicas of the upper at ``upper_headroom``), so
    0 reads "the expected demand at the utilisation target, the upper quantile at full
    capacity"; observe_s: how long after a bucket starts its demand is first counted (s; the
    router's counter minute): a recommendation that only the upper band of a bucket asked for
    stops holding replicas up then (see ``decide``); smoothing_s: how far after a bucket the
    demand it stands for reaches (s): the half-width of a centred mean the forecast was made
    on (forecaster.run: rate_window_s), so a step forecast there at full level only this long
    after it starts; the plan reads that far past each decision's covered span (0: buckets as
    counted); max_scale_down_fraction: the most one decision removes, as a share of the current
    replicas (at least 1 replica; within ``max_step`` too): 0.5 takes 4 to 2, 100 to 50 (issue
    31: a first decision read demand as 0 and took a pool 4 -> 1; a count instead of a share,
    2 a minute, held a pool of hundreds up for an hour after each peak)."""

    capacity_per_replica: float = 2.0
    headroom: float = 0.2
    min_replicas: int = 1
    max_replicas: int = 10
    lead_time_s: float = 300.0
    up_cooldown_s: float = 300.0
    down_cooldown_s: float = 300.0
    max_step: int = 4
    decision_interval_s: float = 60.0
    # chosen with the forecast band's level on the backtest's tuning days (forecaster README)
    upper_headroom: float | None = 0.1
    observe_s: float = 60.0
    smoothing_s: float = 0.0
    max_scale_down_fraction: float = 0.5


# Every default of the planner, for those that spell its knobs under their own names.
PLANNER_DEFAULTS = PlannerConfig()


@dataclass(frozen=True)
class Recommendation:
    """What one decision asked for, as the scale-down stabilisation remembers it.

    at: Unix s of the decision; replicas: what it recommended; base: what the reactive floor
    and the mean forecast alone asked for (<= replicas); band_until: Unix s when the bucket
    whose upper band asked for more than ``base`` is first counted (None: no such bucket).
    Until then the recommendation holds ``replicas``, after it only ``base``."""

    at: float
    replicas: int
    base: int
    band_until: float | None = None

    def standing(self, now: float) -> int:
        """The replicas this recommendation still asks for at ``now``."""
        return self.replicas if self.band_until is None or now < self.band_until else self.base


@dataclass(frozen=True)
class PlannerState:
    """What the planner remembers between runs (persisted in Redis by ``state``).

    replicas: the last decided replica count; at: when it was decided (Unix s);
    last_up_at / last_down_at: when replicas last went up / down (Unix s), None if never;
    recent: the recommendations of the decisions inside the scale-down window, oldest first
    (what the stabilisation takes the highest of); observed_since: Unix s from which decisions
    were taken without a gap as long as the stabilisation window (None: unknown, a state saved
    before it was kept: read as a cold start).
    """

    replicas: int
    at: float
    last_up_at: float | None = None
    last_down_at: float | None = None
    recent: tuple[Recommendation, ...] = ()
    observed_since: float | None = None


@dataclass(frozen=True)
class Decision:
    """One replica decision. replicas: desired count; reason: why, in one line for logs and
    annotations; action: "up", "down", "keep", "set" (first decision) or "hold" (data missing); at: Unix s;
    current: replica count the decision started from (None when unknown); recommended: what
    the forecast and the reactive floor asked for before cooldowns, stabilisation and the max
    step (None for a hold), with what part of it only the upper band asked for; observed_since:
    Unix s from which this forecaster has observed demand without a gap (PlannerState's; None
    for a hold, which changes nothing)."""

    replicas: int
    reason: str
    action: str = "keep"
    at: float = 0.0
    current: int | None = None
    recommended: Recommendation | None = None
    observed_since: float | None = None


@dataclass(frozen=True)
class PlanStep:
    """Bucket ``k`` steps ahead: starts at ``start`` (Unix s); forecast and upper in the demand
    unit; replicas needed for the upper forecast."""

    k: int
    start: float
    forecast: float
    upper: float
    replicas: int


def replicas_for(demand: float, config: PlannerConfig) -> int:
    """ceil(demand / capacity * (1 + headroom)) within [min, max]; NaN demand gives min."""
    if not math.isfinite(demand):
        return config.min_replicas
    raw = math.ceil(demand / config.capacity_per_replica * (1 + config.headroom) - 1e-9)
    return max(config.min_replicas, min(config.max_replicas, raw))


def lead_steps(lead_time_s: float, step_s: float) -> int:
    """Steps ahead (1 = the bucket starting now) of the bucket in which a replica ordered now
    becomes ready: the lead-time horizon."""
    return int(math.floor(lead_time_s / step_s)) + 1


def horizon_steps(horizon_s: float, step_s: float, config: PlannerConfig) -> int:
    """Steps to forecast: the horizon setting, but at least up to the last bucket a decision
    taken anywhere inside the current bucket must cover (now + lead + decision interval +
    ``config.smoothing_s``, as ``covered`` reads it)."""
    reach = step_s + config.lead_time_s + config.decision_interval_s + config.smoothing_s
    return max(1, math.ceil(horizon_s / step_s), math.ceil(reach / step_s))


def covered(steps: list[PlanStep], now: float, step_s: float, config: PlannerConfig) -> list[PlanStep]:
    """The buckets that replicas ordered at ``now`` serve before the next decision's replicas
    are ready: those overlapping [now + lead, now + lead + decision interval), plus
    ``config.smoothing_s`` past it (a smoothed bucket reaching demand that far later). Past the
    horizon, the last bucket."""
    lo = now + config.lead_time_s
    hi = lo + config.decision_interval_s + config.smoothing_s
    inside = [s for s in steps if s.start < hi and s.start + step_s > lo]
    return inside or steps[-1:]


def plan_steps(
    mean: np.ndarray, upper: np.ndarray, start: float, step_s: float, config: PlannerConfig
) -> list[PlanStep]:
    """The plan over the horizon: one PlanStep per forecast bucket, first one starting at
    ``start`` (the end of the last observed bucket)."""
    return [
        PlanStep(k + 1, start + k * step_s, float(m), float(u), _step_replicas(float(m), float(u), config))
        for k, (m, u) in enumerate(zip(mean, upper))
    ]


def _step_replicas(mean: float, upper: float, config: PlannerConfig) -> int:
    """Replicas one plan step needs: the upper forecast at ``upper_headroom`` and the mean at
    ``headroom`` (the upper alone when both headrooms are the same)."""
    if config.upper_headroom is None or config.upper_headroom == config.headroom:
        return replicas_for(upper, config)
    at_upper = replicas_for(upper * (1 + config.upper_headroom) / (1 + config.headroom), config)
    return max(replicas_for(mean, config), at_upper)


def hold(
    state: PlannerState | None,
    now: float,
    why: str,
    config: PlannerConfig,
    current: int | None = None,
) -> Decision:
    """Fail-safe decision: keep the last decided count (never scale down on missing data).
    Without a remembered decision keep the observed count ``current``; with neither there is
    nothing to hold and the decision is min replicas, said so in the reason."""
    if state is None and current is not None:
        return Decision(current, f"hold: {why}; keeping current {current}", "hold", now, current)
    if state is None:
        return Decision(config.min_replicas, f"hold: {why}; no previous decision, min replicas", "hold", now)
    return Decision(
        state.replicas,
        f"hold: {why}; keeping last decision {state.replicas}",
        "hold",
        now,
        state.replicas,
    )


def decide(
    steps: list[PlanStep],
    current_demand: float,
    now: float,
    step_s: float,
    config: PlannerConfig,
    state: PlannerState | None,
    current: int | None = None,
) -> Decision:
    """The decision for ``now``.

    steps: plan from ``plan_steps``; current_demand: demand in the last observed bucket (NaN
    -> hold); current: observed replica count (defaults to the last decision).
    """
    if not steps or not math.isfinite(current_demand):
        return hold(state, now, "no current demand (last bucket missing)", config, current)
    if not all(math.isfinite(s.forecast) and math.isfinite(s.upper) for s in steps):
        # an infinite upper would read as min replicas (replicas_for), a scale-down on nonsense
        return hold(state, now, "forecast not finite", config, current)
    if current is None and state is not None:
        current = state.replicas
    since = observed_since(state, now, config)
    at_lead = max(covered(steps, now, step_s, config), key=lambda s: (s.replicas, s.upper))
    floor = replicas_for(current_demand, config)
    target = max(floor, at_lead.replicas)
    why = (
        f"upper forecast {at_lead.upper:.3g} at +{(at_lead.start - now) / 60:.0f} min needs "
        f"{at_lead.replicas}, current demand {current_demand:.3g} needs {floor}"
    )
    # What only the upper band of a bucket not yet counted asks for is uncertainty about that
    # bucket: once its first minute is counted, it no longer holds replicas up (HPA's window
    # guards against noisy observations; it would otherwise keep the margin before every
    # bucket boundary for a whole window after the boundary's demand is known).
    base = max(floor, replicas_for(at_lead.forecast, config))
    recommended = Recommendation(
        now, target, min(base, target), at_lead.start + config.observe_s if target > base else None
    )
    if current is None:
        return Decision(target, f"{why}; first decision", "set", now, None, recommended, since)
    if target < current:
        horizon_end = now + config.lead_time_s + config.decision_interval_s + config.smoothing_s
        window_peak = max(s.replicas for s in steps if s.start < horizon_end)
        if window_peak > target:
            target = min(current, window_peak)
            why += f"; rise to {window_peak} forecast within warm-up window"
    if target > current:
        since_up = None if state is None or state.last_up_at is None else now - state.last_up_at
        if since_up is not None and since_up < config.up_cooldown_s:
            if floor <= current:
                return Decision(
                    current, f"{why}; scale-up cooldown ({since_up:.0f} s)", "keep", now, current, recommended, since
                )
            # The cooldown delays forecast-driven growth only: load that is already here is served.
            target = floor
            why += f"; scale-up cooldown ({since_up:.0f} s): only up to the reactive floor"
        new = min(target, current + config.max_step)
        capped = f"; capped by max step {config.max_step}" if new < target else ""
        return Decision(new, f"{why}; scale up {current}->{new}{capped}", "up", now, current, recommended, since)
    if target < current:
        window = [r.standing(now) for r in (state.recent if state else ()) if now - r.at < config.down_cooldown_s]
        stable = max([target, *window])
        if stable > target:
            why += f"; scale-down stabilisation: {stable} recommended within {config.down_cooldown_s:.0f} s"
            target = stable
    if target < current and now - since < config.down_cooldown_s:
        # A fresh forecaster knows nothing of the window the stabilisation keeps: a first minute
        # read as 0 (a router's partial minute, a restart) once took a pool 4 -> 1 (issue 31).
        return Decision(
            current,
            f"{why}; keep {current}: no scale-down before a whole stabilisation window "
            f"of demand is observed ({now - since:.0f} of {config.down_cooldown_s:.0f} s)",
            "keep",
            now,
            current,
            recommended,
            since,
        )
    if target < current:
        step = min(config.max_step, max(1, math.floor(current * config.max_scale_down_fraction)))
        new = max(target, current - step)
        capped = f"; capped by max scale-down step {step}" if new > target else ""
        return Decision(new, f"{why}; scale down {current}->{new}{capped}", "down", now, current, recommended, since)
    return Decision(current, f"{why}; keep {current}", "keep", now, current, recommended, since)


def observed_since(state: PlannerState | None, now: float, config: PlannerConfig) -> float:
    """Unix s from which demand has been observed without a gap, for a decision at ``now``:
    the saved state's, unless there is none, it predates the field, or its last decision is a
    whole stabilisation window old (nothing of that window was seen); else ``now``."""
    if state is None or state.observed_since is None or now - state.at > config.down_cooldown_s:
        return now
    return min(state.observed_since, now)


def advance(state: PlannerState | None, decision: Decision, window_s: float = 0.0) -> PlannerState:
    """State after ``decision`` (what the state store persists). ``window_s``: the scale-down
    window (``down_cooldown_s``, s): recommendations older than that are dropped."""
    up = state.last_up_at if state else None
    down = state.last_down_at if state else None
    if decision.action == "up" and decision.current is not None and decision.replicas > decision.current:
        up = decision.at
    if decision.action == "down":
        down = decision.at
    recent = [r for r in (state.recent if state else ()) if decision.at - r.at < window_s]
    if decision.recommended is not None and window_s > 0:
        recent.append(decision.recommended)
    since = (
        decision.observed_since if decision.observed_since is not None else (state.observed_since if state else None)
    )
    return PlannerState(decision.replicas, decision.at, up, down, tuple(recent), since)
