"""Typed data at the cache's boundary: what the router asks and what the cache answers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

from cache.keys import Endpoint, request_digest

__all__ = ["CacheControl", "CacheHit", "CacheRequest", "Endpoint", "HitKind", "Outcome"]

HitKind = Literal["exact", "semantic"]
Outcome = Literal["exact", "semantic", "miss"]


@dataclass(frozen=True)
class CacheControl:
    """Per-request cache controls, parsed from request headers by the router.

    no_cache: skip lookup (``Cache-Control: no-cache``); the response may still be stored.
    no_store: skip storing (``Cache-Control: no-store``).
    ttl_s: per-request TTL in seconds, clamped to the settings' bounds; None = default.
    threshold: semantic similarity threshold override in [0, 1]; None = default, 0 means 0.
      The cache raises it to ``CacheSettings.min_request_threshold`` (a client cannot loosen
      matching below the operator's floor).
    semantic: False = exact stage only, for lookup and store (the router's policy for clients
      without an API key: ``PROMPTEDGE_ROUTER_ANONYMOUS_CACHE``).
    max_age_s: the oldest answer the client accepts, in seconds since the replica created it
      (``Cache-Control: max-age``, aged by the response's ``created``); None = any age.
    ttl_cap_s: the longest an answer may be kept, in seconds, applied after the TTL's bounds
      (the replica's ``s-maxage`` / ``max-age``); None = no cap.
    """

    no_cache: bool = False
    no_store: bool = False
    ttl_s: int | None = None
    threshold: float | None = None
    semantic: bool = True
    max_age_s: int | None = None
    ttl_cap_s: int | None = None


@dataclass(frozen=True)
class CacheRequest:
    """One OpenAI request as the cache sees it.

    endpoint: which OpenAI API the body belongs to.
    body: the parsed request JSON, already validated by the router (model, messages or prompt).
    tenant: the tenant the API key maps to; entries never cross tenants.
    pool: the model (pool) whose replicas answer, when it is not the body's ``model`` (the
      router's ``X-Model``); part of the key, and the model the entry is counted and deleted by.
    tenant_label: the tenant's name in the statistics and metrics, from a bounded set (the
      router folds API keys it has no mapping for into ``other``); None = ``tenant``. Isolation
      always uses ``tenant``.
    """

    endpoint: Endpoint
    body: Mapping[str, Any]
    tenant: str = "default"
    control: CacheControl = field(default_factory=CacheControl)
    pool: str | None = None
    tenant_label: str | None = None

    @property
    def model(self) -> str:
        """The pool that answers: ``pool``, else the body's ``model``."""
        return self.pool if self.pool is not None else str(self.body.get("model", ""))

    @property
    def label(self) -> str:
        """The tenant as statistics and metrics name it (``tenant_label``, else ``tenant``)."""
        return self.tenant if self.tenant_label is None else self.tenant_label

    @cached_property
    def digest(self) -> str:
        """SHA-256 hex of the canonical request (cache/keys.py), computed once: a lookup and
        the store after it both need it. ``body`` must not change after the first use."""
        return request_digest(self.endpoint, self.body, self.tenant, self.pool)


@dataclass(frozen=True)
class CacheHit:
    """A response served from the cache.

    response: OpenAI non-stream response JSON (``chat.completion`` or ``text_completion``).
    similarity: cosine similarity of a semantic hit, None for an exact hit.
    key: the Redis key of the entry that was served.
    raw: ``response`` as stored (JSON bytes), when at hand: it can be sent without serialising
    ``response`` again.
    feedback_id: with ``CacheSettings.feedback``, the id under which the client that received
    this semantic hit may report it wrong (``ResponseCache.report_wrong``); else None.
    entry_id: the semantic entry that answered (its per-entry bound state is what
    ``ResponseCache.verify_hit`` labels); None for an exact hit.
    bound_score: what the per-entry bound judged the hit by (the learned verifier's
    probability with ``verifier`` "learned"); None: ``similarity``.
    """

    kind: HitKind
    response: dict[str, Any]
    similarity: float | None
    key: str
    raw: bytes | None = None
    feedback_id: str | None = None
    entry_id: str | None = None
    bound_score: float | None = None
