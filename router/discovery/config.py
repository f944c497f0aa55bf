"""Which replica source the router settings ask for (kept apart from ``router.discovery.base`` so
the pure EndpointSlice mapping, which imports that interface, never reaches the kubernetes client)."""

from __future__ import annotations

from router.discovery.base import DiscoveryError, ReplicaSource, StaticSource
from router.settings import RouterSettings


def build_source(settings: RouterSettings) -> ReplicaSource:
    """The source ``settings`` ask for; raises DiscoveryError (naming the setting, file, line
    and field) when the replica list or the Kubernetes settings are unusable."""
    if settings.discovery == "kubernetes":
        if settings.replicas or settings.replicas_file is not None:
            raise DiscoveryError(
                "PROMPTEDGE_ROUTER_DISCOVERY=kubernetes takes no static replicas: unset "
                "PROMPTEDGE_ROUTER_REPLICAS and PROMPTEDGE_ROUTER_REPLICAS_FILE"
            )
        # Imported here: the kubernetes client is a slow import a static router does not need.
        from router.discovery.kube import KubeSource, load_kube_settings

        return KubeSource.from_settings(load_kube_settings())
    if settings.replicas_file is not None:
        if settings.replicas:
            raise DiscoveryError("set PROMPTEDGE_ROUTER_REPLICAS or PROMPTEDGE_ROUTER_REPLICAS_FILE, not both")
        from router.discovery.file import load_replicas_file

        return StaticSource(load_replicas_file(settings.replicas_file))
    if not settings.replicas:
        raise DiscoveryError(
            'no replicas: set PROMPTEDGE_ROUTER_REPLICAS to a JSON list of {"url", "model"} '
            "objects, PROMPTEDGE_ROUTER_REPLICAS_FILE to a YAML file, or "
            "PROMPTEDGE_ROUTER_DISCOVERY=kubernetes"
        )
    return StaticSource(settings.replicas)
