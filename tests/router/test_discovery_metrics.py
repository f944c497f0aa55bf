"""Discovery's Prometheus series: against the fake API server (real list/watch, 410, errors),
for a static router's /metrics, and the RBAC manifest the router's discovery needs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from router.discovery import DiscoveryCollector, SourceStats, StaticSource
from router.fleet.health import HealthConfig
from router.fleet.replicas import Pools
from router.settings import ReplicaSpec
from tests.router.fake_kube_api import FakeKubeAPI, endpoint, endpoint_slice
from tests.router.test_discovery_kube import SERVICE, discover, fake, until  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parents[2]


def samples(collector: DiscoveryCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} of the collector's text exposition."""
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(found: dict, name: str, **labels: str) -> float:
    return found[(name, tuple(sorted(labels.items())))]


async def test_series_follow_list_watch_drain_and_410(fake: FakeKubeAPI, discover) -> None:  # noqa: F811
    fake.apply(endpoint_slice("vllm-a", [endpoint("10.0.0.1"), endpoint("10.0.0.2")], 8000, SERVICE))
    d = await discover()
    # an injected clock: the age is exact, not a timing
    collector = DiscoveryCollector(d.pools, d.source, clock=lambda: (d.source.synced_at or 0.0) + 2.5)
    found = samples(collector)
    assert value(found, "promptedge_router_discovery_endpoints", pool="llama", state="ready") == 2
    assert value(found, "promptedge_router_discovery_endpoints", pool="llama", state="draining") == 0
    assert value(found, "promptedge_router_discovery_lists_total") == 1
    assert value(found, "promptedge_router_discovery_sync_age_seconds", source="kubernetes") == 2.5

    fake.apply(
        endpoint_slice(
            "vllm-a",
            [endpoint("10.0.0.1", ready=False, serving=True, terminating=True), endpoint("10.0.0.2")],
            8000,
            SERVICE,
        )
    )
    await until(
        lambda: (
            samples(collector)[("promptedge_router_discovery_endpoints", (("pool", "llama"), ("state", "draining")))]
            == 1
        )
    )
    assert value(samples(collector), "promptedge_router_discovery_endpoints", pool="llama", state="ready") == 1

    await until(lambda: fake.open_watches() == 1)
    fake.apply(endpoint_slice("vllm-b", [endpoint("10.0.0.7")], 8000, SERVICE), silent=True)
    fake.compact()  # the open watch gets 410 Expired: a re-list, counted by reason
    await until(lambda: d.source.lists == 2 and fake.open_watches() == 1)
    found = samples(collector)
    assert value(found, "promptedge_router_discovery_relists_total", reason="gone") == d.source.gone >= 1
    assert value(found, "promptedge_router_discovery_relists_total", reason="error") == 0
    assert value(found, "promptedge_router_discovery_lists_total") == 2
    assert value(found, "promptedge_router_discovery_watches_total") == d.source.watches >= 2
    assert value(found, "promptedge_router_discovery_endpoints", pool="llama", state="ready") == 2


async def test_api_errors_are_counted_as_error_relists(fake: FakeKubeAPI, discover) -> None:  # noqa: F811
    fake.apply(endpoint_slice("vllm-a", [endpoint("10.0.0.1")], 8000, SERVICE))
    fake.fail_next(500, 2)
    d = await discover()
    found = samples(DiscoveryCollector(d.pools, d.source))
    assert value(found, "promptedge_router_discovery_relists_total", reason="error") == 2
    assert value(found, "promptedge_router_discovery_lists_total") == 1


async def test_before_the_first_list_the_sync_age_says_never(fake: FakeKubeAPI, discover) -> None:  # noqa: F811
    fake.fail_next(503, 1000)
    d = await discover(start_timeout_s=0.2)
    found = samples(DiscoveryCollector(d.pools, d.source))
    assert value(found, "promptedge_router_discovery_sync_age_seconds", source="kubernetes") == -1
    assert value(found, "promptedge_router_discovery_lists_total") == 0


def test_broken_watch_streams_have_their_own_reason() -> None:
    class Stub:
        def stats(self) -> SourceStats:
            return SourceStats("kubernetes", lists=4, watches=9, gone=1, broken=2, errors=0, synced_at=10.0)

    found = samples(DiscoveryCollector(Pools((), HealthConfig()), Stub(), clock=lambda: 12.0))  # type: ignore[arg-type]
    assert [
        value(found, "promptedge_router_discovery_relists_total", reason=r) for r in ("gone", "broken", "error")
    ] == [1, 2, 0]
    assert value(found, "promptedge_router_discovery_sync_age_seconds", source="kubernetes") == 2.0


async def test_a_static_router_serves_the_series(start_replica, start_router, client) -> None:
    replica = await start_replica()
    router = await start_router([replica.url])
    text = (await client.get(router.url + "/metrics")).text
    found = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert value(found, "promptedge_router_discovery_endpoints", pool="sim-llama-8b", state="ready") == 1
    assert value(found, "promptedge_router_discovery_lists_total") == 1
    assert value(found, "promptedge_router_discovery_sync_age_seconds", source="static") >= 0


async def test_static_source_stats() -> None:
    source = StaticSource([ReplicaSpec(url="http://a:1", model="m")])
    assert source.stats() == SourceStats("static")
    await source.start(lambda snapshot: None)
    assert source.stats().lists == 1 and source.stats().synced_at is not None


# --- deploy/router-rbac.yaml -------------------------------------------------------------------


def rbac() -> dict[str, dict[str, Any]]:
    docs = [doc for doc in yaml.safe_load_all((ROOT / "deploy" / "router-rbac.yaml").read_text()) if doc]
    assert sorted(doc["kind"] for doc in docs) == ["Role", "RoleBinding", "ServiceAccount"]
    return {doc["kind"]: doc for doc in docs}


def test_rbac_grants_read_only_endpointslices_to_the_bound_service_account() -> None:
    docs = rbac()
    role, binding, account = docs["Role"], docs["RoleBinding"], docs["ServiceAccount"]
    assert role["apiVersion"] == binding["apiVersion"] == "rbac.authorization.k8s.io/v1"
    assert role["rules"] == [
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]}
    ]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": account["metadata"]["namespace"]}
    ]
    assert len({doc["metadata"]["namespace"] for doc in docs.values()}) == 1


def test_readme_points_at_the_manifest() -> None:
    assert "deploy/router-rbac.yaml" in (ROOT / "router" / "README.md").read_text()
