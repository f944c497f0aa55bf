"""The Forwarder: how every surface sends a request to a replica and accounts for it.

One object per app, built by the lifespan (router/app.py) from the collaborators it uses, and
called by each surface that forwards: the completion routes (router/forward/service.py), the
Responses API (router/api/responses.py), other paths (router/api/other_paths.py), cache
feedback's rate limit (router/api/feedback.py), shadow verification and predictive warming
(router/caching/warming.py). Its steps, in request order:

- :meth:`accounted`: a Record for the request, counted and logged however it ends;
- :meth:`admit`: pool, priority, prompt size, rate limits (:meth:`rate_limit`);
- :meth:`shed_or_fall_back`: shed by priority, or the pool's fallback pool;
- :meth:`open`: dispatch and the upstream call, retried on replicas that provably never saw it;
- :meth:`read_answer` (a whole answer) or router/stream/relay.py (:attr:`relaying`, a stream);
- :meth:`failed`: a replica's >= 400 answer, relayed or translated.
"""

from __future__ import annotations

import logging
import math
import os
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from opentelemetry.trace import Tracer
from starlette.requests import Request
from starlette.responses import Response

from router.dispatch import Weights, lanes
from router.dispatch.admission import replica_pressure, sheds
from router.dispatch.affinity import prefix_key
from router.dispatch.prefix_index import conversation
from router.errors import APIError, ModelNotFound, NoReplica, RateLimited, UpstreamError, replica_error_body
from router.fleet.replicas import Lease, Pools, Replica
from router.forward import classify
from router.forward.chooser import Chooser
from router.forward.ratelimit import RateLimiter
from router.forward.storing import AnswerStore
from router.forward.tokens import PromptTokens
from router.forward.upstream import NotProcessed, RetryableStatus, Upstream, read_body, read_error_body
from router.observe.counters import TrafficCounters
from router.observe.metrics import RouterMetrics
from router.observe.record import Record
from router.settings import RouterSettings
from router.stream.relay import Relaying

log = logging.getLogger(__name__)

# The client's Authorization is its key to the router, not to a replica: never forwarded, except
# with forward_client_key to a replica without a backend key of the router's (router/forward/credentials.py).
_FORWARD_HEADERS = ("x-request-id",)
_JSON = "application/json"
PREFIX_POLICIES = ("prefix_aware", "predicted_ttft")  # policies that read the prefix index
MAX_ATTEMPTS = 3  # replicas tried that could not be connected to or reset the request unread (NotProcessed)
MAX_REFUSALS = 8  # replicas tried that answered 429/503
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")


