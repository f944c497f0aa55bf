"""Prometheus metrics of one router app (own registry, so several apps can share a process).

Per-request series are updated on the request path (a dict lookup and an add each); replica
gauges (score, in-flight, scrape age, up) are computed only when ``/metrics`` is scraped. Under
``router serve --workers N`` a scrape is answered with every worker's series
(router/observe/metrics_shared.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from router.dispatch import Weights, score
from router.fleet.replicas import Pools
from router.observe.metrics_shared import SharedSeries, shared_dir

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class RouterMetrics:
    """The router's Prometheus series; ``render()`` gives the text exposition. ``shared``: the
    process is one of ``--workers N`` (prometheus_client's multiprocess mode, set up by the
    supervisor), so ``render()`` answers with every worker's series, the cache's included."""

    def __init__(
        self,
        pools: Pools,
        weights: Weights,
        clock: Callable[[], float] = time.monotonic,
        cache_healthy: Callable[[], bool] | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        self.pools = pools
        # computed at scrape time from this process's state: copied for the other workers when shared
        self.collectors: list[Collector] = [ProcessCollector(registry=None)]  # process_cpu_seconds_total, ...
        if cache_healthy is not None:
            self.collectors.append(_CacheCollector(cache_healthy))
        self.collectors.append(_ReplicaCollector(pools, weights, clock))
        for collector in self.collectors:
            self.registry.register(collector)
        self.shared = (
            SharedSeries(self.collectors, lambda: {replica.url for replica in pools.all()})
            if shared_dir() is not None
            else None
        )
        self.requests = Counter(
            "promptedge_router_requests",
            "Requests answered, by pool, replica, HTTP status and cache outcome",
            ["pool", "replica", "status", "cache"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "promptedge_router_request_seconds",
            "Time from request received to response end",
            ["pool", "cache"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.ttft = Histogram(
            "promptedge_router_ttft_seconds",
            "Time from request received to the replica's first byte",
            ["pool"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.retries = Counter(
            "promptedge_router_retries",
            "Requests re-sent to another replica before the first byte",
            ["pool"],
            registry=self.registry,
        )
        self.store_skipped = Counter(
            "promptedge_router_cache_store_skipped",
            "Answers the router did not store in the cache, by pool and reason (too_large, replica_cache_control)",
            ["pool", "reason"],
            registry=self.registry,
        )
        self.affinity_unavailable = Counter(
            "promptedge_router_response_affinity_unavailable",
            "Responses API affinity store (Redis) failures, by pool and operation (lookup: a follow-up "
            "refused with 503; note: a response id not noted)",
            ["pool", "op"],
            registry=self.registry,
        )
        self.shadow = Counter(
            "promptedge_router_cache_shadow_verifications",
            "Served semantic hits drawn for shadow verification, by pool and outcome (right, wrong, no_label, "
            "error, ineligible, skipped_budget, skipped_load; router/caching/shadow.py)",
            ["pool", "outcome"],
            registry=self.registry,
        )
        self.warm = Counter(
            "promptedge_router_warm_generations",
            "Predictive warming's regenerations of expired hot entries before a forecast peak, by pool and "
            "outcome (attempted; then stored or failed; router/caching/warming.py)",
            ["pool", "outcome"],
            registry=self.registry,
        )
        self._children: dict[tuple[str, str, int, str], tuple[Counter, Histogram]] = {}
        self._ttft: dict[str, Histogram] = {}

    def register(self, collector: Collector) -> None:
        """Add a collector of series computed at scrape time (as the replica gauges are)."""
        self.collectors.append(collector)
        self.registry.register(collector)

    def observe_request(
        self, pool: str, replica: str, status: int, cache: str, seconds: float, ttft_s: float | None
    ) -> None:
        """Count one answered request: ``seconds`` from arrival to the end, ``ttft_s`` to the
        replica's first byte (None: not a TTFT sample). The series' children are kept per label
        set: ``labels()`` checks and locks on every call, a measurable share of a request."""
        key = (pool, replica, status, cache)
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = (
                self.requests.labels(pool, replica, str(status), cache),
                self.latency.labels(pool, cache),
            )
        children[0].inc()
        children[1].observe(seconds)
        if ttft_s is not None:
            ttft = self._ttft.get(pool)
            if ttft is None:
                ttft = self._ttft[pool] = self.ttft.labels(pool)
            ttft.observe(ttft_s)

    def forget_replicas(self, urls: Iterable[str]) -> None:
        """Drop the per-replica request series of replicas that left their pool (discovery
        removed them): with autoscaling, every Pod that ever served would otherwise keep its
        series for the router's lifetime. A request still open to such a replica that ends
        later counts again, under a series of its own. Call it once ``pools`` no longer holds them."""
        if self.shared is not None:  # from now on no worker shows them, unless another one has them
            self.shared.mark()
        gone = set(urls)
        for key in [k for k in self._children if k[1] in gone]:
            del self._children[key]
            if self.shared is None:  # multiprocess mode cannot remove a series: render() leaves it out
                pool, replica, status, cache = key
                self.requests.remove(pool, replica, str(status), cache)

    def render(self) -> bytes:
        """Prometheus text exposition of all series (shared: every worker's, the cache's too,
        those of replicas that no worker's ``pools`` holds now left out)."""
        if self.shared is None:
            return generate_latest(self.registry)
        return self.shared.render()


class _CacheCollector(Collector):
    """``promptedge_router_cache_up``: 1 while the response cache works (its Redis answers and,
    when semantic, the embedding model loaded), 0 while the router serves without it. Read at
    scrape time from the cache's own health probe (cache.ResponseCache.healthy)."""

    def __init__(self, healthy: Callable[[], bool]) -> None:
        self.healthy = healthy

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "promptedge_router_cache_up",
            "1 if the response cache works (Redis answers, embedding model loaded)",
            value=1.0 if self.healthy() else 0.0,
        )


