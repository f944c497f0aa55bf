"""The request path of one completion (or embedding, /tokenize, /detokenize): validate, cache,
dispatch, forward, relay, store, count.

Forwarded bodies are the client's bytes, re-serialised only to name a fallback pool's model or
to ask a stream for its usage (``forward_body``). Work the client does not wait for (parsing a
forwarded answer for usage, storing it) runs after the response is sent.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import httpx
from starlette.background import BackgroundTask, BackgroundTasks
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from cache import CacheControl, CacheHit, CacheRequest, age_s, usage_tokens
from router.caching import policy as cachepolicy
from router.caching import shadow
from router.forward import classify
from router.dispatch import lanes
from router.dispatch.admission import replica_pressure, sheds
from router.dispatch.affinity import prefix_key
from router.api.disconnect import CancelOnDisconnect
from router.errors import APIError, ModelNotFound, NoReplica, RateLimited, UpstreamError, replica_error_body
from router.observe.record import Record
from router.stream.relay import relay_stream
from router.fleet.replicas import Lease, Replica
from router.api.schemas import Endpoint, parse_request
from router.stream.sse import parse_json, replay
from router.state import RouterState
from router.forward.storing import store_answer, with_replica_control
from router.forward.upstream import NotProcessed, RetryableStatus, read_body, read_error_body

log = logging.getLogger(__name__)

_PATHS = {"chat.completions": "/v1/chat/completions", "completions": "/v1/completions",
          "embeddings": "/v1/embeddings", "tokenize": "/tokenize", "detokenize": "/detokenize"}
# Endpoints whose answers are cached (embeddings: exact only, cache/semantic/scope.py); /tokenize and
# /detokenize are cheap and not inference demand: neither cached nor in the traffic counters.
_CACHED: frozenset[Endpoint] = frozenset({"chat.completions", "completions", "embeddings"})
_STREAMED: frozenset[Endpoint] = frozenset({"chat.completions", "completions"})
# The client's Authorization is its key to the router, not to a replica: never forwarded, except
# with forward_client_key to a replica without a backend key of the router's (router/forward/credentials.py).
_FORWARD_HEADERS = ("x-request-id",)
_JSON = "application/json"
_SSE = "text/event-stream"
MAX_ATTEMPTS = 3  # replicas tried that could not be connected to or reset the request unread (NotProcessed)
MAX_REFUSALS = 8  # replicas tried that answered 429/503
_UNCACHED = CacheControl(no_cache=True, no_store=True)
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")


async def handle(state: RouterState, request: Request, endpoint: Endpoint) -> Response:
    """Answer one OpenAI completion request (stream or not), embeddings request (exact cache
    only) or vLLM /tokenize, /detokenize (never cached, not counted as demand: same
    dispatch, health, retries, metrics and log line). Raises APIError subclasses
    (after accounting for them); a streamed answer is accounted for when its stream ends."""
    return await accounted(state, request, lambda rec: _handle(state, request, endpoint, rec))


async def accounted(state: RouterState, request: Request,
                    inner: Callable[[Record], Awaitable[Response]]) -> Response:
    """Run ``inner`` with a new Record of the request and account for it: an APIError is
    counted and logged, then raised with ``X-Request-ID``; a response carries it and is
    accounted for now unless ``inner`` deferred that (``rec.deferred``: streams, misses). Any
    other exception is a bug: logged under the request id, counted, and raised as a 500 APIError
    with ``X-Request-ID``."""
    rec = Record(_request_id(request.headers.get("x-request-id")), time.perf_counter())
    try:
        response = await inner(rec)
    except APIError as exc:
        rec.status = exc.status
        await _settle_unanswered(state, rec)
        rec.finish(state.metrics, state.tracer)
        exc.headers = {**exc.headers, "x-request-id": rec.request_id}  # error answers carry it too
        raise
    except Exception:  # a bug: still counted, logged under the request id, answered as a 500 with it
        log.exception("unhandled error in request %s", rec.request_id)
        error = APIError("internal router error", code="internal_error")
        rec.status = error.status
        await _settle_unanswered(state, rec)
        rec.finish(state.metrics, state.tracer)
        error.headers = {**error.headers, "x-request-id": rec.request_id}
        raise error from None
    response.headers["x-request-id"] = rec.request_id
    if not rec.deferred:
        if response.status_code >= 400:  # a replica's 4xx, relayed
            await _settle_unanswered(state, rec)
        rec.finish(state.metrics, state.tracer)
    return response


async def _settle_unanswered(state: RouterState, rec: Record) -> None:
    """A request no replica generated for gives back every token admission took from its
    key's bucket: shed, no replica, every replica unreachable or busy (429/503), refused by a
    replica's 4xx. One that a replica may have generated for (the client left or timed out
    while it ran, the replica broke off) stays charged, as admission charged it: a client
    must not get generation for free by leaving early. Never raises (RateLimiter.settle)."""
    if rec.charged_tokens and not rec.may_have_generated:
        await state.limiter.settle(rec.api_key, rec.charged_tokens, 0)


def _request_id(given: str | None) -> str:
    """The client's X-Request-ID if it is a plain token of at most 128 characters (it is logged,
    forwarded and echoed), else a new one: 128 random bits in hex, like uuid4().hex without
    building a UUID (a few us per request)."""
    if given is not None and _REQUEST_ID.fullmatch(given) is not None:
        return given
    return os.urandom(16).hex()


async def _handle(state: RouterState, request: Request, endpoint: Endpoint, rec: Record) -> Response:
    raw = await request.body()
    body = parse_request(raw, endpoint, state.settings.limits)
    headers = request.headers
    # /tokenize and /detokenize cost a request, not tokens of inference
    api_key = await admit_request(state, rec, headers, body, headers.get("x-model") or body["model"],
                                  inference=endpoint in _CACHED)
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
    creq = CacheRequest(endpoint=endpoint, body=body, tenant=tenant, control=control,
                        pool=pool, tenant_label=classify.tenant_label(api_key, keys))
    stream = body.get("stream") is True and endpoint in _STREAMED
    include_usage = stream and _asks_usage(body)
    hit = await state.cache.lookup(creq) if endpoint in _CACHED else None
    if hit is not None:
        rec.cache = hit.kind
        return _serve_hit(state, rec, hit, stream, include_usage, creq, headers)
    rec.cache = "miss"
    rec.demand = endpoint in _CACHED
    shed_or_fall_back(state, rec, fallback_allowed=endpoint in _STREAMED)
    ask_usage = stream and not include_usage
    raw = forward_body(body, raw, rec.target if rec.target != rec.pool else None, ask_usage)
    # another model's answer is not this one's
    store = creq if rec.target == rec.pool and endpoint in _CACHED else None
    async with CancelOnDisconnect(request.receive):
        upstream, lease = await open_upstream(state, rec, _PATHS[endpoint], body, raw, headers, streamed=stream)
        if upstream.status_code >= 400:
            return await upstream_failed(rec, upstream, lease, state.settings.forward_client_key)
        # the replica may say its answer is not for a shared cache, or fresh for so long only
        store = with_replica_control(state, rec, store, upstream.headers.get("cache-control"))
        if stream:
            return relay_stream(state, rec, store, upstream, lease, miss_headers(rec, lease), strip_usage=ask_usage)
        content = await read_answer(upstream, lease, state.settings.timeouts[rec.priority].ttfb_s)
    rec.first_byte_at = time.perf_counter()
    # A non-stream answer's first byte comes after the whole generation: not a TTFT sample.
    lease.replica.health.on_success(time.monotonic())
    rec.deferred = True
    return Response(content, media_type=_JSON, headers=miss_headers(rec, lease),
                    background=BackgroundTask(_after_miss, state, rec, store, content, lease.replica))


async def admit_request(state: RouterState, rec: Record, headers: Any, body: dict[str, Any], pool: str,
                        inference: bool = True) -> str:
    """The checks every forwarded request passes before the cache and dispatch: ``pool``
    served here (else 404 ``model_not_found``), priority bounded by the tenant's, prompt size
    estimated and classed, rate limits (an ``inference`` request also spends tokens: its
    prompt estimate + its output bound). Fills ``rec``; returns the request's API key."""
    if pool not in state.pools:
        raise ModelNotFound(f"The model `{pool}` does not exist.", param="model", code="model_not_found")
    rec.pool = rec.target = pool
    api_key = classify.api_key(headers)
    rec.claimed_priority = classify.priority(headers)
    rec.priority = classify.bounded_priority(rec.claimed_priority, api_key, state.settings.api_keys,
                                             state.settings.max_priority)
    rec.prompt_tokens = await state.prompt_tokens.count(pool, body)
    rec.size = classify.size_class(rec.prompt_tokens, state.settings.size_thresholds)
    if state.settings.rate_limits:  # off unless configured: then not even a coroutine per request
        tokens = rec.prompt_tokens + classify.max_output_tokens(body) if inference else 0
        rec.api_key, rec.charged_tokens = api_key, await rate_limit(state, api_key, tokens)
    return api_key


