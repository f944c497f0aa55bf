"""Keeping a forwarded answer in the cache, and counting the answers the router does not keep.

The cache refuses what is not a complete answer on its own (cache/service.py ``store``); the
router decides, and counts in ``promptedge_router_cache_store_skipped_total{pool,reason}``:

- ``replica_cache_control``: the replica's ``Cache-Control`` said a shared cache must not keep
  it (router/caching/policy.py ``replica_control``);
- ``too_large``: the answer's JSON is over the cache's ``max_entry_bytes``
  (``PROMPTEDGE_CACHE_MAX_ENTRY_BYTES``); a stream past it is relayed whole but no longer
  assembled (router/stream/sse.py ``StreamAssembler.max_bytes``).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from prometheus_client import Counter

from cache import CacheRequest, ResponseCache
from router.caching import policy as cachepolicy
from router.observe.record import Record


class AnswerStore:
    """Stores forwarded answers in ``cache`` and counts the ones it keeps out in ``skipped_counter``
    (the Prometheus counter labelled (pool, reason) above). Built once by the Forwarder; the miss
    path, the stream relay and warming all store through it."""

    def __init__(self, cache: ResponseCache, skipped_counter: Counter) -> None:
        self.cache = cache
        self._skipped = skipped_counter

    @property
    def max_entry_bytes(self) -> int:
        """The largest answer (bytes of JSON) the cache keeps."""
        return self.cache.settings.max_entry_bytes

    def with_replica_control(
        self, rec: Record, store: CacheRequest | None, cache_control: str | None
    ) -> CacheRequest | None:
        """``store`` (what the answer would be stored under; None: not stored) as the replica's
        ``Cache-Control`` (``cache_control``) allows: None when it forbids storing (counted), its
        TTL capped by the replica's ``s-maxage`` / ``max-age``, else unchanged."""
        if store is None or cache_control is None:
            return store
        control = cachepolicy.replica_control(cache_control)
        if not control.store:
            if not store.control.no_store:  # would have been stored
                self.skipped(rec, "replica_cache_control")
            return None
        if control.ttl_cap_s is None:
            return store
        return replace(store, control=replace(store.control, ttl_cap_s=control.ttl_cap_s))

    async def store(
        self, rec: Record, store: CacheRequest, response: dict[str, Any], raw: bytes | None = None, warmed: bool = False
    ) -> bool:
        """Store ``response`` under ``store`` unless its JSON (``raw``, the replica's bytes, else
        serialised here, once) is over the cache's ``max_entry_bytes``: then counted ``too_large``.
        warmed: a warm generation (router/caching/warming.py), marked so by the cache. True when stored."""
        if store.control.no_store or not self.cache.settings.enabled:
            return False  # not stored anyway: no need to serialise it
        if raw is None:
            raw = json.dumps(response, separators=(",", ":")).encode()
        if len(raw) > self.cache.settings.max_entry_bytes:
            self.skipped(rec, "too_large")
            return False
        return await self.cache.store(store, response, raw, warmed=warmed)

    def skipped(self, rec: Record, reason: str) -> None:
        """Count one answer of ``rec``'s pool not stored, for ``reason`` (a bounded set, above)."""
        self._skipped.labels(rec.pool, reason).inc()
