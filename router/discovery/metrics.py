"""Prometheus series of replica discovery, computed only when ``/metrics`` is scraped.

Nothing here runs per request or per watch event: the source keeps plain counters
(:meth:`~router.discovery.ReplicaSource.stats`) and the pools are read as they are.

- ``promptedge_router_discovery_endpoints{pool,state}``: replicas the router holds, ``ready``
  (discovery says it may take requests; the active probes decide ``promptedge_router_replica_up``)
  or ``draining`` (terminating or not ready: open requests finish, nothing new);
- ``promptedge_router_discovery_lists_total``, ``_watches_total``: successful full lists and
  watch requests opened (a watch the server ends is re-opened: a new request);
- ``promptedge_router_discovery_relists_total{reason}``: re-lists forced by ``gone`` (410 Gone,
  resourceVersion too old), ``broken`` (the watch stream broke) or ``error`` (API or connection
  error, after a backoff); periodic resyncs are the lists not counted here;
- ``promptedge_router_discovery_sync_age_seconds{source}``: seconds since the source last knew
  its view was current (list, watch event or bookmark, clean watch end); -1 before the first.
  While discovery works it stays below ``PROMPTEDGE_ROUTER_K8S_RESYNC_S``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from router.discovery.base import ReplicaSource
from router.fleet.replicas import Pools


class DiscoveryCollector(Collector):
    """Discovery series of one router (register it on the router's registry)."""

    def __init__(self, pools: Pools, source: ReplicaSource, clock: Callable[[], float] = time.monotonic) -> None:
        self.pools, self.source, self.clock = pools, source, clock

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        stats = self.source.stats()
        endpoints = GaugeMetricFamily(
            "promptedge_router_discovery_endpoints",
            "Replicas held per pool: ready (may take requests) or draining",
            labels=["pool", "state"],
        )
        for pool, replicas in self.pools.by_model.items():
            draining = sum(1 for r in replicas if r.health.draining)
            endpoints.add_metric([pool, "ready"], len(replicas) - draining)
            endpoints.add_metric([pool, "draining"], draining)
        yield endpoints
        yield CounterMetricFamily(
            "promptedge_router_discovery_lists", "Successful full lists of the replica set", value=stats.lists
        )
        yield CounterMetricFamily("promptedge_router_discovery_watches", "Watch requests opened", value=stats.watches)
        relists = CounterMetricFamily(
            "promptedge_router_discovery_relists",
            "Re-lists forced by 410 Gone, a broken watch stream or an error",
            labels=["reason"],
        )
        for reason, count in (("gone", stats.gone), ("broken", stats.broken), ("error", stats.errors)):
            relists.add_metric([reason], count)
        yield relists
        age = GaugeMetricFamily(
            "promptedge_router_discovery_sync_age_seconds",
            "Seconds since discovery last knew its replica set was current (-1: never)",
            labels=["source"],
        )
        age.add_metric([stats.source], -1.0 if stats.synced_at is None else self.clock() - stats.synced_at)
        yield age