async def rate_limit(state: RouterState, api_key: str, tokens: int) -> int:
    """Admit one request of ``api_key`` costing ``tokens`` (0: a request, no tokens) under its
    rate limits. The tokens taken from the key's bucket (0: none, e.g. failed open); raises
    RateLimited (429, ``Retry-After``)."""
    wait, taken = await state.limiter.admit(api_key, tokens)
    if wait > 0:
        raise RateLimited(f"rate limit of this API key reached; retry in {wait:.1f} s", code="rate_limited",
                          headers={"retry-after": str(max(1, math.ceil(wait)))})
    return taken


def shed_or_fall_back(state: RouterState, rec: Record, fallback_allowed: bool = True) -> None:
    """Shed by priority when the pool is saturated, or send to its fallback pool (sets
    ``rec.target`` to it; raises RateLimited when the request is shed). ``fallback_allowed``
    False where another model's answer is no answer at all: embeddings (another vector
    space), token ids, a Responses API conversation held by this pool's replicas."""
    settings, now = state.settings, time.monotonic()
    if _has_room(state, rec.pool, rec, now):
        return
    fallback = settings.fallback.get(rec.pool) if fallback_allowed else None
    if fallback is not None and fallback in state.pools and _has_room(state, fallback, rec, now):
        rec.target = fallback
        return
    if state.pools.eligible(rec.pool, now):
        raise RateLimited(f"pool `{rec.pool}` is saturated: {rec.priority} requests are shed for now",
                          code="pool_saturated", headers={"retry-after": "1"})
    # no replica at all: _open answers 503


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


