"""One live cycle, shared by ``run --once`` and ``daemon``: read the observed scale, plan,
carry the decision out through ``forecaster.actuate``, return the exit code.

Lead time: the warm-up measured from the Deployment's pods when a deployment is configured
(``PROMPTEDGE_ACTUATOR_DEPLOYMENT``), else ``PROMPTEDGE_FORECASTER_WARMUP_S``. The planner
state is kept in Redis per scaled target, so a restarted forecaster still holds its last
decision.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from forecaster.actuate import ActuationError, ActuationResult, Actuator, ActuatorSettings, measure_warmup
from forecaster.run import RunResult, run_once
from forecaster.scheduler import ExitCode
from forecaster.settings import ForecasterSettings
from forecaster.sources import Source
from forecaster.state import RedisStateStore

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
    target = actuator_settings.target + (f":{settings.model_name}" if settings.model_name else "")
    return RedisStateStore(
        settings.redis_url, f"promptedge:forecaster:state:{target}", settings.source_timeout_s
    )


def cycle(
    settings: ForecasterSettings,
    actuator_settings: ActuatorSettings,
    source: Source,
    actuator: Actuator,
    now: float | None = None,
) -> Cycle:
    """Observe, plan, act once. Actuation errors give ACTUATION_FAILED (logged, not raised);
    a held decision (source unreachable, empty or last bucket missing) gives HOLD."""
    lead = None
    if actuator_settings.deployment:
        warmup = measure_warmup(actuator_settings)
        lead = warmup.seconds
        log.info("lead time %.0f s (%s: %s)", warmup.seconds, warmup.source, warmup.note)
    try:
        current = actuator.read_current()
    except ActuationError as exc:
        log.error("observed scale unreadable: %s", exc)
        current = None
    result = run_once(settings, source, now, state_store(settings, actuator_settings), current, lead)
    try:
        actuation = actuator.apply(result.decision, current)
    except ActuationError as exc:
        log.error("actuation failed: %s", exc)
        return Cycle(result, None, ExitCode.ACTUATION_FAILED)
    code = ExitCode.HOLD if result.decision.action == "hold" else ExitCode.OK
    return Cycle(result, actuation, code)


def daemon_job(
    settings: ForecasterSettings,
    actuator_settings: ActuatorSettings,
    source: Source,
    actuator: Actuator,
) -> Callable[[], None]:
    """A job for ``scheduler.run_daemon``: one cycle at the wall clock, logged in one line."""

    def job() -> None:
        outcome = cycle(settings, actuator_settings, source, actuator)
        d = outcome.result.decision
        log.info("decision %d (%s, exit %d): %s", d.replicas, d.action, outcome.code, d.reason)

    return job