class Forwarder:
    """Forwards requests to the replicas of ``pools`` and accounts for them (module doc).

    ``upstream``: the HTTP client to replicas; ``chooser``: the dispatch policy and its memory;
    ``limiter``: rate limits; ``prompt_tokens``: per-pool prompt token counts; ``answers``: where
    answers are stored; ``counters``, ``metrics``, ``tracer``: where requests are accounted."""

    def __init__(
        self,
        settings: RouterSettings,
        pools: Pools,
        upstream: Upstream,
        chooser: Chooser,
        limiter: RateLimiter,
        prompt_tokens: PromptTokens,
        answers: AnswerStore,
        counters: TrafficCounters,
        metrics: RouterMetrics,
        tracer: Tracer | None = None,
    ) -> None:
        self.settings = settings
        self.pools = pools
        self.upstream = upstream
        self.chooser = chooser
        self.limiter = limiter
        self.prompt_tokens = prompt_tokens
        self.answers = answers
        self.metrics = metrics
        self.tracer = tracer
        # what relaying a stream uses (router/stream/relay.py)
        self.relaying = Relaying(answers, settings.timeouts, counters, metrics, tracer, limiter)

    @property
    def weights(self) -> Weights:
        """The dispatch weights (admission's pressure reads them as dispatch does)."""
        return self.chooser.weights

    # -- accounting ---------------------------------------------------------------------------

    async def accounted(self, request: Request, inner: Callable[[Record], Awaitable[Response]]) -> Response:
        """Run ``inner`` with a new Record of the request and account for it: an APIError is
        counted and logged, then raised with ``X-Request-ID``; a response carries it and is
        accounted for now unless ``inner`` deferred that (``rec.deferred``: streams, misses). Any
        other exception is a bug: logged under the request id, counted, and raised as a 500 APIError
        with ``X-Request-ID``."""
        rec = Record(request_id(request.headers.get("x-request-id")), time.perf_counter())
        try:
            response = await inner(rec)
        except APIError as exc:
            rec.status = exc.status
            await self._settle_unanswered(rec)
            rec.finish(self.metrics, self.tracer)
            exc.headers = {**exc.headers, "x-request-id": rec.request_id}  # error answers carry it too
            raise
        except Exception:  # a bug: still counted, logged under the request id, answered as a 500 with it
            log.exception("unhandled error in request %s", rec.request_id)
            error = APIError("internal router error", code="internal_error")
            rec.status = error.status
            await self._settle_unanswered(rec)
            rec.finish(self.metrics, self.tracer)
            error.headers = {**error.headers, "x-request-id": rec.request_id}
            raise error from None
        response.headers["x-request-id"] = rec.request_id
        if not rec.deferred:
            if response.status_code >= 400:  # a replica's 4xx, relayed
                await self._settle_unanswered(rec)
            rec.finish(self.metrics, self.tracer)
        return response

    async def _settle_unanswered(self, rec: Record) -> None:
        """A request no replica generated for gives back every token admission took from its
        key's bucket: shed, no replica, every replica unreachable or busy (429/503), refused by a
        replica's 4xx. One that a replica may have generated for (the client left or timed out
        while it ran, the replica broke off) stays charged, as admission charged it: a client
        must not get generation for free by leaving early. Never raises (RateLimiter.settle)."""
        if rec.charged_tokens and not rec.may_have_generated:
            await self.limiter.settle(rec.api_key, rec.charged_tokens, 0)

    # -- admission ----------------------------------------------------------------------------

    async def admit(self, rec: Record, headers: Any, body: dict[str, Any], pool: str, inference: bool = True) -> str:
        """The checks every forwarded request passes before the cache and dispatch: ``pool``
        served here (else 404 ``model_not_found``), priority bounded by the tenant's, prompt size
        estimated and classed, rate limits (an ``inference`` request also spends tokens: its
        prompt estimate + its output bound). Fills ``rec``; returns the request's API key."""
        if pool not in self.pools:
            raise ModelNotFound(f"The model `{pool}` does not exist.", param="model", code="model_not_found")
        settings = self.settings
        rec.pool = rec.target = pool
        api_key = classify.api_key(headers)
        rec.claimed_priority = classify.priority(headers)
        rec.priority = classify.bounded_priority(
            rec.claimed_priority, api_key, settings.api_keys, settings.max_priority
        )
        rec.prompt_tokens = await self.prompt_tokens.count(pool, body)
        rec.size = classify.size_class(rec.prompt_tokens, settings.size_thresholds)
        if settings.rate_limits:  # off unless configured: then not even a coroutine per request
            tokens = rec.prompt_tokens + classify.max_output_tokens(body) if inference else 0
            rec.api_key, rec.charged_tokens = api_key, await self.rate_limit(api_key, tokens)
        return api_key

    async def rate_limit(self, api_key: str, tokens: int) -> int:
        """Admit one request of ``api_key`` costing ``tokens`` (0: a request, no tokens) under its
        rate limits. The tokens taken from the key's bucket (0: none, e.g. failed open); raises
        RateLimited (429, ``Retry-After``)."""
        wait, taken = await self.limiter.admit(api_key, tokens)
        if wait > 0:
            raise RateLimited(
                f"rate limit of this API key reached; retry in {wait:.1f} s",
                code="rate_limited",
                headers={"retry-after": str(max(1, math.ceil(wait)))},
            )
        return taken

    def shed_or_fall_back(self, rec: Record, fallback_allowed: bool = True) -> None:
        """Shed by priority when the pool is saturated, or send to its fallback pool (sets
        ``rec.target`` to it; raises RateLimited when the request is shed). ``fallback_allowed``
        False where another model's answer is no answer at all: embeddings (another vector
        space), token ids, a Responses API conversation held by this pool's replicas."""
        now = time.monotonic()
        if self._has_room(rec.pool, rec, now):
            return
        fallback = self.settings.fallback.get(rec.pool) if fallback_allowed else None
        if fallback is not None and fallback in self.pools and self._has_room(fallback, rec, now):
            rec.target = fallback
            return
        if self.pools.eligible(rec.pool, now):
            raise RateLimited(
                f"pool `{rec.pool}` is saturated: {rec.priority} requests are shed for now",
                code="pool_saturated",
                headers={"retry-after": "1"},
            )
        # no replica at all: open answers 503

    def sheds_now(self, rec: Record) -> bool:
        """True when ``rec.target``'s pool sheds ``rec``'s class now. A pool without an eligible
        replica sheds nothing: a request sent there fails with NoReplica, and is counted so."""
        now = time.monotonic()
        lane = self.lane(self.pools.eligible(rec.target, now), rec.size, now)
        return lane is not None and sheds(rec.priority, lane.pressure)

    def _has_room(self, pool: str, rec: Record, now: float) -> bool:
        lane = self.lane(self.pools.eligible(pool, now), rec.size, now)
        return lane is not None and not sheds(rec.priority, lane.pressure)

    def lane(self, replicas: list[Replica], size: str, now: float) -> lanes.Lane | None:
        """The lane (router/dispatch/lanes.py) of ``replicas`` a request of prompt ``size`` goes to, with the
        pressure admission sheds by; None for no replica. One lane unless some replica is ``long``."""
        settings, weights = self.settings, self.chooser.weights
        pressures: dict[str, list[int]] = {}
        for replica in replicas:
            pressures.setdefault(replica.spec.role, []).append(
                replica_pressure(replica.view(now), settings.queue_limit, settings.max_inflight_per_replica, weights)
            )
        return lanes.choose(lanes.own_lane(size), pressures)

    # -- the upstream call --------------------------------------------------------------------

    async def open(
        self,
        rec: Record,
        path: str,
        body: dict[str, Any],
        raw: bytes,
        headers: Any,
        method: str = "POST",
        pinned: str | None = None,
        content_type: str = _JSON,
        streamed: bool = False,
    ) -> tuple[httpx.Response, Lease]:
        """Send ``raw`` to ``path`` (with the query, if any) of a replica of ``rec.target``; on a
        failure that proves the replica never processed the request (NotProcessed: no connection,
        or a reset with the request unread by a replica whose port closed, router/forward/unread.py),
        a 429 or a 503, retry on a different replica; this runs before any byte of an answer
        reached the client (the response is returned unread). At most MAX_ATTEMPTS replicas that
        could not be connected to or reset (each may cost the connect timeout), at most MAX_REFUSALS that answered 429/503 (each costs one round trip; a
        scale-down drains several replicas at once, and every one of them refuses). ``pinned``: only the replica of that URL may take it (a
        Responses API follow-up: no other replica holds its state). ``streamed``: the answer is an
        SSE stream (else it comes whole: its prompt's pending prefill ends when a scrape shows the
        replica admitted it, router/fleet/replicas.py). Raises NoReplica (503) when the pool has no
        eligible replica, else the last replica error."""
        settings, chooser = self.settings, self.chooser
        tried: set[str] = set()
        last: APIError | None = None
        timeouts = settings.timeouts[rec.priority]
        prefix = prefix_key(body, settings.prefix_chars) if settings.prefix_affinity else None
        # prefix_aware scores each replica's probable prefix cache (router/dispatch/prefix_index.py) instead
        chunks = chooser.prefix_index.hashes(body) if settings.policy in PREFIX_POLICIES else None
        # predicted_ttft: the conversation's key and the share of the prompt its earlier turns sent
        turns = conversation(body) if settings.policy == "predicted_ttft" else (None, 0.0, 0.0)
        forward = {"content-type": content_type}
        for name in _FORWARD_HEADERS:
            if name in headers:
                forward[name] = headers[name]
        client_key = headers.get("authorization") if settings.forward_client_key else None
        if "x-request-id" in forward:
            forward["x-request-id"] = rec.request_id  # the client's only if it was a plain short token
        # A pool with replicas reserved for long prompts (router/dispatch/lanes.py); even when they are down,
        # so that the answer says the request left its lane.
        reserved = any(r.spec.role != lanes.NORMAL for r in self.pools.by_model.get(rec.target, ()))
        connect_failures = refusals = 0
        while connect_failures < MAX_ATTEMPTS and refusals < MAX_REFUSALS:
            now = time.monotonic()
            candidates = self.pools.eligible(rec.target, now, exclude=frozenset(tried))
            if pinned is not None:
                candidates = [r for r in candidates if r.url == pinned]
            if not candidates:
                break
            if reserved:
                lane = self.lane(candidates, rec.size, now)
                assert lane is not None  # candidates is not empty
                rec.lane = lane.name
                candidates = [r for r in candidates if r.spec.role == lane.name]
            replica, to_prefill = chooser.choose(
                candidates,
                now,
                session=headers.get("x-session-id"),
                prefix=prefix,
                chunks=chunks,
                prompt_tokens=rec.prompt_tokens,
                conversation=turns,
            )
            rec.replica, rec.profile = replica.url, replica.spec.profile or ""
            rec.forwarded_at = time.perf_counter()
            lease = replica.lease(to_prefill, streamed, cached_tokens=max(0, rec.prompt_tokens - to_prefill))
            opened = False
            # from here the replica may be generating, also when the client leaves during the await
            rec.may_have_generated = True
            try:
                authorization = replica.authorization or client_key
                sent = forward if authorization is None else {**forward, "authorization": authorization}
                response = await self.upstream.open(
                    replica.url + path, raw, sent, timeouts.connect_s, timeouts.ttfb_s, method
                )
                opened = True
                if 200 <= response.status_code < 300:  # for a non-stream answer: once it is done
                    chooser.accepted(replica, chunks)
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
                    self.metrics.retries.labels(rec.pool).inc()
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
            backoffs = [
                r.health.refused_until - now
                for r in self.pools.by_model.get(rec.target, ())
                if r.health.refused_until > now
            ]
            wait = max(1, math.ceil(min(backoffs, default=1.0)))
            raise NoReplica(
                f"every replica of pool `{rec.target}` tried is busy or draining (429/503); retry later",
                code="replica_busy",
                headers={"retry-after": str(wait)},
            )
        if last is not None:
            raise last
        raise NoReplica(
            f"no replica of pool `{rec.target}` is available (all down, warming up, ejected or stuck)",
            code="no_replica",
        )

    async def read_answer(self, rec: Record, upstream: httpx.Response, lease: Lease) -> bytes:
        """The whole body of an upstream answer within the ``ttfb_s`` of ``rec.priority`` (for a
        non-stream answer, the whole generation); releases the lease; a transport failure counts
        as the replica's health evidence and raises UpstreamError / UpstreamTimeout (502 / 504)."""
        try:
            content = await read_body(upstream, lease.replica.url, self.settings.timeouts[rec.priority].ttfb_s)
            lease.advanced()  # a whole answer: the replica generates (router/fleet/progress.py)
            return content
        except UpstreamError as exc:
            lease.replica.health.on_evidence(exc.evidence, time.monotonic())
            raise
        finally:
            lease.release()

    async def failed(
        self, rec: Record, upstream: httpx.Response, lease: Lease, client_key_sent: bool | None = None
    ) -> Response:
        """A replica answered >= 400: a client error (4xx) is relayed with its status, as it came
        when it is OpenAI error JSON, else wrapped in it (router/errors.py ``replica_error_body``);
        a 5xx becomes 502.
        Neither is cached. A 401/403 is the replica refusing the router's credential (none or the
        backend key, router/forward/credentials.py), not the client's: a 502 ``replica_auth_failed``,
        unless the client's own key was forwarded (``client_key_sent``; None: as ``forward_client_key``
        says, for a client's request), then relayed."""
        if client_key_sent is None:
            client_key_sent = self.settings.forward_client_key
        status = upstream.status_code
        try:  # bounded: only a few hundred bytes of it are ever used
            content = await read_error_body(upstream, lease.replica.url)
        finally:
            lease.release()
        if status in (401, 403) and not (client_key_sent and lease.replica.authorization is None):
            # Not a health signal either: the replica answered; its pool's key is misconfigured.
            raise UpstreamError(
                f"replica {lease.replica.url} refused the router's credentials ({status}): check "
                f"PROMPTEDGE_ROUTER_BACKEND_KEYS / the replica's backend_key",
                code="replica_auth_failed",
                headers={"x-promptedge-replica": lease.replica.url},
            )
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
        log.warning(
            "replica %s answered %d to request %s: %s",
            lease.replica.url,
            status,
            rec.request_id,
            content[:300].decode(errors="replace"),
        )
        raise UpstreamError(
            f"replica {lease.replica.url} answered {status} (request {rec.request_id}; the replica's "
            "error is in the router's log)",
            code="replica_error",
            headers={"x-promptedge-replica": lease.replica.url},
        )


def request_id(given: str | None) -> str:
    """The client's X-Request-ID if it is a plain token of at most 128 characters (it is logged,
    forwarded and echoed), else a new one: 128 random bits in hex, like uuid4().hex without
    building a UUID (a few us per request)."""
    if given is not None and _REQUEST_ID.fullmatch(given) is not None:
        return given
    return os.urandom(16).hex()


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
