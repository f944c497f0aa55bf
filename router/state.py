"""Everything the request path needs, created once by the app's lifespan."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import redis.asyncio as aioredis
from opentelemetry.trace import Tracer

from cache import ResponseCache
from router.dispatch.affinity import PrefixMap
from router.dispatch.prefix_index import DEFAULT_CHUNK_CHARS, PrefixIndexes
from router.observe.counters import TrafficCounters
from router.dispatch import Context, ReplicaView, Weights, pick
from router.observe.metrics import RouterMetrics
from router.forward.ratelimit import RateLimiter
from router.fleet.replicas import Pools, Replica
from router.fleet.scraper import Scraper
from router.settings import RouterSettings
from router.caching.shadowing import ShadowVerifier
from router.forward.tokens import PromptTokens
from router.forward.upstream import Upstream


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
    # shadow verification of served semantic hits (router/caching/shadow.py); None: off
    shadow: ShadowVerifier | None = None
    prefixes: PrefixMap = field(default_factory=lambda: PrefixMap(120.0))
    # what prompt prefixes went where, for policy prefix_aware (router/dispatch/prefix_index.py)
    prefix_index: PrefixIndexes = field(default_factory=lambda: PrefixIndexes(DEFAULT_CHUNK_CHARS, 400_000))
    prompt_tokens: PromptTokens = field(default_factory=PromptTokens)  # per-pool tokenizers (router/forward/tokens.py)
    ticket: int = 0
    rng: random.Random = field(default_factory=random.Random)

    def choose(self, replicas: list[Replica], now: float, session: str | None = None,
               prefix: int | None = None, chunks: list[int] | None = None,
               prompt_tokens: int = 0) -> tuple[Replica, int]:
        """Pick one of ``replicas`` (non-empty) with the configured policy; ``session`` and
        ``prefix`` (a prompt-prefix key) make the choice sticky within load bounds;
        ``chunks``: the prompt's chunk hashes (router/dispatch/prefix_index.py) for ``prefix_aware``,
        which scores each replica's probable prefix cache instead of the sticky prefix key;
        ``prompt_tokens``: the request's prompt tokens (the router's estimate, 0: unknown).

        Returns the replica and the prompt tokens it will probably have to prefill: all of
        ``prompt_tokens`` less the share its prefix index says it holds (``prefix_aware``),
        which is what ``Replica.lease`` should count as pending prefill. The prompt's
        ``chunks`` are recorded for the replica only once it accepts the request
        (:meth:`accepted`)."""
        self.ticket += 1
        views: list[ReplicaView] = [r.view(now) for r in replicas]
        match = self.prefix_index.matches([r.url for r in replicas], chunks) if chunks else {}
        preferred = None if chunks else self.prefixes.get(prefix, now)
        ctx = Context(ticket=self.ticket, rng=self.rng, session=session, preferred=preferred, now=now,
                      prefix_match=match, prompt_tokens=prompt_tokens)
        chosen = pick(views, self.settings.policy, ctx, self.weights)
        replica = next(r for r in replicas if r.url == chosen.key)
        if not chunks:
            self.prefixes.put(prefix, chosen.key, now)
        return replica, round(prompt_tokens * (1.0 - match.get(chosen.key, 0.0)))

    def accepted(self, replica: Replica, chunks: list[int] | None) -> None:
        """``replica`` answered 2xx to a prompt of these chunk hashes (``prefix_aware``), so its
        prefix cache will hold it: record them. A prompt it refused (a 4xx such as one over its
        context, a 5xx, no connection, a retry elsewhere) is never in its cache, and recording
        it would evict real prefixes from the bounded index."""
        if chunks:
            kv_tokens = replica.signals.kv_capacity_tokens if replica.signals is not None else None
            self.prefix_index.record(replica.url, chunks, kv_tokens)
