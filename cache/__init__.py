"""PromptEdge response cache: exact (and semantic) answers from Redis, scoped per tenant,
model and context. The router talks to ``ResponseCache`` and uses only the names below
(import-linter holds it to them; tests/cache/test_public_surface.py checks the list).

Where things live: ``service`` (ResponseCache), ``keys`` and ``types`` (the request's canonical
form and key), ``exact`` (the exact stage), ``semantic/`` (the semantic stage: scope, index,
Redis store), ``embed/`` (encoders), ``verify/`` (whether a near match may be served: rules,
the learned verifier, the per-entry bound), ``warming/`` (predictive warming), ``stats/``
(counters and metrics), ``errors`` and ``redis_errors`` (the error tree, Redis's translated),
``settings``, ``cli``; ``training/`` holds the offline training and evaluation tools, which
serving code never imports.
"""

from cache.errors import CacheError, CacheUnavailable
from cache.exact import usage_tokens
from cache.keys import canonical_request, exact_key
from cache.semantic.cache import FOLLOW_SOCKET_TIMEOUT_S
from cache.service import ResponseCache, age_s
from cache.settings import CacheSettings
from cache.stats.metrics import metrics_text
from cache.types import CacheControl, CacheHit, CacheRequest
from cache.verify.bound.label import judgeable
from cache.warming.plan import WarmPolicy, allowance, choose, idle, peak_slot, wait_s
from cache.warming.popularity import Recipe, lock_key
from cache.warming.settings import WarmingSettings

__all__ = [
    "FOLLOW_SOCKET_TIMEOUT_S",
    "CacheControl",
    "CacheError",
    "CacheHit",
    "CacheRequest",
    "CacheSettings",
    "CacheUnavailable",
    "Recipe",
    "ResponseCache",
    "WarmPolicy",
    "WarmingSettings",
    "age_s",
    "allowance",
    "canonical_request",
    "choose",
    "exact_key",
    "idle",
    "judgeable",
    "lock_key",
    "metrics_text",
    "peak_slot",
    "usage_tokens",
    "wait_s",
]
