"""``POST /v1/cache/feedback``: a client reports that a semantic hit it received was wrong.

Body ``{"hit_id": "<X-PromptEdge-Cache-Hit-Id of the hit>", "verdict": "wrong"}``, with an
API key of the tenant that received the hit (the hit record keeps the tenant, not the key).
A report counts as a request under the key's rate limits. The entry that answered becomes stricter
(cache/verify/bound/model.py); other tenants' entries and the pool's calibration are untouched, so a
client can only make its own hits rarer. Each hit can be reported once, within
``PROMPTEDGE_CACHE_FEEDBACK_TTL_S``. Off unless ``PROMPTEDGE_CACHE_FEEDBACK`` (and
``PROMPTEDGE_CACHE_ERROR_BOUND``) are set: 403 ``feedback_disabled``.

Answers: 200 ``{"applied": true}``; 404 ``unknown_hit`` (no such hit for this key: never
served, expired, already reported, another tenant's, or its entry is gone; the same answer for
each, so a key learns nothing about another's hits); 400 for a malformed body; 503 when Redis
does not answer.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from fastapi import APIRouter, Request

from cache import CacheUnavailable
from router.api.ops import CacheStatsUnavailable
from router.deps import StateDep
from router.errors import APIError, BadRequest, Forbidden
from router.forward import classify

feedback = APIRouter()
# one line per report: reports change what the cache serves, so abuse must be traceable
log = logging.getLogger("router.feedback")
HEADER = "x-promptedge-cache-hit-id"  # on semantic hits that may be reported
_HIT_ID = re.compile(r"[0-9a-f]{32}")
# A report is two short fields (~80 bytes); anything far past that is not a report, and parsing
# it costs the event loop (100,000 nested brackets overflowed the parser's recursion).
MAX_REPORT_BYTES = 1024


class UnknownHit(APIError):
    """404: no reportable hit of this id for this API key."""

    status = 404
    type = "invalid_request_error"


def parse_report(raw: bytes) -> str:
    """The hit id of a well-formed report; BadRequest naming the field otherwise (also for a
    body over ``MAX_REPORT_BYTES``)."""
    if len(raw) > MAX_REPORT_BYTES:
        raise BadRequest(f"a report is at most {MAX_REPORT_BYTES} bytes", code="invalid_body")
    try:
        body: Any = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise BadRequest("the body must be JSON", code="invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object", code="invalid_body")
    hit_id = body.get("hit_id")
    if not isinstance(hit_id, str) or _HIT_ID.fullmatch(hit_id) is None:
        raise BadRequest(
            "hit_id must be the 32 hex digits of the hit's X-PromptEdge-Cache-Hit-Id",
            param="hit_id",
            code="invalid_hit_id",
        )
    if body.get("verdict") != "wrong":
        raise BadRequest(
            'verdict must be "wrong" (only wrong hits are reported)', param="verdict", code="invalid_verdict"
        )
    return hit_id


async def _read_report(request: Request) -> bytes:
    """The body, read no further than ``MAX_REPORT_BYTES`` + 1 bytes: a longer one is refused
    (``parse_report``) without reading the rest, which the request limit would have allowed
    up to 8 MiB of."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_REPORT_BYTES:
            break
    return bytes(body)


@feedback.post("/v1/cache/feedback")
async def report(state: StateDep, request: Request) -> dict[str, Any]:
    """Report a wrong semantic hit (module doc)."""
    if not state.cache.settings.feedback:
        raise Forbidden("cache feedback is switched off: set PROMPTEDGE_CACHE_FEEDBACK", code="feedback_disabled")
    api_key = classify.api_key(request.headers)
    if state.settings.rate_limits:  # a report costs a Redis script: it is a request like any other
        await state.forwarder.rate_limit(api_key, 0)
    hit_id = parse_report(await _read_report(request))
    tenant = classify.tenant(api_key, state.settings.api_keys)
    try:
        applied = await state.cache.report_wrong(hit_id, tenant)
    except CacheUnavailable:
        raise CacheStatsUnavailable("cache unavailable: Redis does not answer", code="redis_unavailable") from None
    log.info(
        "cache feedback from tenant %s on hit %s...: %s", tenant, hit_id[:8], "applied" if applied else "unknown hit"
    )
    if not applied:
        raise UnknownHit("no reportable hit with this id for this API key", param="hit_id", code="unknown_hit")
    return {"applied": True}
