"""OpenAI's Responses API (``POST /v1/responses``) in front of vLLM, with affinity.

vLLM keeps the responses it made in its own memory, so a request that continues one
(``previous_response_id``) can only be answered by the replica that made it. The router notes
``response id -> replica URL`` in Redis when an answer goes out (before its bytes reach the
client, so a follow-up can never outrun it), shared by every router worker, and sends a
follow-up to that replica only:

- id not known here: 404 ``previous_response_not_found`` (OpenAI's answer for an unknown id);
- its replica has left the pool (scaled down, replaced): 404 ``previous_response_not_found``,
  saying so, since no other replica holds it;
- its replica is in the pool but does not admit requests now (down, warming up, circuit
  open): 503 ``replica_unavailable``, retry later;
- Redis does not answer: 503 ``state_store_unavailable`` (``Retry-After: 1``), counted in
  ``promptedge_router_response_affinity_unavailable_total{op="lookup"}``. Fail closed: without
  the store the router cannot tell whose response an id is, and a replica holding it would
  continue another tenant's conversation (vLLM knows no tenants). A request without
  ``previous_response_id`` is served as usual; its id is then not noted (``op="note"``), so
  a later follow-up of it is a 404.

Answers are relayed, never cached (a response is stateful: ``store``, conversation state);
same admission, dispatch, retries (never past the pinned replica), health, metrics, log line and
traffic counters as completions (usage ``input_tokens`` / ``output_tokens``).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from cache import usage_tokens
from router.api.disconnect import CancelOnDisconnect
from router.api.schemas import parse_request
from router.errors import APIError, NoReplica, RedisUnavailable
from router.forward import classify
from router.forward.forwarder import miss_headers
from router.observe.record import Record
from router.redis_errors import redis_failures
from router.state import RouterState
from router.stream.relay import relay_stream
from router.stream.sse import StreamAssembler, parse_json

log = logging.getLogger(__name__)
PATH = "/v1/responses"
_KEY = "promptedge:responses:"
_REDIS_TIMEOUT_S = 0.25


class StateStoreUnavailable(NoReplica):
    """503: the store of response ids (Redis) does not answer, so a follow-up cannot be checked."""


class PreviousResponseNotFound(APIError):
    """404: the response a request continues is not held by any replica of its pool."""

    status = 404
    type = "invalid_request_error"


def usage_counts(usage: Any) -> dict[str, Any] | None:
    """A Responses API ``usage`` (``input_tokens``, ``output_tokens``) in the completions
    names the router counts by (``prompt_tokens``, ``completion_tokens``); None for no usage."""
    if not isinstance(usage, dict):
        return None
    return {"prompt_tokens": usage.get("input_tokens", 0), "completion_tokens": usage.get("output_tokens", 0)}


class ResponseStream(StreamAssembler):
    """Reads a Responses API event stream as it is relayed: the response's ``id`` (from its
    first event that carries the response) and, at ``response.completed`` / ``.incomplete``
    / ``.failed``, its end and usage. :meth:`result` is the final response (None until then)."""

    def __init__(self) -> None:
        super().__init__()
        self.response_id: str | None = None
        self._final: dict[str, Any] | None = None

    def _on_data(self, payload: bytes) -> None:
        try:
            event = parse_json(payload)
        except ValueError:
            return
        response = event.get("response") if isinstance(event, dict) else None
        if not isinstance(response, dict):
            return
        if self.response_id is None and isinstance(response.get("id"), str):
            self.response_id = response["id"]
        if event.get("type") in ("response.completed", "response.incomplete", "response.failed"):
            self.done = True
            self._final = response
            self._usage = usage_counts(response.get("usage"))

    def result(self) -> dict[str, Any] | None:
        """The final response object once the stream said it ended, else None."""
        return self._final


async def respond(state: RouterState, request: Request) -> Response:
    """``POST /v1/responses``, stream or not (see the module docstring)."""
    return await state.forwarder.accounted(request, lambda rec: _respond(state, request, rec))


async def _respond(state: RouterState, request: Request, rec: Record) -> Response:
    forwarder = state.forwarder
    raw = await request.body()
    body = parse_request(raw, "responses", state.settings.limits)
    headers = request.headers
    api_key = await forwarder.admit(rec, headers, body, headers.get("x-model") or body["model"])
    owner = classify.tenant(api_key, state.settings.api_keys)
    previous = body.get("previous_response_id")
    pinned = await _holder(state, rec, owner, previous) if isinstance(previous, str) else None
    rec.cache = "miss"
    forwarder.shed_or_fall_back(rec, fallback_allowed=False)
    async with CancelOnDisconnect(request.receive):
        upstream, lease = await forwarder.open(
            rec, PATH, body, raw, headers, pinned=pinned, streamed=body.get("stream") is True
        )
        if upstream.status_code >= 400:
            return await forwarder.failed(rec, upstream, lease)
        if body.get("stream") is True:
            stream = ResponseStream()
            noted: list[str] = []

            async def note_id() -> None:
                if stream.response_id is not None and not noted:
                    noted.append(stream.response_id)
                    await _remember(state, rec, owner, stream.response_id, lease.replica.url)

            return relay_stream(
                forwarder.relaying,
                rec,
                None,
                upstream,
                lease,
                miss_headers(rec, lease),
                assembler=stream,
                on_chunk=note_id,
            )
        content = await forwarder.read_answer(rec, upstream, lease)
    lease.replica.health.on_success(time.monotonic())
    try:
        answer = parse_json(content)
    except ValueError:
        answer = None
    if isinstance(answer, dict):
        if isinstance(answer.get("id"), str):
            await _remember(state, rec, owner, answer["id"], lease.replica.url)
        counts = usage_counts(answer.get("usage"))
        used = usage_tokens(counts)
        if used is not None:
            rec.prompt_tokens, rec.completion_tokens = used[0] or rec.prompt_tokens, used[1]
            if rec.charged_tokens:  # the real usage corrects what admission charged
                await state.limiter.settle(rec.api_key, rec.charged_tokens, sum(used))
    state.counters.count(rec.pool, miss=True, prompt_tokens=rec.prompt_tokens, completion_tokens=rec.completion_tokens)
    return Response(content, media_type="application/json", headers=miss_headers(rec, lease))


def affinity_key(owner: str, response_id: str) -> str:
    """The Redis key of ``response_id`` made for tenant ``owner`` (router/forward/classify.py
    ``tenant``): another tenant's follow-up with the same id finds nothing (404), so knowing
    an id is not enough to continue someone else's conversation on the replica holding it."""
    return f"{_KEY}{owner}:{response_id}"


