"""What one policy's run measured, per simulated minute and in total (pure).

Definitions (simulated seconds throughout; the replayer's wall-clock timings x speedup):

- a request is **good** when it answered 200 with a well-formed stream, its TTFT <= the TTFT
  SLO and its ITL (mean time per output token after the first: (latency - TTFT) / (tokens - 1))
  <= the ITL SLO; cache hits count like any answer;
- **SLO attainment** = good / all requests sent (failed ones are not good);
- **GPU-hours** = the integral of the Pods holding a GPU (scheduled to the node and not yet
  gone, ready or warming or terminating) over the run, one GPU per Pod;
- **goodput per GPU-hour** = good requests / GPU-hours;
- **scale events** = changes of the Deployment's ``spec.replicas`` during the run;
- a minute is **under-provisioned** when its ready replicas (mean of the samples) x capacity
  per replica < the minute's forwarded demand (requests sent to replicas, i.e. not cache hits,
  per second).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class RequestRecord:
    """One replayed request: ``at_s`` arrival (simulated s from the segment start); ``ttft_s``,
    ``itl_s`` in simulated seconds (None when failed or a single token); ``hit``: answered
    from the cache."""

    at_s: float
    ok: bool
    ttft_s: float | None
    itl_s: float | None
    hit: bool
    error: str | None = None


@dataclass(frozen=True)
class ScaleSample:
    """The Deployment and its Pods at simulated time ``t_s`` (from the segment start)."""

    t_s: float
    desired: int
    ready: int
    warming: int
    holding_gpu: int


def is_good(r: RequestRecord, ttft_slo_s: float, itl_slo_s: float) -> bool:
    """True when the request met both SLOs (see the module doc)."""
    return r.ok and r.ttft_s is not None and r.ttft_s <= ttft_slo_s and (r.itl_s is None or r.itl_s <= itl_slo_s)


def _pct(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "p99": None}
    p = np.percentile(np.asarray(values), [50, 95, 99])
    return {"p50": round(float(p[0]), 4), "p95": round(float(p[1]), 4), "p99": round(float(p[2]), 4)}


def per_minute(
    requests: list[RequestRecord],
    samples: list[ScaleSample],
    span_s: float,
    capacity_rps: float,
    ttft_slo_s: float,
    itl_slo_s: float,
) -> list[dict[str, Any]]:
    """One row per simulated minute of the segment: ``minute``, ``demand_rps`` (arrivals),
    ``forwarded_rps`` (misses), ``desired``/``ready``/``warming`` (last sample of the minute;
    ``ready_mean`` the mean), ``ttft``/``itl`` percentiles, ``slo_attainment``, ``hit_ratio``,
    ``failed``, ``under_provisioned``."""
    minutes = max(1, int(math.ceil(span_s / 60.0)))
    rows = []
    for m in range(minutes):
        reqs = [r for r in requests if m * 60 <= r.at_s < (m + 1) * 60]
        samp = [s for s in samples if m * 60 <= s.t_s < (m + 1) * 60]
        forwarded = sum(1 for r in reqs if not r.hit) / 60.0
        ready_mean = float(np.mean([s.ready for s in samp])) if samp else None
        last = samp[-1] if samp else None
        rows.append(
            {
                "minute": m,
                "demand_rps": round(len(reqs) / 60.0, 4),
                "forwarded_rps": round(forwarded, 4),
                "desired": last.desired if last else None,
                "ready": last.ready if last else None,
                "warming": last.warming if last else None,
                "ready_mean": None if ready_mean is None else round(ready_mean, 3),
                "ttft_s": _pct([r.ttft_s for r in reqs if r.ok and r.ttft_s is not None]),
                "itl_s": _pct([r.itl_s for r in reqs if r.ok and r.itl_s is not None]),
                "slo_attainment": round(sum(is_good(r, ttft_slo_s, itl_slo_s) for r in reqs) / len(reqs), 4)
                if reqs
                else None,
                "hit_ratio": round(sum(r.hit for r in reqs) / len(reqs), 4) if reqs else None,
                "failed": sum(not r.ok for r in reqs),
                "under_provisioned": bool(ready_mean is not None and ready_mean * capacity_rps < forwarded),
            }
        )
    return rows


def gpu_hours(samples: list[ScaleSample], span_s: float) -> float:
    """Integral of Pods holding a GPU over [0, span_s], each sample holding until the next
    (the last until ``span_s``), in hours."""
    inside = sorted((s for s in samples if 0 <= s.t_s <= span_s), key=lambda s: s.t_s)
    total = 0.0
    for i, s in enumerate(inside):
        end = inside[i + 1].t_s if i + 1 < len(inside) else span_s
        total += s.holding_gpu * (end - s.t_s)
    return total / 3600.0


def scale_events(samples: list[ScaleSample]) -> int:
    """How often ``desired`` changed between consecutive samples."""
    return sum(1 for a, b in zip(samples, samples[1:]) if a.desired != b.desired)


def summarize(
    requests: list[RequestRecord],
    samples: list[ScaleSample],
    span_s: float,
    capacity_rps: float,
    ttft_slo_s: float,
    itl_slo_s: float,
) -> dict[str, Any]:
    """The policy's totals: ``requests``, ``good``, ``slo_attainment``, ``gpu_hours``,
    ``goodput_per_gpu_hour``, ``failed_requests``, ``scale_events``,
    ``under_provisioned_minutes``, ``ttft_s``/``itl_s`` percentiles, ``hit_ratio``."""
    good = sum(is_good(r, ttft_slo_s, itl_slo_s) for r in requests)
    hours = gpu_hours(samples, span_s)
    rows = per_minute(requests, samples, span_s, capacity_rps, ttft_slo_s, itl_slo_s)
    return {
        "requests": len(requests),
        "good": good,
        "slo_attainment": round(good / len(requests), 4) if requests else None,
        "gpu_hours": round(hours, 4),
        "goodput_per_gpu_hour": round(good / hours, 2) if hours > 0 else None,
        "failed_requests": sum(not r.ok for r in requests),
        "scale_events": scale_events(samples),
        "under_provisioned_minutes": sum(r["under_provisioned"] for r in rows),
        "ttft_s": _pct([r.ttft_s for r in requests if r.ok and r.ttft_s is not None]),
        "itl_s": _pct([r.itl_s for r in requests if r.ok and r.itl_s is not None]),
        "hit_ratio": round(sum(r.hit for r in requests) / len(requests), 4) if requests else None,
    }


# forecaster/live.py's line per decision: "decision N (ACTION, exit C) at T (ISO) on MODEL: REASON"
_DECISION = re.compile(r"decision \d+ \([^)]*\) at [\d.]+ \([^)]*\) on ([\w.-]+):")


def models_chosen(log_lines: Iterable[str]) -> dict[str, int]:
    """How many of the forecaster daemon's decisions each model made, from its log lines (JSON
    or text); {} when none is found. The table and JSON name it, so a win is not read as a lead
    when the model was last value."""
    found = (_DECISION.search(line) for line in log_lines)
    return dict(Counter(m.group(1) for m in found if m))
