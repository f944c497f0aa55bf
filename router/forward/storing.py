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

from cache import CacheRequest
from router.caching import policy as cachepolicy
from router.observe.record import Record
from router.state import RouterState


def with_replica_control(state: RouterState, rec: Record, store: CacheRequest | None,
                         cache_control: str | None) -> CacheRequest | None:
    """``store`` (what the answer would be stored under; None: not stored) as the replica's
    ``Cache-Control`` (``cache_control``) allows: None when it forbids storing (counted), its
    TTL capped by the replica's ``s-maxage`` / ``max-age``, else unchanged."""
    if store is None or cache_control is None:
        return store
    control = cachepolicy.replica_control(cache_control)
    if not control.store:
        if not store.control.no_store:  # would have been stored
            skipped(state, rec, "replica_cache_control")
        return None
    if control.ttl_cap_s is None:
        return store
    return replace(store, control=replace(store.control, ttl_cap_s=control.ttl_cap_s))


async def store_answer(state: RouterState, rec: Record, store: CacheRequest, response: dict[str, Any],
                       raw: bytes | None = None, warmed: bool = False) -> bool:
    """Store ``response`` under ``store`` unless its JSON (``raw``, the replica's bytes, else
    serialised here, once) is over the cache's ``max_entry_bytes``: then counted ``too_large``.
    warmed: a warm generation (router/caching/warming.py), marked so by the cache. True when stored."""
    if store.control.no_store or not state.cache.settings.enabled:
        return False  # not stored anyway: no need to serialise it
    if raw is None:
        raw = json.dumps(response, separators=(",", ":")).encode()
    if len(raw) > state.cache.settings.max_entry_bytes:
        skipped(state, rec, "too_large")
        return False
    return await state.cache.store(store, response, raw, warmed=warmed)


def skipped(state: RouterState, rec: Record, reason: str) -> None:
    """Count one answer of ``rec``'s pool not stored, for ``reason`` (a bounded set, above)."""
    state.metrics.store_skipped.labels(rec.pool, reason).inc()
