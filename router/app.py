"""The FastAPI app factory and its lifespan (creates and closes every long-lived client)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from httpx_aiohttp import AiohttpTransport
from redis.asyncio import Redis
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse

from cache import FOLLOW_SOCKET_TIMEOUT_S, CacheSettings, ResponseCache
from opskit.redis_client import async_redis
from router.api import other_paths
from router.api.bodylimit import BodyLimit
from router.api.fastpath import RouterApp
from router.api.feedback import feedback
from router.api.ops import ops
from router.api.routes import add_completion_routes
from router.caching.shadowing import ShadowVerifier
from router.caching.warming import Warmer, WarmingDeps, warming_configured
from router.discovery import DiscoveredReplica, DiscoveryCollector, ReplicaSource, StaticSource, apply, build_source
from router.dispatch import Weights
from router.dispatch.affinity import PrefixMap
from router.dispatch.prefix_index import PrefixIndexes
from router.dispatch.ttft import TtftConfig
from router.errors import APIError, BadRequest
from router.fleet.health import HealthConfig
from router.fleet.replicas import Pools
from router.fleet.scraper import Scraper
from router.forward.chooser import Chooser
from router.forward.credentials import Credentials
from router.forward.forwarder import Forwarder
from router.forward.ratelimit import RateLimiter
from router.forward.storing import AnswerStore
from router.forward.tokens import PromptTokens
from router.forward.upstream import Upstream
from router.observe.counters import SimClock, TrafficCounters
from router.observe.metrics import RouterMetrics
from router.observe.metrics_shared import publish_every
from router.observe.tracing import make_tracer
from router.settings import RouterSettings
from router.state import RouterState

log = logging.getLogger("router")


def cache_client(url: str) -> Redis:
    """The Redis client for ``url`` (opskit/redis_client.py schemes) of the exact cache's
    lookup and store, the two commands of a proxied miss: no socket timeout and no connect
    timeout. The cache bounds each of those calls itself, connecting included
    (``CacheSettings.redis_timeout_s``); redis-py implements a socket timeout with an
    ``asyncio.wait_for`` Task per command sent (Python 3.11), and a connect timeout of the
    router's would override the cache's own bound. ``socket_timeout=None`` said out loud:
    redis-py 8 gives a connection that names none a 5 s socket timeout. Only for calls bounded
    by their caller: the start-up index rebuild, the admin deletes and the warmer keep the
    client with redis-py's default (attack round: on this client, a hung Redis held a router's
    start-up for 70 s instead of 16 s). Raises RedisURLError for a URL it cannot read; connects
    lazily (the first command raises redis errors)."""
    return async_redis(url, socket_timeout=None)


def create_app(settings: RouterSettings | None = None, discovery: ReplicaSource | None = None) -> FastAPI:
    """A router app for ``settings`` (default: read from the environment); its replicas come
    from ``discovery`` (default: ``build_source(settings)``, router/discovery/config.py).
    Raises CredentialError when a backend key of ``settings.backend_keys`` cannot be read."""
    settings = settings or RouterSettings()
    credentials = Credentials(settings.backend_keys)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # opskit.async_redis: one server, Redis Cluster or Sentinel, from the URL's scheme
        redis = async_redis(
            settings.redis_url, socket_timeout=settings.redis_timeout_s, socket_connect_timeout=settings.redis_timeout_s
        )
        # The cache's own clients: redis-py's socket timeout (5 s by default in redis-py 8) on the
        # one for everything but the exact lookup and store, which bound every call themselves
        cache_redis = async_redis(settings.redis_url)
        exact_redis = cache_client(settings.redis_url)
        # the semantic index follower's blocking XREAD: a socket timeout longer than its block
        follow_redis = async_redis(settings.redis_url, socket_timeout=FOLLOW_SOCKET_TIMEOUT_S)
        upstream = Upstream(settings.upstream_transport, settings.max_connections)
        # aiohttp transport: measured 0.7 ms CPU per scrape against 1.5 ms on httpx's own (router/README.md).
        probe_client = httpx.AsyncClient(transport=AiohttpTransport(), timeout=settings.scrape_timeout_s)
        cache_settings = CacheSettings() if settings.cache_ttl_s is None else CacheSettings(ttl_s=settings.cache_ttl_s)
        pools = Pools(
            (),
            HealthConfig(rise=settings.health_rise, fall=settings.health_fall, stuck_after_s=settings.stuck_after_s),
            credentials,
        )
        weights = Weights(
            stale_after_s=settings.stale_after_s,
            prefix=settings.prefix_weight,
            ttft=TtftConfig(workers=settings.workers),  # each worker sees its own requests only
        )
        scraper = Scraper(pools, probe_client, settings.scrape_interval_s, settings.health_interval_s)
        clock = SimClock(settings.clock_origin, settings.clock_scale)
        counters = TrafficCounters(redis, clock, settings.counters_flush_s, [])
        # what prompt prefixes went where, for policy prefix_aware (router/dispatch/prefix_index.py)
        prefix_index = PrefixIndexes(settings.prefix_chunk_chars, settings.prefix_kv_tokens)
        source = discovery or build_source(settings)
        if isinstance(source, StaticSource):
            credentials.check(source.specs)

        def on_replicas(snapshot: list[DiscoveredReplica]) -> None:
            changes = apply(pools, snapshot)
            counters.models = sorted(pools.by_model)
            if changes.removed:
                metrics.forget_replicas(changes.removed)  # bounded series under autoscaling
                prefix_index.forget([r.url for r in pools.all()])  # and bounded prefix indexes
            if changes:
                log.info(
                    "replicas: added %s, removed %s, draining %s", changes.added, changes.removed, changes.draining
                )

        # the cache counts requests per time of day for warming on the router's (maybe simulated) clock
        cache = ResponseCache(
            redis,
            cache_settings,
            bounded_redis=cache_redis,
            follow_redis=follow_redis,
            clock=clock.now,
            exact_redis=exact_redis,
        )
        # load the embedding model before serving: importing it in the background would stall the
        # event loop (GIL) and time out Redis calls; if it fails, the exact cache still serves
        await cache.start()
        tracer, tracer_provider = make_tracer(settings.otel_exporter, settings.otel_endpoint)
        metrics = RouterMetrics(pools, weights, cache_healthy=lambda: cache.healthy)
        metrics.register(DiscoveryCollector(pools, source))
        limiter = RateLimiter(redis, settings.rate_limits, settings.api_keys)
        # the one object every surface forwards through (router/forward/forwarder.py)
        forwarder = Forwarder(
            settings,
            pools,
            upstream,
            Chooser(settings.policy, weights, PrefixMap(settings.prefix_ttl_s), prefix_index),
            limiter,
            PromptTokens.load(settings.tokenizers),
            AnswerStore(cache, metrics.store_skipped),
            counters,
            metrics,
            tracer,
        )
        app.state.router = RouterState(
            settings=settings,
            redis=redis,
            cache=cache,
            pools=pools,
            scraper=scraper,
            counters=counters,
            metrics=metrics,
            limiter=limiter,
            forwarder=forwarder,
            tracer=tracer,
            shadow=ShadowVerifier(cache_settings.shadow_rate, cache_settings.shadow_max_inflight, metrics.shadow)
            if cache_settings.shadow_rate > 0 and cache_settings.enabled
            else None,
        )
        await source.start(on_replicas)
        await scraper.start()
        counters.start()
        # --workers N: this worker's scrape-time series copied for the others' scrapes (router/observe/metrics_shared.py)
        publisher = None if metrics.shared is None else asyncio.create_task(publish_every(metrics.shared))
        # predictive cache warming (router/caching/warming.py): a task per pool with warming on, none otherwise
        warmer = (
            Warmer(WarmingDeps(forwarder, redis, cache, metrics.warm), clock.now, settings.clock_scale)
            if warming_configured(cache.settings)
            else None
        )
        if warmer is not None:
            warmer.start()
        try:
            yield
        finally:
            if warmer is not None:  # before the clients its generations use are closed
                await warmer.stop()
            if publisher is not None:
                publisher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await publisher
            await source.stop()
            await scraper.stop()
            await counters.stop()
            if app.state.router.shadow is not None:  # before the clients its calls use are closed
                await app.state.router.shadow.aclose()
            await cache.aclose()
            await upstream.aclose()
            await probe_client.aclose()
            await redis.aclose()
            await cache_redis.aclose()
            await exact_redis.aclose()
            await follow_redis.aclose()
            if tracer_provider is not None:
                tracer_provider.shutdown()

    # FastAPI's native OpenTelemetry hooks off: the router's telemetry is its own spans
    # (router/observe/tracing.py, otel_exporter) and /metrics; left on, FastAPI asks the global providers
    # (environment lookups) on every request, ~2 % of the CPU of a proxied request (py-spy).
    # redirect_slashes off: Starlette answered a trailing slash with a 307 to the Host header's
    # host (an open redirect that keeps the POST body); a wrong path is an OpenAI 404 instead.
    # No /openapi.json: an edge router need not list its admin routes to the internet.
    # RouterApp: the completion routes are answered ahead of the middleware stack (router/api/fastpath.py)
    app = RouterApp(
        title="PromptEdge router",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        redirect_slashes=False,
        telemetry={"tracing": False, "metrics": False, "logs": False},
        fast_body_limit=settings.limits.max_body_bytes,
    )
    add_completion_routes(app)
    app.include_router(ops)
    app.include_router(feedback)
    if settings.other_paths == "forward":  # last: only paths no route above serves
        app.add_route("/{path:path}", other_paths.forward, methods=other_paths.METHODS, include_in_schema=False)
    app.add_middleware(BodyLimit, max_bytes=settings.limits.max_body_bytes)  # 413 before a body is read
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(Exception, _internal_error)
    return app


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    # Starlette's own 404 / 405 (unknown path, wrong method) in OpenAI's error shape, as
    # OpenAI answers them ("Invalid URL (POST /v1/embeddings)"), Allow header kept on a 405.
    assert isinstance(exc, StarletteHTTPException)
    message = f"Invalid URL ({request.method} {request.url.path})" if exc.status_code == 404 else str(exc.detail)
    body = {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}}
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    # FastAPI's own check of a route's query parameters (DELETE /cache?all=maybe): OpenAI's
    # 400 naming the parameter instead of FastAPI's 422 {"detail": [...]}. (Request bodies of
    # the OpenAI routes are validated by router/api/schemas.py, not here.)
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(part) for part in first.get("loc", ()) if part not in ("query", "path", "header", "body")]
    param = ".".join(loc) or None
    message = f"invalid value for '{param}': {first.get('msg', 'invalid request')}"
    error = BadRequest(message, param=param, code="invalid_value")
    return JSONResponse(error.body(), status_code=error.status)


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    # The top-level handler: log the trace for operators, never show it to the client.
    log.exception("unhandled error on %s", request.url.path)
    body = APIError("internal router error", code="internal_error").body()
    return JSONResponse(body, status_code=500)