async def _remember(state: RouterState, rec: Record, owner: str, response_id: str, url: str) -> None:
    """Note which replica holds ``response_id`` of tenant ``owner`` (for
    ``response_affinity_ttl_s``); a Redis failure costs the affinity of that response (a later
    follow-up is a 404), counted and logged (without a traceback), never the answer."""
    try:
        with redis_failures():
            await state.redis.set(affinity_key(owner, response_id), url, ex=state.settings.response_affinity_ttl_s)
    except RedisUnavailable as exc:
        state.metrics.affinity_unavailable.labels(rec.pool, "note").inc()
        log.warning(
            "response %s of request %s not noted for affinity: Redis unavailable (%s)",
            response_id,
            rec.request_id,
            exc.kind,
        )


async def _holder(state: RouterState, rec: Record, owner: str, response_id: str) -> str:
    """The URL of the replica of ``rec.pool`` holding ``response_id`` of tenant ``owner``;
    raises PreviousResponseNotFound (unknown id, another tenant's, or its replica left the
    pool), NoReplica (its replica does not admit requests now) or StateStoreUnavailable (Redis
    does not answer: the id's owner cannot be checked, so it is sent nowhere)."""
    pool = rec.pool
    try:
        with redis_failures():
            url = await state.redis.get(affinity_key(owner, response_id))
    except RedisUnavailable as exc:
        state.metrics.affinity_unavailable.labels(pool, "lookup").inc()
        log.warning(
            "request %s refused: Redis unavailable for the affinity of previous_response_id (%s)",
            rec.request_id,
            exc.kind,
        )
        raise StateStoreUnavailable(
            "the router's store of responses is unavailable, so previous_response_id "
            "cannot be checked now; retry later",
            param="previous_response_id",
            code="state_store_unavailable",
            headers={"retry-after": "1"},
        ) from None
    if url is None:
        raise PreviousResponseNotFound(
            f"Previous response with id '{response_id}' not found.",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    url = url.decode() if isinstance(url, bytes) else str(url)
    replica = next((r for r in state.pools.by_model.get(pool, ()) if r.url == url), None)
    if replica is None:
        raise PreviousResponseNotFound(
            f"Previous response with id '{response_id}' was held by replica {url}, "
            f"which is no longer in pool `{pool}`.",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    if not replica.health.admits(time.monotonic()):
        raise NoReplica(
            f"replica {url}, which holds previous response '{response_id}', is not available now; retry later",
            code="replica_unavailable",
            headers={"retry-after": "1"},
        )
    return url
