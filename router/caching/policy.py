"""Which requests the cache may answer and store, by the pool's policy (pure).

``PROMPTEDGE_ROUTER_CACHE_POLICY`` (router/settings.py ``CachePolicy``) per pool: a sampled
request (:func:`is_sampled`) or one asking for ``n`` > 1 choices can be kept out of the cache
for a pool where repeating one sample is wrong. Whatever the policy, an ``n`` > 1 answer is
stored only whole (cache/exact.py ``expected_choices``). A replica's own ``Cache-Control`` says
whether and how long its answer may be kept (:func:`replica_control`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
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


@dataclass(frozen=True)
class ReplicaControl:
    """What a replica's answer allows a shared cache: ``store`` it or not, and for at most
    ``ttl_cap_s`` seconds (None: the cache's own TTL)."""

    store: bool = True
    ttl_cap_s: int | None = None


# one directive: a token, optionally = a token or a quoted string (which may hold commas)
_DIRECTIVE = re.compile(r'\s*([^\s,="]+)\s*(?:=\s*("(?:[^"\\]|\\.)*"|[^,]*))?\s*(?:,|$)')
_STORE_ALL = ReplicaControl()
_DELTA_SECONDS = re.compile(r"[0-9]+")


def replica_control(value: str | None) -> ReplicaControl:
    """Read a replica's ``Cache-Control`` response header (``value``; None: none) as a shared
    cache must (RFC 9111, section 5.2.2; directive names compared case-insensitively):

    - ``no-store``, ``private``: not stored;
    - ``no-cache``, ``max-age=0``, ``s-maxage=0``: not stored either. RFC 9111 lets a cache
      keep such an answer only to revalidate it with the origin before each reuse; a router in
      front of LLM replicas cannot revalidate (an answer has no validator, and asking the
      replica again is generating it again), so a stored copy could never be served;
    - ``s-maxage=N``, else ``max-age=N`` (N > 0; a shared cache prefers ``s-maxage``): kept at
      most N seconds (``ttl_cap_s``; the cache's own TTL still applies when shorter);
    - a qualified ``no-cache="field"`` or ``private="field"`` names header fields only; the
      cache keeps no header of the replica's, so the answer itself may be stored;
    - a ``max-age`` / ``s-maxage`` that is not a number of seconds, or given twice: stale
      (RFC 9111, section 4.2.1, "caches are encouraged to consider the response to be
      stale"), so not stored.
    """
    if not value:
        return _STORE_ALL
    ages: dict[str, list[str]] = {}
    for match in _DIRECTIVE.finditer(value):
        name, argument = match.group(1).lower(), match.group(2)
        if name in ("no-store",) or (name in ("no-cache", "private") and argument is None):
            return ReplicaControl(store=False)
        if name in ("max-age", "s-maxage"):
            ages.setdefault(name, []).append((argument or "").strip().strip('"'))
    seconds = ages.get("s-maxage") or ages.get("max-age")
    if seconds is None:
        return _STORE_ALL
    # delta-seconds is ASCII digits (str.isdigit() is true for "\u00b2", which int() refuses);
    # one too large for int() or for any TTL is 2**31 (RFC 9111, section 1.2.2)
    if len(seconds) != 1 or _DELTA_SECONDS.fullmatch(seconds[0]) is None:
        return ReplicaControl(store=False)
    digits = seconds[0].lstrip("0")
    if not digits:
        return ReplicaControl(store=False)
    return ReplicaControl(ttl_cap_s=int(digits) if len(digits) <= 10 else 2**31)
