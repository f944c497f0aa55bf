"""PromptEdge forecaster: forecasts demand 1-30 minutes ahead and plans replicas ahead of it.

Public surface: sources, models, the pure planner, the run and its settings.
"""

from forecaster.clock import SimClock
from forecaster.errors import ConfigError, ForecasterError, SourceUnavailable, TraceFormatError
from forecaster.models.base import Forecast, Model
from forecaster.models.select import Selection, build_candidates, select
from forecaster.plan import (
    Decision,
    PlannerConfig,
    PlannerState,
    PlanStep,
    advance,
    decide,
    hold,
    plan_steps,
    replicas_for,
)
from forecaster.run import RunResult, run_once
from forecaster.series import Traffic, demand
from forecaster.settings import ForecasterSettings
from forecaster.sources import (
    PopsCounterSource,
    PrometheusSource,
    RedisCounterSource,
    Source,
    TraceSource,
    open_source,
    read_trace,
)
from forecaster.state import RedisStateStore

__all__ = [
    "ConfigError",
    "Decision",
    "Forecast",
    "ForecasterError",
    "ForecasterSettings",
    "Model",
    "PlanStep",
    "PlannerConfig",
    "PlannerState",
    "PopsCounterSource",
    "PrometheusSource",
    "RedisCounterSource",
    "RedisStateStore",
    "RunResult",
    "Selection",
    "Source",
    "SimClock",
    "SourceUnavailable",
    "TraceFormatError",
    "TraceSource",
    "Traffic",
    "advance",
    "build_candidates",
    "decide",
    "demand",
    "hold",
    "open_source",
    "plan_steps",
    "read_trace",
    "replicas_for",
    "run_once",
    "select",
]
