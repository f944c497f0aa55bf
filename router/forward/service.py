"""The request path of one completion (or embedding, /tokenize, /detokenize): validate, cache,
dispatch, forward, relay, store, count. The steps every surface shares (admission, the upstream
call, accounting) are the Forwarder's (router/forward/forwarder.py); this module is the completion
routes' own: the cache lookup, a hit served, shadow verification offered, a miss counted and stored.

Forwarded bodies are the client's bytes, re-serialised only to name a fallback pool's model or
to ask a stream for its usage (``forward_body``). Work the client does not wait for (parsing a
forwarded answer for usage, storing it) runs after the response is sent.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from starlette.background import BackgroundTask, BackgroundTasks
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from cache import CacheControl, CacheHit, CacheRequest, age_s, usage_tokens
from router.api.disconnect import CancelOnDisconnect
from router.api.schemas import Endpoint, parse_request
from router.caching import policy as cachepolicy
from router.caching import shadow
from router.errors import UpstreamError
from router.fleet.replicas import Replica
from router.forward import classify
from router.forward.forwarder import miss_headers
from router.observe.record import Record
from router.state import RouterState
from router.stream.relay import relay_stream
from router.stream.sse import parse_json, replay

log = logging.getLogger(__name__)

_PATHS = {
    "chat.completions": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
    "tokenize": "/tokenize",
    "detokenize": "/detokenize",
}
# Endpoints whose answers are cached (embeddings: exact only, cache/semantic/scope.py); /tokenize and
# /detokenize are cheap and not inference demand: neither cached nor in the traffic counters.
_CACHED: frozenset[Endpoint] = frozenset({"chat.completions", "completions", "embeddings"})
_STREAMED: frozenset[Endpoint] = frozenset({"chat.completions", "completions"})
_JSON = "application/json"
_SSE = "text/event-stream"
_UNCACHED = CacheControl(no_cache=True, no_store=True)


async def handle(state: RouterState, request: Request, endpoint: Endpoint) -> Response:
    """Answer one OpenAI completion request (stream or not), embeddings request (exact cache
    only) or vLLM /tokenize, /detokenize (never cached, not counted as demand: same
    dispatch, health, retries, metrics and log line). Raises APIError subclasses
    (after accounting for them); a streamed answer is accounted for when its stream ends."""
    return await state.forwarder.accounted(request, lambda rec: _handle(state, request, endpoint, rec))


async def _handle(state: RouterState, request: Request, endpoint: Endpoint, rec: Record) -> Response:
    forwarder = state.forwarder
    raw = await request.body()
    body = parse_request(raw, endpoint, state.settings.limits)
    headers = request.headers
    # /tokenize and /detokenize cost a request, not tokens of inference
    api_key = await forwarder.admit(
        rec, headers, body, headers.get("x-model") or body["model"], inference=endpoint in _CACHED
    )
    pool = rec.pool
    control = classify.cache_control(headers)
    if not api_key:
        control = classify.anonymous_control(control, state.settings.anonymous_cache)
    if cachepolicy.keeps_out(state.settings.cache_policy_for(pool), body):
        control = _UNCACHED
    # keyed by the pool that answers (X-Model or the body's model), not by the body alone
    keys = state.settings.api_keys
    tenant = classify.tenant(api_key, keys)
    if classify.is_private(headers):  # this key's own entries: not its tenant's, never semantic
        tenant, control = classify.private_scope(api_key, control)
    creq = CacheRequest(
        endpoint=endpoint,
        body=body,
        tenant=tenant,
        control=control,
        pool=pool,
        tenant_label=classify.tenant_label(api_key, keys),
    )
    stream = body.get("stream") is True and endpoint in _STREAMED
    include_usage = stream and _asks_usage(body)
    hit = await state.cache.lookup(creq) if endpoint in _CACHED else None
    if hit is not None:
        rec.cache = hit.kind
        return _serve_hit(state, rec, hit, stream, include_usage, creq, headers)
    rec.cache = "miss"
    rec.demand = endpoint in _CACHED
    forwarder.shed_or_fall_back(rec, fallback_allowed=endpoint in _STREAMED)
    ask_usage = stream and not include_usage
    raw = forward_body(body, raw, rec.target if rec.target != rec.pool else None, ask_usage)
    # another model's answer is not this one's
    store = creq if rec.target == rec.pool and endpoint in _CACHED else None
    async with CancelOnDisconnect(request.receive):
        upstream, lease = await forwarder.open(rec, _PATHS[endpoint], body, raw, headers, streamed=stream)
        if upstream.status_code >= 400:
            return await forwarder.failed(rec, upstream, lease)
        # the replica may say its answer is not for a shared cache, or fresh for so long only
        store = forwarder.answers.with_replica_control(rec, store, upstream.headers.get("cache-control"))
        if stream:
            return relay_stream(
                forwarder.relaying, rec, store, upstream, lease, miss_headers(rec, lease), strip_usage=ask_usage
            )
        content = await forwarder.read_answer(rec, upstream, lease)
    rec.first_byte_at = time.perf_counter()
    # A non-stream answer's first byte comes after the whole generation: not a TTFT sample.
    lease.replica.health.on_success(time.monotonic())
    rec.deferred = True
    return Response(
        content,
        media_type=_JSON,
        headers=miss_headers(rec, lease),
        background=BackgroundTask(_after_miss, state, rec, store, content, lease.replica),
    )


def _asks_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def forward_body(body: dict[str, Any], raw: bytes, model: str | None, ask_usage: bool) -> bytes:
    """The bytes sent to the replica: the client's own ``raw`` bytes, unless the router must
    change the body: ``model`` (a fallback pool's name, None = unchanged) or ``ask_usage``
    (``stream_options.include_usage`` set, so that a stream's answer has usage to count and
    store even when the client did not ask for it; relay_stream strips the usage chunk)."""
    if model is None and not ask_usage:
        return raw
    out = dict(body)
    if model is not None:
        out["model"] = model
    if ask_usage:
        options = body.get("stream_options")
        out["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    return json.dumps(out).encode()


def _serve_hit(
    state: RouterState,
    rec: Record,
    hit: CacheHit,
    stream: bool,
    include_usage: bool,
    creq: CacheRequest,
    client_headers: Any,
) -> Response:
    response = hit.response
    used = usage_tokens(response.get("usage"))
    prompt, completion = used or (0, 0)
    rec.prompt_tokens = prompt or rec.prompt_tokens
    rec.completion_tokens = completion
    # admission charged prompt + max_tokens; the stored answer's usage settles it, as for a miss
    # (after the answer is sent: a hit needs no other Redis round trip before it)
    settle = (
        BackgroundTask(state.limiter.settle, rec.api_key, rec.charged_tokens, sum(used))
        if rec.charged_tokens and used is not None
        else None
    )
    verify = (
        BackgroundTask(_offer_shadow, state, rec, creq, hit, client_headers)
        if state.shadow is not None and hit.kind == "semantic"
        else None
    )
    background = BackgroundTasks([settle, verify]) if settle and verify else settle or verify
    state.counters.count(rec.pool, miss=False, prompt_tokens=rec.prompt_tokens, completion_tokens=rec.completion_tokens)
    headers = {"x-cache": hit.kind}  # exact | semantic
    age = age_s(response)
    if age is not None:
        headers["age"] = str(int(age))  # HTTP's Age of a cached answer: seconds since the replica made it
    if hit.similarity is not None:
        headers["x-cache-similarity"] = f"{hit.similarity:.4f}"
    if hit.feedback_id is not None:  # this key may report it: POST /v1/cache/feedback (router/api/feedback.py)
        headers["x-promptedge-cache-hit-id"] = hit.feedback_id
    if stream:
        return StreamingResponse(
            _aiter(replay(response, include_usage)), media_type=_SSE, headers=headers, background=background
        )
    content = hit.raw if hit.raw is not None else json.dumps(response, separators=(",", ":"))
    return Response(content, media_type=_JSON, headers=headers, background=background)


async def _offer_shadow(state: RouterState, rec: Record, creq: CacheRequest, hit: CacheHit, headers: Any) -> None:
    """After a semantic hit's answer is sent: maybe verify it by a replica's own answer
    (router/caching/shadow.py). Only starts a task (router/caching/shadowing.py), so the next request on the
    client's connection does not wait for the replica."""
    assert state.shadow is not None
    # its own record: never finished, so it is no client request in the metrics or the access log
    call = Record(
        f"{rec.request_id}-shadow",
        time.perf_counter(),
        pool=rec.pool,
        target=rec.pool,
        priority=shadow.PRIORITY,
        claimed_priority=shadow.PRIORITY,
        size=rec.size,
        prompt_tokens=rec.prompt_tokens,
        cache="shadow",
        demand=False,
    )
    # what Forwarder.open reads from a client's headers: the replica sees the call's own id
    forward = {"x-request-id": call.request_id}
    for name in ("authorization", "x-session-id"):
        if name in headers:
            forward[name] = headers[name]
    state.shadow.offer(
        rec.pool,
        creq.body,
        lambda: _shadow_answer(state, call, creq, forward),
        lambda fresh: state.cache.verify_hit(creq, hit, fresh),
        lambda: not state.forwarder.sheds_now(call),
    )


async def _shadow_answer(
    state: RouterState, rec: Record, creq: CacheRequest, headers: dict[str, str]
) -> dict[str, Any] | None:
    """A replica's whole answer (parsed JSON) to the hit's request ``creq``, asked without
    streaming: the dispatch, lease, retries and health evidence of a forwarded request, the
    timeouts of ``rec.priority``; never stored, never counted as demand (the forecaster's
    counters hold what clients asked). None when the answer is not a JSON object. Raises
    APIError: NoReplica, UpstreamError (a replica error status, a transport failure, timeout)."""
    forwarder = state.forwarder
    upstream, lease = await forwarder.open(
        rec, _PATHS[creq.endpoint], dict(creq.body), shadow.shadow_body(creq.body), headers
    )
    if upstream.status_code >= 400:  # releases the lease; a 5xx is logged and raised there
        await forwarder.failed(rec, upstream, lease)
        raise UpstreamError(f"replica {lease.replica.url} answered {upstream.status_code}", code="replica_error")
    content = await forwarder.read_answer(rec, upstream, lease)
    lease.replica.health.on_success(time.monotonic())
    try:
        response = parse_json(content)
    except ValueError:
        return None
    return response if isinstance(response, dict) else None


async def _aiter(events: Iterator[bytes]) -> AsyncIterator[bytes]:
    for event in events:
        yield event


async def _after_miss(
    state: RouterState, rec: Record, store: CacheRequest | None, content: bytes, replica: Replica
) -> None:
    try:
        response = parse_json(content)
    except ValueError:
        response = None
    counts = usage_tokens(response.get("usage")) if isinstance(response, dict) else None
    if counts is not None:
        rec.prompt_tokens = counts[0] or rec.prompt_tokens
        rec.completion_tokens = counts[1]
        if rec.forwarded_at is not None and rec.first_byte_at is not None:
            replica.observe_answer(
                rec.first_byte_at - rec.forwarded_at, rec.completion_tokens, rec.prompt_tokens, time.monotonic()
            )
    if rec.demand:
        state.counters.count(
            rec.pool, miss=True, prompt_tokens=rec.prompt_tokens, completion_tokens=rec.completion_tokens
        )
    rec.finish(state.metrics, state.tracer)
    if rec.charged_tokens and counts is not None:  # the real usage corrects what admission charged
        await state.limiter.settle(rec.api_key, rec.charged_tokens, sum(counts))
    if store is not None and isinstance(response, dict):
        await state.forwarder.answers.store(rec, store, response, content)