def _has_room(state: RouterState, pool: str, rec: Record, now: float) -> bool:
    lane = _lane(state, state.pools.eligible(pool, now), rec.size, now)
    return lane is not None and not sheds(rec.priority, lane.pressure)


def _lane(state: RouterState, replicas: list[Replica], size: str, now: float) -> lanes.Lane | None:
    """The lane (router/dispatch/lanes.py) of ``replicas`` a request of prompt ``size`` goes to, with the
    pressure admission sheds by; None for no replica. One lane unless some replica is ``long``."""
    settings = state.settings
    pressures: dict[str, list[int]] = {}
    for replica in replicas:
        pressures.setdefault(replica.spec.role, []).append(replica_pressure(
            replica.view(now), settings.queue_limit, settings.max_inflight_per_replica, state.weights))
    return lanes.choose(lanes.own_lane(size), pressures)


def miss_headers(rec: Record, lease: Lease) -> dict[str, str]:
    """Headers of a forwarded answer: ``X-Cache: miss``, the replica, and the fallback pool /
    lane (and the lane it spilled from) when they apply."""
    headers = {"x-cache": "miss", "x-promptedge-replica": lease.replica.url}
    if rec.target != rec.pool:
        headers["x-promptedge-fallback"] = rec.target
    if rec.lane:  # only in a pool with replicas reserved for long prompts
        headers["x-promptedge-lane"] = rec.lane
        if rec.lane != lanes.own_lane(rec.size):
            headers["x-promptedge-spilled-from"] = lanes.own_lane(rec.size)
    return headers


def _serve_hit(state: RouterState, rec: Record, hit: CacheHit, stream: bool, include_usage: bool,
               creq: CacheRequest, client_headers: Any) -> Response:
    response = hit.response
    used = usage_tokens(response.get("usage"))
    prompt, completion = used or (0, 0)
    rec.prompt_tokens = prompt or rec.prompt_tokens
    rec.completion_tokens = completion
    # admission charged prompt + max_tokens; the stored answer's usage settles it, as for a miss
    # (after the answer is sent: a hit needs no other Redis round trip before it)
    settle = BackgroundTask(state.limiter.settle, rec.api_key, rec.charged_tokens, sum(used)) \
        if rec.charged_tokens and used is not None else None
    verify = BackgroundTask(_offer_shadow, state, rec, creq, hit, client_headers) \
        if state.shadow is not None and hit.kind == "semantic" else None
    background = BackgroundTasks([settle, verify]) if settle and verify else settle or verify
    state.counters.count(rec.pool, miss=False, prompt_tokens=rec.prompt_tokens,
                         completion_tokens=rec.completion_tokens)
    headers = {"x-cache": hit.kind}  # exact | semantic
    age = age_s(response)
    if age is not None:
        headers["age"] = str(int(age))  # HTTP's Age of a cached answer: seconds since the replica made it
    if hit.similarity is not None:
        headers["x-cache-similarity"] = f"{hit.similarity:.4f}"
    if hit.feedback_id is not None:  # this key may report it: POST /v1/cache/feedback (router/api/feedback.py)
        headers["x-promptedge-cache-hit-id"] = hit.feedback_id
    if stream:
        return StreamingResponse(_aiter(replay(response, include_usage)), media_type=_SSE, headers=headers,
                                 background=background)
    content = hit.raw if hit.raw is not None else json.dumps(response, separators=(",", ":"))
    return Response(content, media_type=_JSON, headers=headers, background=background)


