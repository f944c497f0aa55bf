"""Replica discovery: one interface over a static list and Kubernetes EndpointSlices.

A :class:`ReplicaSource` publishes *full* snapshots of the wanted replica set (never deltas),
so a lost or repeated snapshot cannot leave the pools wrong. :func:`apply` reconciles the
router's :class:`~router.fleet.replicas.Pools` with a snapshot on the event loop: replicas that stay
keep their :class:`~router.fleet.replicas.Replica` object (in-flight count, signals, health), new
ones are added (down until their first ``/health`` probe), gone ones are dropped (their open
requests still finish and release their leases), and draining ones stay but admit nothing.

Sources: :class:`StaticSource` (``PROMPTEDGE_ROUTER_REPLICAS`` JSON or the YAML file
``PROMPTEDGE_ROUTER_REPLICAS_FILE``, see ``router.discovery.file``) and
``router.discovery.kube.KubeSource`` (``PROMPTEDGE_ROUTER_DISCOVERY=kubernetes``); the settings
pick one in ``router.discovery.config.build_source``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from router.fleet.replicas import Pools, Replica
from router.settings import ReplicaSpec


class DiscoveryError(Exception):
    """Discovery cannot start: bad replica file, bad Kubernetes settings or configuration."""


@dataclass(frozen=True, slots=True)
class DiscoveredReplica:
    """One wanted replica. ``draining``: keep it if the router knows it (its open requests
    finish) but send it nothing new; a draining replica the router does not know is not added."""

    spec: ReplicaSpec
    draining: bool = False


Publish = Callable[[list[DiscoveredReplica]], None]


@dataclass(frozen=True, slots=True)
class SourceStats:
    """What a source has done so far, for ``/metrics`` (router/discovery/metrics.py).

    source: ``static`` | ``kubernetes``; lists: successful full lists; watches: watch requests
    opened; gone / broken / errors: re-lists after a 410 Gone, after a watch stream broke, and
    after an API or connection error (with backoff); synced_at: ``time.monotonic()`` of the
    last sign that the source's view is current (a list, a watch event or bookmark, a watch the
    server ended cleanly), None before the first.
    """

    source: str
    lists: int = 0
    watches: int = 0
    gone: int = 0
    broken: int = 0
    errors: int = 0
    synced_at: float | None = None


class ReplicaSource(Protocol):
    """Where the replica set comes from. ``publish`` is always called on the event loop."""

    async def start(self, publish: Publish) -> None:
        """Publish the first snapshot (or give up after the source's start timeout), then keep
        publishing changes in the background."""

    async def stop(self) -> None:
        """Stop publishing and release clients and threads."""

    def stats(self) -> SourceStats:
        """Counters so far (cheap: read when ``/metrics`` is scraped)."""


class StaticSource:
    """A fixed replica list (from settings or the YAML file): one snapshot at start."""

    def __init__(self, specs: Iterable[ReplicaSpec]) -> None:
        self.specs = list(specs)
        self._started_at: float | None = None

    async def start(self, publish: Publish) -> None:
        publish([DiscoveredReplica(spec) for spec in self.specs])
        self._started_at = time.monotonic()

    async def stop(self) -> None:
        return None

    def stats(self) -> SourceStats:
        """One list (the snapshot at start), synced at start."""
        started = self._started_at is not None
        return SourceStats("static", lists=int(started), synced_at=self._started_at)


@dataclass
class Changes:
    """What :func:`apply` did, as replica URLs."""

    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    draining: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.draining)


def apply(pools: Pools, snapshot: Iterable[DiscoveredReplica]) -> Changes:
    """Make ``pools`` match ``snapshot`` (call on the event loop; no await inside, so the
    request path never sees a half-applied set).

    A replica is identified by URL and pool; one that changes pool is a new replica. Pools
    once known stay (possibly empty), so their requests get 503 ``no_replica``, not 404.
    ``Changes.draining`` lists replicas that started draining with this snapshot.
    """
    wanted = {d.spec.url: d for d in snapshot}
    changes = Changes()
    by_model: dict[str, list[Replica]] = {model: [] for model in pools.by_model}
    kept: set[str] = set()
    for replica in pools.all():
        want = wanted.get(replica.url)
        if want is None or want.spec.model != replica.spec.model:
            changes.removed.append(replica.url)
            continue
        if want.draining and not replica.health.draining:
            changes.draining.append(replica.url)
        if want.spec != replica.spec:
            replica.authorization = pools.authorization(want.spec)
        replica.spec = want.spec
        replica.health.draining = want.draining
        by_model[replica.spec.model].append(replica)
        kept.add(replica.url)
    for url, want in wanted.items():
        if url in kept or want.draining:
            continue
        by_model.setdefault(want.spec.model, []).append(pools.new_replica(want.spec))
        changes.added.append(url)
    pools.by_model = by_model
    return changes
