"""Demand sources behind one interface: ``fetch(now) -> Traffic``.

- RedisCounterSource: the router's per-minute counters;
- PopsCounterSource: the counters of several POPs, each in its own Redis, summed per minute;
- PrometheusSource: a PromQL ``query_range`` over httpx;
- TraceSource: a trace file or folder (Azure, Mooncake, ServeGen, BurstGPT, generic CSV).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Protocol

from forecaster.series import Traffic
from forecaster.settings import DEFAULT_PROMETHEUS_URL, ForecasterSettings
from forecaster.sources.pops import PopsCounterSource
from forecaster.sources.prometheus import PrometheusSource
from forecaster.sources.redis_counters import RedisCounterSource
from forecaster.sources.traces import read_trace


class Source(Protocol):
    """A demand source. ``fetch(now)`` returns the Traffic observed before ``now`` (Unix s;
    None = the source's own present) and raises SourceUnavailable when it cannot answer in time."""

    name: str

    def fetch(self, now: float | None = None) -> Traffic: ...


class TraceSource:
    """A trace file read once; ``fetch(now)`` keeps the buckets that end by ``now`` (default:
    the whole trace). Raises TraceFormatError on a bad file."""

    def __init__(self, path: Path, step: float | None = None, tz: str = "UTC", fmt: str = "auto") -> None:
        self._traffic = read_trace(path, step, tz, fmt)
        self.name = f"trace:{self._traffic.name}"

    def fetch(self, now: float | None = None) -> Traffic:
        traffic = self._traffic
        if now is None:
            return traffic
        keep = math.floor((now - traffic.start) / traffic.step)
        return traffic.window(0, max(0, min(len(traffic), keep)))


def open_source(settings: ForecasterSettings) -> Source:
    """The live source named by ``settings.source``: prometheus, or the router counters of every
    POP in ``settings.pops`` (PopsCounterSource), else those in ``settings.redis_url``. Raises
    ConfigError for a POP whose URL no client can be built from."""
    if settings.source == "prometheus":
        return PrometheusSource(
            settings.prometheus_url or DEFAULT_PROMETHEUS_URL,
            settings.prometheus_query,
            settings.step_s,
            settings.history_s,
            settings.source_timeout_s,
        )
    if settings.pops:
        return PopsCounterSource(settings.pops, settings.model_name, settings.history_s, settings.source_timeout_s)
    return RedisCounterSource(settings.redis_url, settings.model_name, settings.history_s, settings.source_timeout_s)


__all__ = [
    "PopsCounterSource",
    "PrometheusSource",
    "RedisCounterSource",
    "Source",
    "TraceSource",
    "open_source",
    "read_trace",
]
