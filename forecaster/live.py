"""One live cycle, shared by ``run --once`` and ``daemon``: read the observed scale, plan,
carry the decision out through ``forecaster.actuate``, return the exit code.

Lead time: the warm-up measured from the Deployment's pods when a deployment is configured
(``PROMPTEDGE_ACTUATOR_DEPLOYMENT``), else ``PROMPTEDGE_FORECASTER_WARMUP_S``. The planner
state is kept in Redis per scaled target, so a restarted forecaster still holds its last
decision.

Clock: "now" comes from ``settings.clock()`` (simulated when ``CLOCK_SCALE`` != 1, see
``forecaster.clock``); the warm-up measured from pod timestamps is wall time and is converted
to simulated seconds, so the planner works in simulated seconds throughout.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from forecaster.actuate import ActuationError, ActuationResult, Actuator, ActuatorSettings, measure_warmup
from forecaster.advisory.observe import record_cycle
from forecaster.advisory.record import AdvisoryLog, advisory_key
from forecaster.clock import SimClock
from forecaster.errors import SourceUnavailable
from forecaster.run import RunResult, SelectionCache, run_once
from forecaster.scheduler import ExitCode
from forecaster.settings import ForecasterSettings
from forecaster.sources import Source
from forecaster.state import RedisStateStore, forecast_document
from opskit import ALL_POOLS

log = logging.getLogger("forecaster")


@dataclass
class Cycle:
    """Outcome of one live cycle: the plan, what the actuator did (None if it failed) and the
    exit code (scheduler.ExitCode)."""

    result: RunResult
    actuation: ActuationResult | None
    code: ExitCode


def state_store(settings: ForecasterSettings, actuator_settings: ActuatorSettings) -> RedisStateStore:
    """The planner state of the scaled target (and model, when one is named)."""
    target = target_key(settings, actuator_settings)
    return RedisStateStore(settings.redis_url, f"promptedge:forecaster:state:{target}", settings.source_timeout_s)


def target_key(settings: ForecasterSettings, actuator_settings: ActuatorSettings) -> str:
    """``namespace/deployment`` plus ``:model`` when one is named: the key of the target's
    planner state and advisory record."""
    return actuator_settings.target + (f":{settings.model_name}" if settings.model_name else "")


def advisory_log(settings: ForecasterSettings, actuator_settings: ActuatorSettings) -> AdvisoryLog:
    """The advisory record of the target (forecaster/advisory/record.py) in the forecaster's Redis."""
    return AdvisoryLog(
        settings.redis_url,
        advisory_key(target_key(settings, actuator_settings)),
        settings.source_timeout_s,
        actuator_settings.advisory_retention_s,
    )


def cycle(
    settings: ForecasterSettings,
    actuator_settings: ActuatorSettings,
    source: Source,
    actuator: Actuator,
    now: float | None = None,
    clock: SimClock | None = None,
    run_delay_s: float = 0.0,
    cache: SelectionCache | None = None,
    store: RedisStateStore | None = None,
) -> Cycle:
    """Observe, plan, act once at ``now`` (Unix s; None: ``clock.now()``, the clock defaulting
    to ``settings.clock()``). run_delay_s: simulated seconds between "now" and the scale
    write (the run's own duration), added to the lead time. Actuation errors give
    ACTUATION_FAILED (logged, not raised); a held decision (source unreachable, empty or last
    bucket missing) gives HOLD. store: the planner state's store (None: a new one, as a cron
    run has; a daemon passes one store for its life, which remembers its last decision through
    a Redis outage)."""
    clock = settings.clock() if clock is None else clock
    now = clock.now() if now is None else now
    lead = settings.warmup_s
    if actuator_settings.deployment:
        warmup = measure_warmup(actuator_settings)
        # Pod timestamps are the API server's wall clock; the planner counts simulated seconds.
        lead = clock.to_simulated(warmup.seconds) if warmup.source == "pods" else warmup.seconds
        log.info("warm-up %.0f s (%s: %s)", lead, warmup.source, warmup.note)
    lead += run_delay_s
    try:
        current = actuator.read_current()
    except ActuationError as exc:
        log.error("observed scale unreadable: %s", exc)
        current = None
    store = state_store(settings, actuator_settings) if store is None else store
    # Advisory mode plans as if in control: from its own last decision (the planner's default
    # when ``current`` is None), not from the replicas another autoscaler chose, so its record
    # is the decisions it would have made; the observed count is still recorded.
    advising = actuator_settings.mode == "advisory"
    result = run_once(settings, source, now, store, None if advising else current, lead, cache)
    publish(settings, store, result, clock)
    advisory = advisory_log(settings, actuator_settings) if advising else None
    try:
        actuation = actuator.apply(result.decision, current)
    except ActuationError as exc:
        log.error("actuation failed: %s", exc)
        record_cycle(result, None, settings.demand_unit, advisory)
        return Cycle(result, None, ExitCode.ACTUATION_FAILED)
    record_cycle(result, actuation, settings.demand_unit, advisory)
    code = ExitCode.HOLD if result.decision.action == "hold" else ExitCode.OK
    return Cycle(result, actuation, code)


# Cycles a published forecast outlives: then the router's warmer sees none and warms nothing.
FORECAST_TTL_CYCLES = 3


def publish(settings: ForecasterSettings, store: RedisStateStore, result: RunResult, clock: SimClock) -> None:
    """Publish the run's forecast for the router's cache warming (forecaster/state.py
    ``forecast_document``), unless it held without a plan; a Redis error is logged, never
    raised (warming is an optimisation, scaling is not held up by it)."""
    if not result.steps:
        return
    document = forecast_document(
        settings.model_name or ALL_POOLS,
        result.now,
        result.steps,
        settings.capacity_per_replica,
        result.decision.replicas,
        settings.demand_unit,
    )
    ttl_s = math.ceil(clock.to_wall(FORECAST_TTL_CYCLES * settings.daemon_interval_s))
    try:
        store.publish_forecast(document, ttl_s)
    except SourceUnavailable as exc:
        log.warning("%s", exc)


def daemon_job(
    settings: ForecasterSettings,
    actuator_settings: ActuatorSettings,
    source: Source,
    actuator: Actuator,
    clock: SimClock | None = None,
) -> Callable[[], None]:
    """A job for ``scheduler.run_daemon``: one cycle at ``clock.now()`` (default
    ``settings.clock()``, made once so every run shares its origin), logged in one line with
    the simulated time it decided at.

    A run decides at its start and writes the scale at its end; on a compressed clock the run's
    wall duration is many simulated seconds (2 s at scale 60 = 2 simulated minutes), so the
    previous run's duration, in simulated seconds, is added to the next run's lead time."""
    clock = settings.clock() if clock is None else clock
    last_run_s = 0.0
    cache = SelectionCache(settings.reselect_s)
    store = state_store(settings, actuator_settings)

    def job() -> None:
        nonlocal last_run_s
        started = time.monotonic()
        outcome = cycle(
            settings, actuator_settings, source, actuator, clock=clock, run_delay_s=last_run_s, cache=cache, store=store
        )
        last_run_s = clock.to_simulated(time.monotonic() - started)
        d = outcome.result.decision
        at = datetime.fromtimestamp(outcome.result.now, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        log.info(
            "decision %d (%s, exit %d) at %.1f (%s) on %s: %s",
            d.replicas,
            d.action,
            outcome.code,
            outcome.result.now,
            at,
            outcome.result.model,
            d.reason,
        )

    return job
