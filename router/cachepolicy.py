"""Which requests the cache may answer and store, by the pool's policy (pure).

``PROMPTEDGE_ROUTER_CACHE_POLICY`` (router/settings.py ``CachePolicy``) per pool: a sampled
request (:func:`is_sampled`) or one asking for ``n`` > 1 choices can be kept out of the cache
for a pool where repeating one sample is wrong. Whatever the policy, an ``n`` > 1 answer is
stored only whole (cache/exact.py ``expected_choices``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from router.settings import CachePolicy


def is_sampled(body: Mapping[str, Any]) -> bool:
    """True when the request samples its answer, so asking again would give another one:
    ``temperature`` above 0 (absent or null = 1, OpenAI's default), unless it is greedy anyway
    (``top_k`` 1, vLLM's ``use_beam_search``) or reproducible (a ``seed``: vLLM and OpenAI
    repeat a seeded sample). ``top_p`` below 1 narrows sampling but does not end it."""
    if body.get("use_beam_search") is True or body.get("top_k") == 1 or body.get("seed") is not None:
        return False
    temperature = body.get("temperature")
    return temperature is None or temperature > 0


def choices_asked(body: Mapping[str, Any]) -> int:
    """``n`` of the request (1 when absent or not an integer)."""
    n = body.get("n")
    return n if type(n) is int and n > 0 else 1


def keeps_out(policy: CachePolicy, body: Mapping[str, Any]) -> bool:
    """True when the pool's ``policy`` keeps the request out of the cache (neither lookup nor
    store): a sampled request when ``cache_sampled`` is off, ``n`` > 1 when ``cache_n`` is off."""
    return (not policy.cache_sampled and is_sampled(body)) or (not policy.cache_n and choices_asked(body) > 1)
