"""Replica discovery: where the router's replica set comes from, and how the pools follow it.

Public surface::

    source = build_source(settings)     # StaticSource (list or YAML file) or the Kubernetes one
    await source.start(publish)         # publish(snapshot): full snapshots, on the event loop
    changes = apply(pools, snapshot)    # pools reconciled: .added, .removed, .draining (URLs)
    registry.register(DiscoveryCollector(pools, source))   # its /metrics series

Modules: ``base`` (the interface, :class:`StaticSource`, :func:`apply`), ``config`` (the
source the settings ask for), ``file`` (the YAML replica list), ``kube`` (EndpointSlices; a
slow import, so not re-exported here: ``router.discovery.kube``), ``slices`` (pure mapping of
EndpointSlice JSON to replicas), ``metrics`` (the Prometheus series). Modules of this package
import each other by module, never through this one, so that ``slices`` stays free of the
kubernetes client (the import-linter contract "pure cores do no I/O").
"""

from router.discovery.base import (
    Changes,
    DiscoveredReplica,
    DiscoveryError,
    Publish,
    ReplicaSource,
    SourceStats,
    StaticSource,
    apply,
)
from router.discovery.config import build_source
from router.discovery.metrics import DiscoveryCollector

__all__ = [
    "Changes",
    "DiscoveredReplica",
    "DiscoveryCollector",
    "DiscoveryError",
    "Publish",
    "ReplicaSource",
    "SourceStats",
    "StaticSource",
    "apply",
    "build_source",
]