async def _offer_shadow(state: RouterState, rec: Record, creq: CacheRequest, hit: CacheHit, headers: Any) -> None:
    """After a semantic hit's answer is sent: maybe verify it by a replica's own answer
    (router/caching/shadow.py). Only starts a task (router/caching/shadowing.py), so the next request on the
    client's connection does not wait for the replica."""
    assert state.shadow is not None
    # its own record: never finished, so it is no client request in the metrics or the access log
    call = Record(f"{rec.request_id}-shadow", time.perf_counter(), pool=rec.pool, target=rec.pool,
                  priority=shadow.PRIORITY, claimed_priority=shadow.PRIORITY, size=rec.size,
                  prompt_tokens=rec.prompt_tokens, cache="shadow", demand=False)
    # what open_upstream reads from a client's headers: the replica sees the call's own id
    forward = {"x-request-id": call.request_id}
    for name in ("authorization", "x-session-id"):
        if name in headers:
            forward[name] = headers[name]
    state.shadow.offer(rec.pool, creq.body, lambda: _shadow_answer(state, call, creq, forward),
                       lambda fresh: state.cache.verify_hit(creq, hit, fresh),
                       lambda: not _sheds_now(state, call))


def _sheds_now(state: RouterState, rec: Record) -> bool:
    """True when ``rec.target``'s pool sheds ``rec``'s class now. A pool without an eligible
    replica sheds nothing: a request sent there fails with NoReplica, and is counted so."""
    now = time.monotonic()
    lane = _lane(state, state.pools.eligible(rec.target, now), rec.size, now)
    return lane is not None and sheds(rec.priority, lane.pressure)


async def _shadow_answer(state: RouterState, rec: Record, creq: CacheRequest,
                         headers: dict[str, str]) -> dict[str, Any] | None:
    """A replica's whole answer (parsed JSON) to the hit's request ``creq``, asked without
    streaming: the dispatch, lease, retries and health evidence of a forwarded request, the
    timeouts of ``rec.priority``; never stored, never counted as demand (the forecaster's
    counters hold what clients asked). None when the answer is not a JSON object. Raises
    APIError: NoReplica, UpstreamError (a replica error status, a transport failure, timeout)."""
    upstream, lease = await open_upstream(state, rec, _PATHS[creq.endpoint], dict(creq.body),
                                          shadow.shadow_body(creq.body), headers)
    if upstream.status_code >= 400:  # releases the lease; a 5xx is logged and raised there
        await upstream_failed(rec, upstream, lease, state.settings.forward_client_key)
        raise UpstreamError(f"replica {lease.replica.url} answered {upstream.status_code}", code="replica_error")
    content = await read_answer(upstream, lease, state.settings.timeouts[rec.priority].ttfb_s)
    lease.replica.health.on_success(time.monotonic())
    try:
        response = parse_json(content)
    except ValueError:
        return None
    return response if isinstance(response, dict) else None


async def _aiter(events: Iterator[bytes]) -> AsyncIterator[bytes]:
    for event in events:
        yield event


