"""Exact-match entries in Redis: one JSON string per canonical request, fixed TTL."""

from __future__ import annotations

import json
import logging
from typing import Any

import redis.asyncio as aioredis

log = logging.getLogger(__name__)


def is_complete_response(response: Any) -> bool:
    """True for a successful, complete OpenAI non-stream response that may be cached.

    response: parsed JSON. Requires ``object`` ``chat.completion`` or ``text_completion``, no
    ``error`` field, and at least one choice, every choice with a ``finish_reason`` (a choice
    without one was cut off, so it is not the answer the client would get again).
    """
    if not isinstance(response, dict) or "error" in response:
        return False
    if response.get("object") not in ("chat.completion", "text_completion"):
        return False
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices:
        return False
    return all(isinstance(c, dict) and c.get("finish_reason") for c in choices)


class ExactStore:
    """Exact-cache entries: ``key -> JSON`` with ``SET .. EX ttl`` (never refreshed on read).

    Errors: redis exceptions propagate; the caller (ResponseCache) bounds and absorbs them.
    A corrupt entry (not JSON, or not a complete response) is counted in ``corrupt`` and
    treated as a miss.
    """

    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis
        self.corrupt = 0

    async def get(self, key: str) -> dict[str, Any] | None:
        raw = await self._redis.get(key)
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

    async def set(self, key: str, response: dict[str, Any], ttl_s: int) -> None:
        await self._redis.set(key, json.dumps(response, separators=(",", ":")), ex=ttl_s)
