"""Running Debian's ``promtool`` (package ``prometheus``) for the monitoring tests, and the
metric names PromptEdge and vLLM really export, read from the registries themselves."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, CollectorRegistry

needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None, reason="no promtool on PATH (Debian: apt-get install prometheus)"
)

# vLLM series the dashboard reads that sim/ does not simulate (names from vLLM's metrics
# documentation: V1 exports time_per_output_token_seconds, later releases inter_token_latency_seconds).
VLLM_NOT_SIMULATED = {"vllm:time_per_output_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket"}
_NAME = re.compile(r"(?<![\w:])((?:promptedge_|vllm:|process_)[A-Za-z0-9_:]*)")


def promtool(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``promtool args...``; never raises on a non-zero exit (the caller asserts)."""
    return subprocess.run(
        ["promtool", *map(str, args)], capture_output=True, text=True, timeout=60, check=False, cwd=cwd
    )


def metric_names(expr: str) -> set[str]:
    """The PromptEdge, vLLM and process_* series names a PromQL expression reads."""
    return set(_NAME.findall(expr))


def _sample_names(registry: CollectorRegistry) -> set[str]:
    names = set()
    for family in registry.collect():
        suffixes = {
            "counter": ("_total", "_created"),
            "histogram": ("_bucket", "_sum", "_count", "_created"),
            "summary": ("_sum", "_count", "_created"),
        }.get(family.type, ("",))
        names.update(family.name + suffix for suffix in suffixes)
    return names


def exported_names() -> set[str]:
    """Every series name the router (with its cache and discovery series), the forecaster
    daemon and the simulated vLLM replica expose, plus :data:`VLLM_NOT_SIMULATED`."""
    import forecaster.live  # noqa: F401 - and the daemon's advisory series (forecaster/advisory/observe.py)
    import forecaster.run  # noqa: F401 - registers the forecaster's series on the default registry
    from cache.stats.metrics import REGISTRY as CACHE
    from router.discovery import DiscoveryCollector, StaticSource
    from router.dispatch import Weights
    from router.fleet.health import HealthConfig
    from router.fleet.replicas import Pools
    from router.observe.metrics import RouterMetrics
    from sim.replica.metrics import ReplicaMetrics

    pools = Pools((), HealthConfig())
    router = RouterMetrics(pools, Weights(), cache_healthy=lambda: True)
    router.registry.register(DiscoveryCollector(pools, StaticSource([])))
    replica = ReplicaMetrics("m", lambda: 0.0, lambda: 0.0, lambda: 0.0)
    registries = (router.registry, CACHE, REGISTRY, replica.registry)
    return set().union(*map(_sample_names, registries)) | VLLM_NOT_SIMULATED