async def open_upstream(state: RouterState, rec: Record, path: str, body: dict[str, Any], raw: bytes,
                        headers: Any, method: str = "POST", pinned: str | None = None,
                        content_type: str = _JSON, streamed: bool = False) -> tuple[httpx.Response, Lease]:
    """Send ``raw`` to ``path`` (with the query, if any) of a replica of ``rec.target``; on a
    failure that proves the replica never processed the request (NotProcessed: no connection,
    or a reset with the request unread by a replica whose port closed; router/forward/unread.py),
    a 429 or a 503, retry on a different replica; this runs before any byte of an answer
    reached the client (the response is returned unread). At most MAX_ATTEMPTS replicas that
    could not be connected to or reset (each may cost the connect timeout), at most MAX_REFUSALS that answered 429/503 (each costs one round trip; a
    scale-down drains several replicas at once, and every one of them refuses). ``pinned``: only the replica of that URL may take it (a
    Responses API follow-up: no other replica holds its state). ``streamed``: the answer is an
    SSE stream (else it comes whole: its prompt's pending prefill ends when a scrape shows the
    replica admitted it, router/fleet/replicas.py). Raises NoReplica (503) when the pool has no
    eligible replica, else the last replica error."""
    tried: set[str] = set()
    last: APIError | None = None
    timeouts = state.settings.timeouts[rec.priority]
    prefix = prefix_key(body, state.settings.prefix_chars) if state.settings.prefix_affinity else None
    # prefix_aware scores each replica's probable prefix cache (router/dispatch/prefix_index.py) instead
    chunks = state.prefix_index.hashes(body) if state.settings.policy == "prefix_aware" else None
    forward = {"content-type": content_type}
    for name in _FORWARD_HEADERS:
        if name in headers:
            forward[name] = headers[name]
    client_key = headers.get("authorization") if state.settings.forward_client_key else None
    if "x-request-id" in forward:
        forward["x-request-id"] = rec.request_id  # the client's only if it was a plain short token
    # A pool with replicas reserved for long prompts (router/dispatch/lanes.py); even when they are down,
    # so that the answer says the request left its lane.
    reserved = any(r.spec.role != lanes.NORMAL for r in state.pools.by_model.get(rec.target, ()))
    connect_failures = refusals = 0
    while connect_failures < MAX_ATTEMPTS and refusals < MAX_REFUSALS:
        now = time.monotonic()
        candidates = state.pools.eligible(rec.target, now, exclude=frozenset(tried))
        if pinned is not None:
            candidates = [r for r in candidates if r.url == pinned]
        if not candidates:
            break
        if reserved:
            lane = _lane(state, candidates, rec.size, now)
            assert lane is not None  # candidates is not empty
            rec.lane = lane.name
            candidates = [r for r in candidates if r.spec.role == lane.name]
        replica, to_prefill = state.choose(candidates, now, session=headers.get("x-session-id"), prefix=prefix,
                                           chunks=chunks, prompt_tokens=rec.prompt_tokens)
        rec.replica, rec.profile = replica.url, replica.spec.profile or ""
        rec.forwarded_at = time.perf_counter()
        lease = replica.lease(to_prefill, streamed)
        opened = False
        # from here the replica may be generating, also when the client leaves during the await
        rec.may_have_generated = True
        try:
            authorization = replica.authorization or client_key
            sent = forward if authorization is None else {**forward, "authorization": authorization}
            response = await state.upstream.open(replica.url + path, raw, sent, timeouts.connect_s, timeouts.ttfb_s,
                                                 method)
            opened = True
            if 200 <= response.status_code < 300:  # for a non-stream answer: once it is done
                state.accepted(replica, chunks)
        except (NotProcessed, RetryableStatus) as exc:  # provably never processed by the replica
            rec.may_have_generated = False
            replica.health.on_evidence(exc.evidence, time.monotonic())
            if isinstance(exc, RetryableStatus):
                replica.health.on_refused(time.monotonic(), exc.retry_after_s)
                refusals += 1
            else:
                connect_failures += 1
            tried.add(replica.url)
            last = exc
            if connect_failures < MAX_ATTEMPTS and refusals < MAX_REFUSALS:
                rec.retries += 1
                state.metrics.retries.labels(rec.pool).inc()
            continue
        except UpstreamError as exc:  # may have reached the replica: never sent twice
            replica.health.on_evidence(exc.evidence, time.monotonic())
            raise
        finally:
            if not opened:  # also on cancellation (client gone while connecting)
                lease.release()
        return response, lease
    if isinstance(last, RetryableStatus):  # every replica tried said "not now": so do we
        now = time.monotonic()
        backoffs = [r.health.refused_until - now for r in state.pools.by_model.get(rec.target, ())
                    if r.health.refused_until > now]
        wait = max(1, math.ceil(min(backoffs, default=1.0)))
        raise NoReplica(f"every replica of pool `{rec.target}` tried is busy or draining (429/503); retry later",
                        code="replica_busy", headers={"retry-after": str(wait)})
    if last is not None:
        raise last
    raise NoReplica(f"no replica of pool `{rec.target}` is available (all down, warming up, ejected or stuck)",
                    code="no_replica")


