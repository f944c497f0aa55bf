"""Replica simulation of four scaling policies on a demand trace (fluid model).

Time advances in ticks of ``tick_s`` (15 s, HPA's sync period). Demand is the trace's rate,
constant within each bucket. A replica serves ``capacity`` demand units per second once ready;
replicas ordered at t are ready at t + warm-up and are paid for (replica-minutes) from t;
scale-down is immediate (warming replicas are cancelled first). A tick is under-provisioned
when ready capacity is below demand; the request share is the demand above ready capacity.

Policies:
- predictive: the PromptEdge planner every decision interval (a cron tick), observing demand
  through per-minute counters (see ``predictive_decider``);
- reactive_hpa: HPA's algorithm on utilisation (target 1 / (1 + headroom)), every 15 s, 10 %
  tolerance, scale-up at once, scale-down to the highest recommendation of the last 300 s
  (Kubernetes docs, "Horizontal Pod Autoscaling", algorithm details and stabilization window);
- keda_queue: a KEDA-style queue scaler polled every 30 s: when the backlog exceeds 30 s of one
  replica's work, enough replicas to serve arrivals and drain the backlog within a minute; back
  down to the utilisation target after 300 s without backlog (KEDA's default cooldownPeriod);
- oracle: perfect foresight; each replica is ordered exactly one warm-up before it is needed.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from forecaster.backtest.forecasts import RollingForecasts
from forecaster.plan import PlannerConfig, PlannerState, advance, decide, hold, plan_steps
from forecaster.series import mask_outages


@dataclass(frozen=True)
class SimConfig:
    """capacity: demand per ready replica (demand unit/s); headroom as in the planner;
    warmup_s: replica warm-up; tick_s: simulation tick (divides the trace step)."""

    capacity: float
    headroom: float
    warmup_s: float
    tick_s: float = 15.0
    min_replicas: int = 1
    max_replicas: int = 100_000
    hpa_tolerance: float = 0.1
    hpa_stabilization_s: float = 300.0
    keda_poll_s: float = 30.0
    keda_backlog_s: float = 30.0
    keda_cooldown_s: float = 300.0

    def need(self, demand: float) -> int:
        """Replicas for ``demand`` at the utilisation target, within bounds."""
        if not math.isfinite(demand):
            return self.min_replicas
        raw = math.ceil(demand / self.capacity * (1 + self.headroom) - 1e-9)
        return max(self.min_replicas, min(self.max_replicas, raw))


@dataclass(frozen=True)
class PolicyRun:
    """Per tick: ready replicas and provisioned (ready + warming) replicas."""

    name: str
    ready: np.ndarray
    provisioned: np.ndarray


@dataclass
class Cluster:
    """Ready and warming replicas at the current tick; what a policy observes."""

    ready: int
    warming: deque[tuple[int, int]]  # (ready at tick, count), oldest first
    backlog: float = 0.0

    @property
    def provisioned(self) -> int:
        return self.ready + sum(count for _, count in self.warming)

    def scale_to(self, desired: int, tick: int, warm_ticks: int) -> None:
        change = desired - self.provisioned
        if change > 0:
            self.warming.append((tick + warm_ticks, change))
        while change < 0 and self.warming:  # cancel the newest warming replicas first
            at, count = self.warming.pop()
            take = min(count, -change)
            change += take
            if count > take:
                self.warming.append((at, count - take))
        if change < 0:
            self.ready = max(0, self.ready + change)


Decider = Callable[[int, float, Cluster], int | None]


def simulate(name: str, demand: np.ndarray, decider: Decider, cfg: SimConfig) -> PolicyRun:
    """Run ``decider`` (tick, last observed demand, cluster) -> desired replicas or None on the
    per-tick ``demand`` (NaN = no data: the decider sees NaN, the tick is not scored)."""
    warm_ticks = math.ceil(cfg.warmup_s / cfg.tick_s)
    first = next((d for d in demand if math.isfinite(d)), 0.0)
    cluster = Cluster(cfg.need(first), deque())
    ready = np.zeros(demand.size, dtype=np.int64)
    provisioned = np.zeros(demand.size, dtype=np.int64)
    observed = first
    for i, d in enumerate(demand):
        while cluster.warming and cluster.warming[0][0] <= i:
            cluster.ready += cluster.warming.popleft()[1]
        desired = decider(i, observed, cluster)
        if desired is not None and desired != cluster.provisioned:
            cluster.scale_to(desired, i, warm_ticks)
        ready[i], provisioned[i] = cluster.ready, cluster.provisioned
        if math.isfinite(d):
            cluster.backlog = max(0.0, cluster.backlog + (d - cluster.ready * cfg.capacity) * cfg.tick_s)
        observed = d
    return PolicyRun(name, ready, provisioned)


def hpa_decider(cfg: SimConfig) -> Decider:
    """HPA-like utilisation policy (see module docstring)."""
    target = 1.0 / (1.0 + cfg.headroom)
    window = max(1, round(cfg.hpa_stabilization_s / cfg.tick_s))
    recent: deque[int] = deque(maxlen=window)

    def decide_hpa(tick: int, observed: float, cluster: Cluster) -> int | None:
        if not math.isfinite(observed):
            return None
        current = max(cluster.provisioned, 1)
        ratio = observed / (current * cfg.capacity * target)
        raw = current if abs(ratio - 1.0) <= cfg.hpa_tolerance else cfg.need(observed)
        recent.append(raw)
        return raw if raw >= cluster.provisioned else max(recent)

    return decide_hpa


def keda_decider(cfg: SimConfig) -> Decider:
    """KEDA-like queue-threshold policy (see module docstring)."""
    every = max(1, round(cfg.keda_poll_s / cfg.tick_s))
    last_backlog_tick = 0

    def decide_keda(tick: int, observed: float, cluster: Cluster) -> int | None:
        nonlocal last_backlog_tick
        if tick % every or not math.isfinite(observed):
            return None
        if cluster.backlog > cfg.capacity * cfg.keda_backlog_s:
            last_backlog_tick = tick
            drain = math.ceil((observed + cluster.backlog / 60.0) / cfg.capacity)
            return max(cluster.provisioned, min(cfg.max_replicas, drain))
        if cluster.backlog > 0:
            last_backlog_tick = tick
            return None
        if (tick - last_backlog_tick) * cfg.tick_s >= cfg.keda_cooldown_s:
            return min(cluster.provisioned, cfg.need(observed))
        return None

    return decide_keda


def predictive_decider(
    fc: RollingForecasts,
    y: np.ndarray,
    step: float,
    cfg: SimConfig,
    planner: PlannerConfig,
    observe_s: float = 60.0,
) -> Decider:
    """The PromptEdge planner every ``planner.decision_interval_s``.

    It observes demand as the router's per-minute counters give it: the current demand is the
    mean over the last complete ``observe_s`` (one minute), so it reacts to a step one minute
    after it (the HPA-like policy: one 15 s sync). Once the first minute of a bucket is
    observed, that bucket's rate is known (demand is constant within a bucket in this
    simulation, so its first minute is its rate): the plan's first step is the bucket at the
    observed rate and the forecast is the one made with the bucket included, as a forecaster
    reading minute counters would have it. With buckets no longer than ``observe_s`` this never
    happens and the plan is the forecast made at the last bucket boundary. While the bucket
    whose demand is current is an outage of the demand signal (``series.zero_run``) it holds, as
    ``run_once`` does.
    """
    per_step = round(step / cfg.tick_s)
    every = max(1, round(planner.decision_interval_s / cfg.tick_s))
    per_obs = max(1, round(observe_s / cfg.tick_s))
    seen: deque[float] = deque(maxlen=per_obs)
    state: PlannerState | None = None
    outage = (y == 0) & np.isnan(mask_outages(y, step))

    def decide_predictive(tick: int, observed: float, cluster: Cluster) -> int | None:
        nonlocal state
        seen.append(observed)  # the demand of the tick before this one
        if tick % every:
            return None
        i, into = divmod(tick, per_step)
        o = int(fc.origins[i])
        now = o * step + into * cfg.tick_s
        minute = float(np.mean(seen)) if len(seen) == per_obs else float("nan")
        known = into >= per_obs and i + 1 < fc.origins.size and math.isfinite(minute)
        if known:
            mean = np.r_[minute, fc.mean[i + 1]]
            upper = np.r_[minute, fc.upper[i + 1]]
        else:
            mean, upper = fc.mean[i], fc.upper[i]
        if np.isnan(mean).any():
            return None
        steps = plan_steps(mean, upper, o * step, step, planner)
        current_demand = minute if math.isfinite(minute) else (float(y[o - 1]) if o > 0 else float("nan"))
        current_bucket = o if known else o - 1
        if 0 <= current_bucket < y.size and outage[current_bucket]:
            return hold(state, now, "demand signal outage", planner, cluster.provisioned).replicas
        decision = decide(steps, current_demand, now, step, planner, state, cluster.provisioned)
        state = advance(state, decision, planner.down_cooldown_s)
        return decision.replicas

    return decide_predictive


def oracle_run(demand: np.ndarray, cfg: SimConfig) -> PolicyRun:
    """Perfect foresight: exactly the replicas needed are ready; each was ordered one warm-up
    earlier (so it is paid for from then)."""
    need = np.array([cfg.need(d) for d in demand], dtype=np.int64)
    warm_ticks = math.ceil(cfg.warmup_s / cfg.tick_s)
    provisioned = need.copy()
    for lag in range(1, warm_ticks + 1):
        provisioned[:-lag] = np.maximum(provisioned[:-lag], need[lag:])
    return PolicyRun("oracle", need, provisioned)


def score(run: PolicyRun, demand: np.ndarray, cfg: SimConfig, oracle_minutes: float) -> dict[str, float]:
    """under_provisioned_frac (of scored time), _minutes, _request_share (demand above ready
    capacity / all demand), replica_minutes (provisioned), replica_minutes_vs_oracle."""
    ok = np.isfinite(demand)
    d = demand[ok]
    served = run.ready[ok] * cfg.capacity
    short = served < d - 1e-9
    minutes = float(run.provisioned.sum() * cfg.tick_s / 60.0)
    return {
        "under_provisioned_frac": float(short.mean()),
        "under_provisioned_minutes": float(short.sum() * cfg.tick_s / 60.0),
        "under_provisioned_request_share": float(np.maximum(d - served, 0).sum() / max(d.sum(), 1e-12)),
        "replica_minutes": minutes,
        "replica_minutes_vs_oracle": minutes / oracle_minutes if oracle_minutes > 0 else float("nan"),
    }