class _ReplicaCollector(Collector):
    def __init__(self, pools: Pools, weights: Weights, clock: Callable[[], float]) -> None:
        self.pools, self.weights, self.clock = pools, weights, clock

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = self.clock()
        labels = ["pool", "replica"]
        score_g = GaugeMetricFamily(
            "promptedge_router_replica_score", "gpu_load score (lower is better)", labels=labels
        )
        inflight = GaugeMetricFamily("promptedge_router_replica_inflight", "Router's open requests", labels=labels)
        age = GaugeMetricFamily("promptedge_router_scrape_age_seconds", "Age of the last metrics scrape", labels=labels)
        up = GaugeMetricFamily("promptedge_router_replica_up", "1 if the replica admits requests", labels=labels)
        speed = GaugeMetricFamily(
            "promptedge_router_replica_seconds_per_token",
            "Learned seconds per token of work, end to end (router/dispatch/speed.py; absent until known)",
            labels=labels,
        )
        stuck = GaugeMetricFamily(
            "promptedge_router_replica_stuck",
            "1 while the replica is out of rotation because its open requests made no "
            "progress for stuck_after_s (router/fleet/progress.py)",
            labels=labels,
        )
        for pool, replicas in self.pools.by_model.items():
            for replica in replicas:
                view = replica.view(now)
                values = [pool, replica.url]
                score_g.add_metric(values, score(view, self.weights))
                inflight.add_metric(values, replica.inflight)
                age.add_metric(values, -1.0 if view.age_s is None else view.age_s)
                up.add_metric(values, 1.0 if replica.health.admits(now) else 0.0)
                stuck.add_metric(values, 1.0 if replica.health.progress.out(now) else 0.0)
                if replica.speed is not None:
                    speed.add_metric(values, replica.speed.s_per_token)
        yield from (score_g, inflight, age, up, speed, stuck)
