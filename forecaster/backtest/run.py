"""The backtest: rolling forecasts on the test part of a trace, four policies simulated on it,
one JSON report (keys as in issue 5: ``policies`` and ``forecast``)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from forecaster.backtest.forecasts import RollingForecasts, forecast_errors, rolling_forecasts
from forecaster.backtest.simulate import (
    UNBOUNDED,
    PolicyRun,
    SimConfig,
    hpa_decider,
    keda_decider,
    oracle_run,
    predictive_decider,
    score,
    simulate,
)
from forecaster.errors import ConfigError
from forecaster.plan import PLANNER_DEFAULTS as _PLAN
from forecaster.plan import PlannerConfig, horizon_steps, lead_steps
from forecaster.series import Traffic
from forecaster.settings import ForecasterSettings

# The forecasting settings' defaults (level, models, band, budget), as the live forecaster has
# them: built without reading the environment or a settings file.
_FORECASTING = ForecasterSettings.model_construct()


@dataclass(frozen=True)
class BacktestConfig:
    """warmup_s: replica warm-up (= lead time); capacity: demand per replica; test_fraction:
    trailing share of the trace that is scored (the rest is history only); refit_every_s: how
    often the model is chosen again; decision_interval_s: how often the predictive policy
    decides (a cron tick), on the forecast made at the last bucket boundary; band_window_s: the
    trailing span whose mean the band is conditioned on (s, ``select``'s ``band_window``; 0: one
    band for every origin); band_scale: the band is also scaled by that span's volatility
    (``select``'s ``band_scale``); the remaining fields as in the planner and ``select``.
    Defaults: the planner's from ``PLANNER_DEFAULTS``, the forecasting ones from
    ``ForecasterSettings``; never spelled here."""

    warmup_s: float = _PLAN.lead_time_s
    capacity: float = _PLAN.capacity_per_replica
    headroom: float = _PLAN.headroom
    test_fraction: float = 0.5
    horizon_s: float = _FORECASTING.horizon_s
    season_s: float = _FORECASTING.season_s
    level: float = _FORECASTING.level
    models: list[str] = field(default_factory=lambda: list(_FORECASTING.models))
    budget_s: float = _FORECASTING.time_budget_s
    refit_every_s: float = 86400.0
    max_origins: int = 144
    up_cooldown_s: float = _PLAN.up_cooldown_s
    down_cooldown_s: float = _PLAN.down_cooldown_s
    max_step: int = UNBOUNDED
    max_scale_down_fraction: float = _PLAN.max_scale_down_fraction
    decision_interval_s: float = _PLAN.decision_interval_s
    upper_headroom: float | None = _PLAN.upper_headroom
    band_window_s: float = _FORECASTING.band_window_s
    band_scale: bool = _FORECASTING.band_scale

    def planner(self) -> PlannerConfig:
        """The planner the predictive policy runs: these knobs, unbounded replicas."""
        return PlannerConfig(
            capacity_per_replica=self.capacity,
            headroom=self.headroom,
            min_replicas=_PLAN.min_replicas,
            max_replicas=UNBOUNDED,
            lead_time_s=self.warmup_s,
            up_cooldown_s=self.up_cooldown_s,
            down_cooldown_s=self.down_cooldown_s,
            max_step=self.max_step,
            max_scale_down_fraction=self.max_scale_down_fraction,
            decision_interval_s=self.decision_interval_s,
            upper_headroom=self.upper_headroom,
        )


@dataclass
class BacktestResult:
    """report: the JSON document; the arrays feed the plot (ticks of ``tick_s`` from
    ``start``)."""

    report: dict[str, object]
    y: np.ndarray
    first: int
    forecasts: RollingForecasts
    runs: dict[str, PolicyRun]
    tick_demand: np.ndarray
    tick_s: float


def run_backtest(traffic: Traffic, demand: np.ndarray, cfg: BacktestConfig, progress: bool = True) -> BacktestResult:
    """Backtest ``demand`` (rates per bucket of ``traffic.step``, NaN gaps) under ``cfg``."""
    step = traffic.step
    if not 0.0 < cfg.test_fraction < 1.0:
        raise ConfigError(f"test fraction must be between 0 and 1, got {cfg.test_fraction}")
    tick_s = math.gcd(int(step), 15) if step >= 1 else step
    if step % tick_s:
        raise ConfigError(f"step {step} s is not a whole number of seconds")
    n = demand.size
    first = int(n * (1 - cfg.test_fraction))
    if first < 2 or n - first < 2:
        raise ConfigError(f"trace too short to backtest: {n} buckets of {step:g} s")
    planner = cfg.planner()
    horizon = horizon_steps(cfg.horizon_s, step, planner)
    lead = min(lead_steps(cfg.warmup_s, step), horizon)
    season = max(1, round(cfg.season_s / step))
    fc = rolling_forecasts(
        demand,
        first,
        horizon,
        lead,
        season,
        step,
        cfg.models,
        cfg.level,
        cfg.budget_s,
        max(1, round(cfg.refit_every_s / step)),
        cfg.max_origins,
        progress,
        round(cfg.band_window_s / step),
        cfg.band_scale,
    )
    per_step = round(step / tick_s)
    ticks = np.repeat(demand[first:], per_step)
    sim = SimConfig(
        cfg.capacity,
        cfg.headroom,
        cfg.warmup_s,
        tick_s=float(tick_s),
        min_replicas=planner.min_replicas,
        max_replicas=planner.max_replicas,
    )
    fc_test = fc.head(fc.origins.size - 1)
    oracle = oracle_run(ticks, sim)
    runs = {
        "predictive": simulate("predictive", ticks, predictive_decider(fc_test, demand, step, sim, planner), sim),
        "reactive_hpa": simulate("reactive_hpa", ticks, hpa_decider(sim), sim),
        "keda_queue": simulate("keda_queue", ticks, keda_decider(sim), sim),
        "oracle": oracle,
    }
    oracle_minutes = float(oracle.provisioned.sum() * tick_s / 60.0)
    policies = {name: score(run, ticks, sim, oracle_minutes) for name, run in runs.items()}
    k30 = min(horizon, max(1, round(1800 / step)))
    chosen = {name: fc.models.count(name) for name in sorted(set(fc.models))}
    report: dict[str, object] = {
        "trace": traffic.name,
        "step_s": step,
        "warmup_s": cfg.warmup_s,
        "capacity": cfg.capacity,
        "config": asdict(cfg),
        "test": {
            "first_bucket": first,
            "buckets": n - first,
            "start": traffic.start + first * step,
            "end": traffic.end,
            "missing_buckets": int(np.isnan(demand[first:]).sum()),
        },
        "lead_steps": lead,
        "policies": policies,
        "forecast": {**forecast_errors(demand, fc_test, lead, cfg.level, season), "horizon_min": lead * step / 60},
        "forecast_30min": {**forecast_errors(demand, fc_test, k30, cfg.level, season), "horizon_min": k30 * step / 60},
        "models_chosen": chosen,
    }
    return BacktestResult(report, demand, first, fc_test, runs, ticks, float(tick_s))
