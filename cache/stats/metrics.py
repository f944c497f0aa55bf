"""Prometheus metrics of the cache, in the cache's own registry (``metrics_text()``; the
router's /metrics appends it to its own series).

Per process, so sum them across workers in PromQL; the Redis counters (cache/stats/store.py) are the
cross-worker truth behind /cache/stats. Label values are bounded: ``model`` is a configured pool
and ``tenant`` a tenant label (mapped tenants, ``default``, ``other``; see CacheRequest.label).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from cache.stats.store import LookupEvent

REGISTRY = CollectorRegistry()

LOOKUPS = Counter(
    "promptedge_cache_lookups_total",
    "Cache lookups by outcome (exact, semantic, miss).",
    ["model", "tenant", "outcome"],
    registry=REGISTRY,
)
SIMILARITY = Histogram(
    "promptedge_cache_semantic_similarity",
    "Cosine similarity of served semantic hits.",
    ["model"],
    buckets=(0.8, 0.85, 0.9, 0.92, 0.94, 0.95, 0.96, 0.97, 0.98, 0.99, 1.0),
    registry=REGISTRY,
)
TOKENS_SAVED = Counter(
    "promptedge_cache_tokens_saved_total",
    "Prompt + completion tokens served from cache.",
    ["model", "tenant"],
    registry=REGISTRY,
)
REPLICA_SECONDS_SAVED = Counter(
    "promptedge_cache_replica_seconds_saved_total",
    "Estimated replica service time saved by cache hits (s).",
    ["model", "tenant"],
    registry=REGISTRY,
)
SEMANTIC_SKIPPED = Counter(
    "promptedge_cache_semantic_skipped_total",
    "Requests the semantic stage did not judge, by reason (non_text, tools, too_long, ...).",
    ["reason"],
    registry=REGISTRY,
)
REJECTED = Counter(
    "promptedge_cache_rejected_total",
    "Cached entries found but not served, by reason (verification rule, stale, corrupt).",
    ["reason"],
    registry=REGISTRY,
)
WARM_HITS = Counter(
    "promptedge_cache_warm_hits_total",
    "Exact hits served from entries the warmer regenerated (a subset of the exact hits; "
    "cache/README.md, Predictive warming).",
    ["model"],
    registry=REGISTRY,
)
LOOKUP_SECONDS = Histogram(
    "promptedge_cache_lookup_seconds",
    "Cache lookup latency by outcome (s).",
    ["outcome"],
    buckets=(0.001, 0.002, 0.005, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 0.5),
    registry=REGISTRY,
)


# The children of the per-lookup series by label values: labels() checks and locks on every call.
_LOOKUP_CHILDREN: dict[tuple[str, str, str], tuple[Counter, Histogram]] = {}


def observe(event: LookupEvent, seconds: float) -> None:
    """Add one counted lookup to the process's metrics."""
    key = (event.model, event.tenant, event.outcome)
    children = _LOOKUP_CHILDREN.get(key)
    if children is None:
        children = _LOOKUP_CHILDREN[key] = (LOOKUPS.labels(*key), LOOKUP_SECONDS.labels(event.outcome))
    children[0].inc()
    children[1].observe(seconds)
    if event.outcome != "miss":
        TOKENS_SAVED.labels(event.model, event.tenant).inc(event.tokens_saved)
        REPLICA_SECONDS_SAVED.labels(event.model, event.tenant).inc(event.replica_s_saved)
    if event.similarity is not None:
        SIMILARITY.labels(event.model).observe(event.similarity)
    if event.skipped:
        SEMANTIC_SKIPPED.labels(event.skipped).inc()
    for reason, n in event.rejected.items():
        REJECTED.labels(reason).inc(n)


def metrics_text() -> bytes:
    """Prometheus text exposition of the cache's series."""
    return generate_latest(REGISTRY)
