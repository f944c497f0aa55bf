"""Exact-match entries in Redis: one JSON string per canonical request, fixed TTL."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from typing import Any

import redis.asyncio as aioredis

from cache.keys import exact_owners_key

log = logging.getLogger(__name__)


MAX_USAGE_TOKENS = 2**31  # far above any context; a larger count is no real usage


def usage_tokens(usage: Any) -> tuple[int, int] | None:
    """(prompt_tokens, completion_tokens) of an OpenAI ``usage`` object, each a non-negative
    integer below MAX_USAGE_TOKENS (a missing count is 0); None for anything else (not an
    object, a negative, fractional, string, boolean or infinite count). Everything that counts
    or stores a replica's usage reads it through here: a replica's ``prompt_tokens: -1`` once
    made every later hit of that entry a 500."""
    if not isinstance(usage, dict):
        return None
    counts = []
    for field in ("prompt_tokens", "completion_tokens"):
        value = usage.get(field, 0)
        if value is None:
            value = 0
        if type(value) is not int or not 0 <= value < MAX_USAGE_TOKENS:
            return None
        counts.append(value)
    return counts[0], counts[1]


def expected_choices(endpoint: str, body: Mapping[str, Any]) -> int:
    """How many choices (embeddings: ``data`` items) a complete answer to ``body`` has: ``n``
    (default 1) per prompt; a completions ``prompt`` or an embeddings ``input`` that is a list
    of texts or of token-id lists is that many inputs."""
    n = body.get("n") if endpoint != "embeddings" else 1
    count = n if type(n) is int and n > 0 else 1
    inputs = body.get({"completions": "prompt", "embeddings": "input"}.get(endpoint, ""))
    if isinstance(inputs, list) and inputs and all(isinstance(p, (str, list)) for p in inputs):
        count *= len(inputs)
    return count


def _is_embeddings(response: dict[str, Any], count: int | None) -> bool:
    data = response.get("data")
    if not isinstance(data, list) or not data:
        return False
    if not all(
        isinstance(d, dict) and d.get("object") == "embedding" and isinstance(d.get("embedding"), (list, str))
        for d in data
    ):
        return False
    return count is None or sorted(d.get("index", 0) for d in data) == list(range(count))


def is_complete_response(response: Any, count: int | None = None) -> bool:
    """True for a successful, complete OpenAI non-stream response that may be cached.

    response: parsed JSON. An embeddings answer (``object`` ``list``) needs ``data`` of
    ``embedding`` objects (``count`` of them when given, indices 0..count-1). Else requires
    ``object`` ``chat.completion`` or ``text_completion``, no
    ``error`` field, and at least one choice, every choice with a ``finish_reason`` (a choice
    without one was cut off, so it is not the answer the client would get again), and a
    ``usage`` that is absent or valid (:func:`usage_tokens`). count: when given, exactly that
    many choices with the indices 0..choices-1 (an ``n`` > 1 answer is cached whole or not at
    all, never one choice for n).
    """
    if not isinstance(response, dict) or "error" in response:
        return False
    if response.get("usage") is not None and usage_tokens(response["usage"]) is None:
        return False
    if response.get("object") == "list":
        return _is_embeddings(response, count)
    if response.get("object") not in ("chat.completion", "text_completion"):
        return False
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices:
        return False
    if not all(isinstance(c, dict) and c.get("finish_reason") for c in choices):
        return False
    return count is None or sorted(c.get("index", 0) for c in choices) == list(range(count))


# KEYS[1] = the entry, KEYS[2] = its scope's owners list (one slot: cache/keys.py's scope tag).
_SET_LUA = """
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[5])
"""
# KEYS[1] = a scope's owners list, KEYS[2..] = entries of that scope; ARGV = their owner members.
# Returns how many entries existed.
_DELETE_LUA = """
local n = 0
if #KEYS > 1 then n = redis.call('DEL', unpack(KEYS, 2)) end
redis.call('ZREM', KEYS[1], unpack(ARGV))
return n
"""
_DELETE_CHUNK = 500  # keys per script call (Lua's unpack limit is far above it)


class ExactStore:
    """Exact-cache entries: ``key -> JSON`` with ``SET .. EX ttl`` (never refreshed on read).

    Every key is also listed in its scope's sorted set (``exact_owners_key``:
    ``{prefix}:exact-owners:{<scope tag>}``, the entry's Redis Cluster slot) as the JSON member
    ``[tenant, model, key]`` scored by its expiry time (Unix s), so entries can be deleted by
    tenant and/or model; members past their expiry are pruned on every write of that scope.

    hot_redis: the client for :meth:`get_raw` and :meth:`set`, the calls on a request's path
    (default: ``redis``); the deletes use ``redis``.

    Errors: redis exceptions propagate; the caller (ResponseCache) bounds and absorbs them.
    A corrupt entry (not JSON, or not a complete response) is counted in ``corrupt`` and
    treated as a miss.
    """

    def __init__(self, redis: aioredis.Redis, prefix: str, hot_redis: aioredis.Redis | None = None) -> None:
        self._redis = redis
        self._hot = hot_redis or redis
        self._prefix = prefix
        self._set = self._hot.register_script(_SET_LUA)
        self._delete = redis.register_script(_DELETE_LUA)
        self.corrupt = 0

    async def get(self, key: str) -> dict[str, Any] | None:
        return self.decode(key, await self.get_raw(key))

    async def get_raw(self, key: str) -> bytes | None:
        """The stored JSON at ``key`` as is (None: no entry); see decode()."""
        return await self._hot.get(key)  # type: ignore[no-any-return]

    def decode(self, key: str, raw: bytes | None) -> dict[str, Any] | None:
        """The response stored at ``key`` from its raw value (None: no entry, or a corrupt one)."""
        if raw is None:
            return None
        try:
            response = json.loads(raw)
        except ValueError:
            response = None
        if not is_complete_response(response):
            self.corrupt += 1
            log.warning("skipping corrupt cache entry %s", key)
            return None
        return response

    async def set(
        self, key: str, response: dict[str, Any], ttl_s: int, tenant: str, model: str, raw: bytes | None = None
    ) -> None:
        """Store ``response`` (``key``: ``exact_key`` of the same tenant and model); ``raw``:
        its JSON as received (stored as is, instead of serialising ``response`` again)."""
        now = time.time()
        value = raw if raw is not None else json.dumps(response, separators=(",", ":"))
        # One script (atomic, like MULTI, but one command to send and one reply to parse).
        await self._set(
            keys=[key, exact_owners_key(self._prefix, tenant, model)],
            args=[value, ttl_s, now, now + ttl_s, json.dumps([tenant, model, key])],
        )

    async def _owner_lists(self, tenant: str | None, model: str | None) -> list[str]:
        if tenant is not None and model is not None:
            return [exact_owners_key(self._prefix, tenant, model)]
        # Any tenant or any model: every scope's list. SCAN, not KEYS (no stall of Redis); a
        # cluster client's scan_iter visits every primary, so it finds lists on all nodes.
        match = f"{self._prefix}:exact-owners:*"
        return sorted(
            {
                k.decode() if isinstance(k, bytes) else k
                async for k in self._redis.scan_iter(match=match, count=1000, _type="zset")
            }
        )

    async def delete_where(self, tenant: str | None, model: str | None) -> int:
        """Delete the entries of a tenant and/or model (None = any); returns how many existed."""
        deleted = 0
        for owners in await self._owner_lists(tenant, model):
            members = await self._redis.zrange(owners, 0, -1)
            doomed: list[tuple[bytes | str, str]] = []
            for member in members:
                owner_tenant, owner_model, key = json.loads(member)
                if (tenant is None or owner_tenant == tenant) and (model is None or owner_model == model):
                    doomed.append((member, key))
            for start in range(0, len(doomed), _DELETE_CHUNK):
                chunk = doomed[start : start + _DELETE_CHUNK]
                deleted += int(
                    await self._delete(keys=[owners, *(key for _, key in chunk)], args=[member for member, _ in chunk])
                )
        return deleted
