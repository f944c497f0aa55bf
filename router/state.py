"""Everything the router's surfaces need, created once by the app's lifespan."""

from __future__ import annotations

from dataclasses import dataclass

import redis.asyncio as aioredis
from opentelemetry.trace import Tracer

from cache import ResponseCache
from router.caching.shadowing import ShadowVerifier
from router.fleet.replicas import Pools
from router.fleet.scraper import Scraper
from router.forward.forwarder import Forwarder
from router.forward.ratelimit import RateLimiter
from router.observe.counters import TrafficCounters
from router.observe.metrics import RouterMetrics
from router.settings import RouterSettings


@dataclass
class RouterState:
    """The router's long-lived objects (one per app). Forwarding a request to a replica (dispatch,
    the upstream call, admission, accounting) is ``forwarder``'s, which every surface calls; the
    rest is what the surfaces read besides (the cache, the pools, Redis, counters, metrics)."""

    settings: RouterSettings
    redis: aioredis.Redis
    cache: ResponseCache
    pools: Pools
    scraper: Scraper
    counters: TrafficCounters
    metrics: RouterMetrics
    limiter: RateLimiter
    forwarder: Forwarder
    tracer: Tracer | None = None
    # shadow verification of served semantic hits (router/caching/shadow.py); None: off
    shadow: ShadowVerifier | None = None
