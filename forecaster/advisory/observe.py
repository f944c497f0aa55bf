"""Advisory mode's per-cycle bookkeeping: the desired-against-actual gauges and the record.

The gauges are set in every mode where the cycle read the Deployment (a dashboard then shows
desired against Ready whatever the mode); the record (forecaster/advisory/record.py) is kept in
advisory mode only, where nothing else leaves a trace of what the forecaster would have done.
A Redis error while recording is logged, never raised: advising goes on.
"""

from __future__ import annotations

import logging

from prometheus_client import Gauge

from forecaster.actuate import ActuationResult
from forecaster.advisory.record import AdvisoryLog, Observation
from forecaster.errors import SourceUnavailable
from forecaster.run import RunResult

log = logging.getLogger("forecaster")

READY = Gauge(
    "promptedge_forecaster_ready_replicas",
    "Ready replicas of the target Deployment when the last cycle read it (status.readyReplicas; NaN: unknown)",
)
OBSERVED = Gauge(
    "promptedge_forecaster_observed_replicas",
    "spec.replicas of the target Deployment when the last cycle read it (NaN: unknown)",
)
READY_CAPACITY = Gauge(
    "promptedge_forecaster_ready_capacity",
    "Ready replicas x capacity per replica (demand unit per s; NaN: unknown): below the demand is under-provisioned",
)
ADVISORY = Gauge("promptedge_forecaster_advisory", "1 when the forecaster only advises (advisory mode), else 0")


def observation(result: RunResult, actuation: ActuationResult | None, unit: str) -> Observation:
    """The record of one cycle: its decision, what the actuator read (None when it failed) and
    the demand the run saw."""
    planner = result.planner
    return Observation(
        at=result.now,
        desired=result.decision.replicas,
        action=result.decision.action,
        ready=None if actuation is None else actuation.ready,
        spec=None if actuation is None else actuation.observed,
        demand=result.demand,
        lead_s=0.0 if planner is None else planner.lead_time_s,
        capacity_per_replica=0.0 if planner is None else planner.capacity_per_replica,
        unit=unit,
        note="actuator failed" if actuation is None else actuation.note,
    )


def record_cycle(
    result: RunResult, actuation: ActuationResult | None, unit: str, advisory: AdvisoryLog | None
) -> Observation:
    """Set the gauges from this cycle and, with ``advisory`` (advisory mode), append its
    observation; returns the observation."""
    seen = observation(result, actuation, unit)
    READY.set(float("nan") if seen.ready is None else seen.ready)
    OBSERVED.set(float("nan") if seen.spec is None else seen.spec)
    READY_CAPACITY.set(float("nan") if seen.ready is None else seen.ready * seen.capacity_per_replica)
    ADVISORY.set(1 if advisory is not None else 0)
    if advisory is not None:
        try:
            advisory.append(seen)
        except SourceUnavailable as exc:
            log.warning("%s", exc)
    return seen
