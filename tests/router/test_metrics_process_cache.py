"""The router's registry carries process_* series and promptedge_router_cache_up, which the
CacheUnavailable alert (deploy/monitoring) reads."""

from __future__ import annotations

from router.dispatch import Weights
from router.fleet.health import HealthConfig
from router.fleet.replicas import Pools
from router.observe.metrics import RouterMetrics


def test_cache_up_follows_the_cache_and_process_series_are_exported() -> None:
    healthy = [True]
    metrics = RouterMetrics(Pools((), HealthConfig()), Weights(), cache_healthy=lambda: healthy[0])
    text = metrics.render().decode()
    assert "promptedge_router_cache_up 1.0" in text
    assert "process_cpu_seconds_total" in text and "process_resident_memory_bytes" in text
    healthy[0] = False
    assert "promptedge_router_cache_up 0.0" in metrics.render().decode()


def test_without_a_cache_there_is_no_cache_series() -> None:
    assert "promptedge_router_cache_up" not in RouterMetrics(Pools((), HealthConfig()), Weights()).render().decode()
