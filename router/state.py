"""Everything the request path needs, created once by the app's lifespan."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import redis.asyncio as aioredis
from opentelemetry.trace import Tracer

from cache import ResponseCache
from router.affinity import PrefixMap
from router.counters import TrafficCounters
from router.dispatch import Context, ReplicaView, Weights, pick
from router.metrics import RouterMetrics
from router.ratelimit import RateLimiter
from router.replicas import Pools, Replica
from router.scraper import Scraper
from router.settings import RouterSettings
from router.tokens import PromptTokens
from router.upstream import Upstream


@dataclass
class RouterState:
    """The router's long-lived objects (one per app). ``choose`` is the only mutating helper."""

    settings: RouterSettings
    redis: aioredis.Redis
    upstream: Upstream
    cache: ResponseCache
    pools: Pools
    scraper: Scraper
    counters: TrafficCounters
    metrics: RouterMetrics
    weights: Weights
    limiter: RateLimiter
    tracer: Tracer | None = None
    prefixes: PrefixMap = field(default_factory=lambda: PrefixMap(120.0))
    prompt_tokens: PromptTokens = field(default_factory=PromptTokens)  # per-pool tokenizers (router/tokens.py)
    ticket: int = 0
    rng: random.Random = field(default_factory=random.Random)

    def choose(self, replicas: list[Replica], now: float, session: str | None = None,
               prefix: int | None = None) -> Replica:
        """Pick one of ``replicas`` (non-empty) with the configured policy; ``session`` and
        ``prefix`` (a prompt-prefix key) make the choice sticky within load bounds."""
        self.ticket += 1
        views: list[ReplicaView] = [r.view(now) for r in replicas]
        ctx = Context(ticket=self.ticket, rng=self.rng, session=session, preferred=self.prefixes.get(prefix, now),
                      now=now)
        chosen = pick(views, self.settings.policy, ctx, self.weights)
        self.prefixes.put(prefix, chosen.key, now)
        return next(r for r in replicas if r.url == chosen.key)
