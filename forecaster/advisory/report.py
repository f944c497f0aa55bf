"""The what-if report: what advisory mode recorded (and Prometheus, for the demand) turned into
"what would have happened had the forecaster been in control" against what the cluster did.

``build_report`` reads the target's advisory record (forecaster/advisory/record.py) over a
window, lays it on a one-minute grid, takes the demand per minute from Prometheus when the
forecaster's source is Prometheus (else, or when Prometheus cannot answer, from the demand each
cycle recorded) and compares (forecaster/advisory/whatif.py). Whatever could not be known is
said in ``unknown`` and left null: no number is made up. The model the what-if assumes
(capacity per replica, lead time, GPUs per replica) is stated in the report itself.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from forecaster.advisory.record import AdvisoryLog, Observation
from forecaster.advisory.whatif import FloatArray, Model, WhatIf, compare, hold_forward
from forecaster.errors import ConfigError, SourceUnavailable
from forecaster.settings import DEFAULT_PROMETHEUS_URL, ForecasterSettings
from forecaster.sources.prometheus import PrometheusSource

STEP_S = 60.0
# The longest window: a year of minutes (525,600 per array) keeps the report's arrays and its
# Prometheus reads (48 chunked requests) bounded; the record itself keeps less (the actuator's
# advisory_retention_s, 14 days by default), which the CLI also enforces.
MAX_SPAN_S = 366 * 86400.0
_SPAN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}


def parse_span(text: str) -> float:
    """``24h``, ``90m``, ``2d``, ``1w``, ``3600s`` or plain seconds -> seconds, in (0, MAX_SPAN_S].
    Raises ConfigError naming ``--since`` and the value."""
    match = _SPAN.match(text)
    if not match or float(match.group(1)) <= 0:
        raise ConfigError(f"--since {text!r}: expected a positive span such as 24h, 90m, 2d or 3600 (seconds)")
    span = float(match.group(1)) * _UNITS[match.group(2)]
    if span > MAX_SPAN_S:  # 1e20 s would ask numpy for an array of 1.7e18 minutes
        raise ConfigError(f"--since {text!r}: at most {MAX_SPAN_S / 86400:g} days ({MAX_SPAN_S:g} s)")
    return span


@dataclass(frozen=True)
class Report:
    """The report document (``to_json``) and its per-minute arrays (for the PNG)."""

    document: dict[str, Any]
    whatif: WhatIf
    start: float
    demand: FloatArray
    ready: FloatArray
    spec: FloatArray
    desired: FloatArray

    @property
    def complete(self) -> bool:
        """True when nothing had to be left unknown."""
        return not self.document["unknown"]


def _grid(observations: list[Observation], start: float, n: int, max_age: int) -> tuple[FloatArray, ...]:
    """desired, ready, spec and recorded demand per minute from the observations (the last one
    in a minute wins). Ready and spec are held forward ``max_age`` minutes (a cycle per
    interval); the recorded demand is that of the minute before the cycle (the last complete one)."""
    desired, ready, spec, demand = (np.full(n, np.nan) for _ in range(4))
    for o in observations:
        i = int((o.at - start) // STEP_S)
        if not 0 <= i < n:
            continue
        if o.action != "hold":  # a hold repeats the last decision: it is no new one
            desired[i] = o.desired
        elif math.isnan(desired[i]):
            desired[i] = o.desired
        if o.ready is not None:
            ready[i] = o.ready
        if o.spec is not None:
            spec[i] = o.spec
        if o.demand is not None and i >= 1:
            demand[i - 1] = o.demand
    return desired, hold_forward(ready, max_age), hold_forward(spec, max_age), demand


def _prometheus_demand(settings: ForecasterSettings, start: float, n: int) -> tuple[FloatArray | None, str]:
    """Demand per minute [start + 60 m, start + 60 (m + 1)) from Prometheus: the query's rate
    evaluated at each minute's end. (None, why) when it cannot answer or returns nothing."""
    source = PrometheusSource(
        settings.prometheus_url or DEFAULT_PROMETHEUS_URL,
        settings.prometheus_query,
        STEP_S,
        (n + 1) * STEP_S,
        settings.source_timeout_s,
    )
    try:
        traffic = source.fetch(start + (n + 1) * STEP_S)
    except SourceUnavailable as exc:
        return None, f"Prometheus could not answer ({exc})"
    values = np.asarray(traffic.requests, dtype=float)[1:]
    if values.size != n or np.isnan(values).all():
        return None, f"Prometheus returned no data for {settings.prometheus_query!r} in the window"
    return values, ""


def _model_statement(model: Model, unit: str) -> str:
    return (
        f"Had the forecaster been in control: each decision is the Deployment's spec.replicas from the minute it "
        f"was made (held until the next one); a scale-up is Ready {model.lead_min} min later (lead time "
        f"{model.lead_s:.0f} s: the warm-up measured from the pods plus the actuation delay); a scale-down takes "
        f"effect at once, warming replicas first. One Ready replica serves {model.capacity_per_replica:g} {unit}/s; "
        f"a minute is under-provisioned when its demand is above Ready replicas x that capacity. Each allocated "
        f"replica (Ready or warming) holds {model.gpus_per_replica:g} GPU(s). The cluster side is what it did: "
        f"Ready replicas (status.readyReplicas) and spec.replicas as read each cycle. No latency model: whether "
        f"fewer replicas would still have met a latency SLO this report cannot say."
    )


def _nulls(values: FloatArray) -> list[float | None]:
    return [None if math.isnan(v) else round(float(v), 4) for v in values]


