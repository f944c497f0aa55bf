"""PromptEdge response cache: exact (and semantic) answers from Redis, scoped per tenant,
model and context. The router talks to ``ResponseCache``; everything else is internal."""

from cache.exact import usage_tokens
from cache.keys import canonical_request, exact_key
from cache.metrics import metrics_text
from cache.semantic import FOLLOW_SOCKET_TIMEOUT_S
from cache.service import CacheUnavailable, ResponseCache, age_s
from cache.settings import CacheSettings
from cache.types import CacheControl, CacheHit, CacheRequest

__all__ = [
    "FOLLOW_SOCKET_TIMEOUT_S",
    "CacheControl",
    "CacheHit",
    "CacheRequest",
    "CacheSettings",
    "CacheUnavailable",
    "ResponseCache",
    "age_s",
    "canonical_request",
    "exact_key",
    "metrics_text",
    "usage_tokens",
]