async def read_answer(upstream: httpx.Response, lease: Lease, total_s: float) -> bytes:
    """The whole body of an upstream answer within ``total_s`` seconds (the priority's
    ``ttfb_s``: for a non-stream answer, the whole generation); releases the lease; a transport
    failure counts as the replica's health evidence and raises UpstreamError / UpstreamTimeout
    (502 / 504)."""
    try:
        content = await read_body(upstream, lease.replica.url, total_s)
        lease.advanced()  # a whole answer: the replica generates (router/fleet/progress.py)
        return content
    except UpstreamError as exc:
        lease.replica.health.on_evidence(exc.evidence, time.monotonic())
        raise
    finally:
        lease.release()


async def upstream_failed(rec: Record, upstream: httpx.Response, lease: Lease, client_key_sent: bool) -> Response:
    """A replica answered >= 400: a client error (4xx) is relayed with its status, as it came
    when it is OpenAI error JSON, else wrapped in it (router/errors.py ``replica_error_body``);
    a 5xx becomes 502.
    Neither is cached. A 401/403 is the replica refusing the router's credential (none or the
    backend key, router/forward/credentials.py), not the client's: a 502 ``replica_auth_failed``,
    unless the client's own key was forwarded (``forward_client_key``), then relayed."""
    status = upstream.status_code
    try:  # bounded: only a few hundred bytes of it are ever used
        content = await read_error_body(upstream, lease.replica.url)
    finally:
        lease.release()
    if status in (401, 403) and not (client_key_sent and lease.replica.authorization is None):
        # Not a health signal either: the replica answered; its pool's key is misconfigured.
        raise UpstreamError(f"replica {lease.replica.url} refused the router's credentials ({status}): check "
                            f"PROMPTEDGE_ROUTER_BACKEND_KEYS / the replica's backend_key", code="replica_auth_failed",
                            headers={"x-promptedge-replica": lease.replica.url})
    if status < 500:
        lease.replica.health.on_success(time.monotonic())
        rec.status = status
        rec.may_have_generated = False  # it refused the request
        # OpenAI error JSON as it came; anything else (an HTML page, FastAPI's {"detail": ...})
        # in OpenAI's shape with the same status, which OpenAI clients can read
        content_type = upstream.headers.get("content-type", _JSON)
        wrapped = replica_error_body(status, content, content_type)
        if wrapped is not None:
            content, content_type = wrapped, _JSON
        return Response(content, status_code=status, media_type=content_type, headers=miss_headers(rec, lease))
    lease.replica.health.on_evidence(UpstreamError.evidence, time.monotonic())
    # The replica's error body is for the operator: it can hold internals (paths, hosts, a
    # credential in a message), so it goes to the log under the request id, not to the client.
    log.warning("replica %s answered %d to request %s: %s", lease.replica.url, status, rec.request_id,
                content[:300].decode(errors="replace"))
    raise UpstreamError(f"replica {lease.replica.url} answered {status} (request {rec.request_id}; the replica's "
                        "error is in the router's log)", code="replica_error",
                        headers={"x-promptedge-replica": lease.replica.url})


async def _after_miss(state: RouterState, rec: Record, store: CacheRequest | None, content: bytes,
                      replica: Replica) -> None:
    try:
        response = parse_json(content)
    except ValueError:
        response = None
    counts = usage_tokens(response.get("usage")) if isinstance(response, dict) else None
    if counts is not None:
        rec.prompt_tokens = counts[0] or rec.prompt_tokens
        rec.completion_tokens = counts[1]
        if rec.forwarded_at is not None and rec.first_byte_at is not None:
            replica.observe_answer(rec.first_byte_at - rec.forwarded_at, rec.completion_tokens, rec.prompt_tokens,
                                   time.monotonic())
    if rec.demand:
        state.counters.count(rec.pool, miss=True, prompt_tokens=rec.prompt_tokens,
                             completion_tokens=rec.completion_tokens)
    rec.finish(state.metrics, state.tracer)
    if rec.charged_tokens and counts is not None:  # the real usage corrects what admission charged
        await state.limiter.settle(rec.api_key, rec.charged_tokens, sum(counts))
    if store is not None and isinstance(response, dict):
        await store_answer(state, rec, store, response, content)