def build_report(
    settings: ForecasterSettings,
    record: AdvisoryLog,
    target: str,
    since_s: float,
    until: float,
    gpus_per_replica: float = 1.0,
    notes: tuple[str, ...] = (),
) -> Report:
    """The what-if over [until - since_s, until) (Unix s, whole minutes) for ``target``; ``notes``
    are put first in the report's notes (e.g. about its settings). Raises ConfigError for a span
    not in (0, MAX_SPAN_S], an ``until`` not finite or a GPU count not finite > 0; never for
    missing data, which the report names in ``unknown``."""
    if not 0 < since_s <= MAX_SPAN_S:
        raise ConfigError(f"--since: the span must be in (0, {MAX_SPAN_S:g}] s, got {since_s!r}")
    if not math.isfinite(until):
        raise ConfigError(f"--until must be a finite Unix time, got {until!r}")
    if not (math.isfinite(gpus_per_replica) and gpus_per_replica > 0):
        raise ConfigError(f"--gpus-per-replica must be a finite number > 0, got {gpus_per_replica!r}")
    end = math.floor(until / STEP_S) * STEP_S
    start = end - math.ceil(since_s / STEP_S) * STEP_S
    n = int(round((end - start) / STEP_S))
    unknown: list[str] = []
    notes_out: list[str] = list(notes)
    try:
        observations, bad = record.read(start, end)
    except SourceUnavailable as exc:
        observations, bad = [], 0
        unknown.append(f"the advisory record could not be read ({exc}): everything the forecaster decided")
    if bad:
        notes_out.append(f"{bad} stored observation(s) could not be parsed and were skipped")
    if not observations and not unknown:
        unknown.append(
            f"no advisory observation recorded for {target} in the window (is a forecaster running with "
            "PROMPTEDGE_ACTUATOR_MODE=advisory for this Deployment, and for long enough?)"
        )
    interval_min = max(1, math.ceil(settings.daemon_interval_s / STEP_S))
    desired, ready, spec, recorded = _grid(observations, start, n, 2 * interval_min)
    why_ready = Counter(o.note for o in observations if o.ready is None and o.note)
    for why, count in why_ready.most_common(3):
        notes_out.append(f"Ready replicas unknown in {count} cycle(s): {why}")
    demand: FloatArray = recorded
    demand_source = "advisory records (the demand each cycle saw)"
    if settings.source == "prometheus":
        from_prometheus, why = _prometheus_demand(settings, start, n)
        if from_prometheus is not None:
            demand, demand_source = from_prometheus, f"Prometheus: {settings.prometheus_query}"
        else:
            notes_out.append(f"{why}; demand taken from the advisory records instead")
    if observations:
        capacity = statistics.median(o.capacity_per_replica for o in observations)
        lead_s = statistics.median(o.lead_s for o in observations)
        unit = observations[-1].unit
    else:
        capacity = settings.capacity_per_replica
        lead_s = settings.planner().lead_time_s
        unit = settings.demand_unit
        notes_out.append("no observation: the model above is the settings', not what a forecaster planned with")
    model = Model(capacity, lead_s, gpus_per_replica)
    result = compare(desired, ready, spec, demand, model)
    unknown.extend(result.unknown)
    document: dict[str, Any] = {
        "target": target,
        "window": {"start": start, "end": end, "minutes": n},
        "model": {
            "capacity_per_replica": capacity,
            "demand_unit": f"{unit}/s",
            "lead_time_s": lead_s,
            "lead_min": model.lead_min,
            "gpus_per_replica": gpus_per_replica,
            "statement": _model_statement(model, unit),
        },
        "demand_source": demand_source,
        "observations": len(observations),
        "scored_minutes": result.scored_minutes,
        "forecaster_in_control": result.forecaster.to_json(),
        "cluster": result.cluster.to_json(),
        "unknown": unknown,
        "notes": notes_out,
        "series": {
            "start": start,
            "step_s": STEP_S,
            "demand": _nulls(demand),
            "desired": _nulls(desired),
            "ready": _nulls(ready),
            "spec": _nulls(spec),
            "whatif_ready": _nulls(result.whatif_ready),
            "whatif_allocated": _nulls(result.whatif_allocated),
        },
    }
    return Report(document, result, start, demand, ready, spec, desired)


def render_text(report: Report) -> str:
    """The report for a terminal: the two sides in a table, then the model and what is unknown."""
    doc = report.document

    def cell(value: float | int | None, fmt: str) -> str:
        return "unknown" if value is None else format(value, fmt)

    lines = [
        f"what-if for {doc['target']}: {doc['window']['minutes']} minutes, {doc['observations']} advisory "
        f"observations, {doc['scored_minutes']} minutes scored; demand from {doc['demand_source']}",
        f"{'':28}{'forecaster in control':>22}  {'what the cluster did':>22}",
    ]
    f, c = doc["forecaster_in_control"], doc["cluster"]
    for label, key, fmt in (
        ("under-provisioned minutes", "under_provisioned_minutes", "d"),
        ("replica-minutes", "replica_minutes", ".0f"),
        ("GPU-hours", "gpu_hours", ".2f"),
        ("scale-up events", "scale_up_events", "d"),
        ("scale-down events", "scale_down_events", "d"),
    ):
        lines.append(f"{label:28}{cell(f[key], fmt):>22}  {cell(c[key], fmt):>22}")
    lines.append(f"model: {doc['model']['statement']}")
    lines.extend(f"unknown: {u}" for u in doc["unknown"])
    lines.extend(f"note: {n}" for n in doc["notes"])
    return "\n".join(lines)
