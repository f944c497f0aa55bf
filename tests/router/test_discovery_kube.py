"""EndpointSlice discovery against the protocol-level fake API server (real HTTP, the official
client in the discovery thread, snapshots applied to real Pools on the test's event loop)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException

from router.discovery import DiscoveredReplica, apply
from router.discovery.kube import KubeSource, load_kube_settings, new_api_client
from router.fleet.health import HealthConfig
from router.fleet.replicas import Pools
from tests.router.fake_kube_api import TOKEN, FakeKubeAPI, endpoint, endpoint_slice

SERVICE = {"kubernetes.io/service-name": "vllm", "promptedge.io/model": "llama"}
OTHER = {"kubernetes.io/service-name": "postgres", "promptedge.io/model": "llama"}


@pytest.fixture(params=[("v1", "v1beta1"), ("v1beta1",)], ids=["1.21+", "1.20"])
def fake(request: pytest.FixtureRequest) -> Iterator[FakeKubeAPI]:
    """The fake serving discovery.k8s.io as Kubernetes 1.21-1.24 (v1 and v1beta1) and 1.20
    (v1beta1 only): every discovery test runs against both."""
    server = FakeKubeAPI(versions=request.param).start()
    yield server
    server.stop()


class Discovered:
    """A running KubeSource whose snapshots are applied to ``pools``."""

    def __init__(self, source: KubeSource) -> None:
        self.source = source
        self.pools = Pools((), HealthConfig())
        self.snapshots: list[list[DiscoveredReplica]] = []

    def publish(self, snapshot: list[DiscoveredReplica]) -> None:
        self.snapshots.append(snapshot)
        apply(self.pools, snapshot)

    def urls(self, model: str = "llama") -> list[str]:
        return [r.url for r in self.pools.by_model.get(model, [])]

    def taking(self, model: str = "llama") -> list[str]:
        return [r.url for r in self.pools.by_model.get(model, []) if not r.health.draining]


@pytest.fixture()
async def discover(fake: FakeKubeAPI, tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[Discovered]]]:
    started: list[Discovered] = []

    async def start(**overrides: Any) -> Discovered:
        settings = load_kube_settings(
            **{
                "kubeconfig": fake.kubeconfig(tmp_path / "kubeconfig"),
                "label_selector": "kubernetes.io/service-name=vllm",
                "port_name": "http",
                "model_label": "promptedge.io/model",
                "backoff_initial_s": 0.01,
                "backoff_max_s": 0.05,
                "start_timeout_s": 5.0,
                **overrides,
            }
        )
        discovered = Discovered(KubeSource(new_api_client(settings), settings))
        await discovered.source.start(discovered.publish)
        started.append(discovered)
        return discovered

    yield start
    for discovered in started:
        await discovered.source.stop()


async def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Wait for ``condition`` (polled); fails the test after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        if loop.time() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.02)


async def test_ready_endpoints_are_added_and_not_ready_ones_ignored(fake: FakeKubeAPI, discover) -> None:
    fake.apply(
        endpoint_slice(
            "vllm-a",
            [endpoint("10.0.0.1"), endpoint("10.0.0.2", ready=False), endpoint("10.0.0.3", ready=None)],
            8000,
            SERVICE,
        )
    )
    fake.apply(endpoint_slice("postgres-a", [endpoint("10.0.1.1")], 8000, OTHER))  # not selected
    d = await discover()
    assert d.urls() == ["http://10.0.0.1:8000", "http://10.0.0.3:8000"]  # listed before start returned
    # becoming ready (a watch event) adds it; a new slice adds its endpoints
    fake.apply(
        endpoint_slice(
            "vllm-a", [endpoint("10.0.0.1"), endpoint("10.0.0.2"), endpoint("10.0.0.3", ready=None)], 8000, SERVICE
        )
    )
    fake.apply(endpoint_slice("vllm-b", [endpoint("10.0.0.9")], 8000, SERVICE))
    await until(lambda: len(d.urls()) == 4)
    assert d.urls() == ["http://10.0.0.1:8000", "http://10.0.0.3:8000", "http://10.0.0.2:8000", "http://10.0.0.9:8000"]
    assert fake.lists == 1 and d.source.gone == 0


async def test_terminating_endpoint_is_drained_then_removed(fake: FakeKubeAPI, discover) -> None:
    fake.apply(endpoint_slice("vllm-a", [endpoint("10.0.0.1"), endpoint("10.0.0.2")], 8000, SERVICE))
    d = await discover()
    first = d.pools.by_model["llama"][0]
    first.health.probe(True)
    lease = first.lease()  # a request in flight on the replica that will terminate
    fake.apply(
        endpoint_slice(
            "vllm-a",
            [endpoint("10.0.0.1", ready=False, serving=True, terminating=True), endpoint("10.0.0.2")],
            8000,
            SERVICE,
        )
    )
    await until(lambda: d.taking() == ["http://10.0.0.2:8000"])
    assert d.pools.by_model["llama"][0] is first and first.inflight == 1  # kept, count intact
    assert [
        r.url
        for r in d.pools.eligible(
            "llama",
            0.0,
        )
    ] == []  # 10.0.0.2 not probed yet
    assert not first.health.admits(0.0)
    lease.release()
    assert first.inflight == 0
    fake.apply(endpoint_slice("vllm-a", [endpoint("10.0.0.2")], 8000, SERVICE))
    await until(lambda: d.urls() == ["http://10.0.0.2:8000"])


async def test_deleted_slice_removes_its_replicas_and_keeps_the_pool(fake: FakeKubeAPI, discover) -> None:
    fake.apply(endpoint_slice("vllm-a", [endpoint("10.0.0.1")], 8000, SERVICE))
    fake.apply(endpoint_slice("vllm-b", [endpoint("10.0.0.2")], 8000, SERVICE))
    d = await discover()
    assert len(d.urls()) == 2
    fake.delete("vllm-a")
    await until(lambda: d.urls() == ["http://10.0.0.2:8000"])
    fake.delete("vllm-b")
    await until(lambda: d.urls() == [])
    assert "llama" in d.pools  # requests for it get 503 no_replica, not 404


async def test_slice_leaving_the_selector_is_removed(fake: FakeKubeAPI, discover) -> None:
    fake.apply(endpoint_slice("vllm-a", [endpoint("10.0.0.1")], 8000, SERVICE))
    d = await discover()
    fake.apply(endpoint_slice("vllm-a", [endpoint("10.0.0.1")], 8000, OTHER))  # relabelled: DELETED for us
    await until(lambda: d.urls() == [])


async def test_410_gone_leads_to_a_relist(fake: FakeKubeAPI, discover) -> None:
    fake.apply(endpoint_slice("vllm-a", [endpoint("10.0.0.1")], 8000, SERVICE))
    d = await discover()
    await until(lambda: fake.open_watches() == 1)
    # A change no watch will ever deliver, then compaction: only a re-list can see it.
    fake.apply(endpoint_slice("vllm-a", [endpoint("10.0.0.1"), endpoint("10.0.0.7")], 8000, SERVICE), silent=True)
    fake.compact()
    await until(lambda: d.urls() == ["http://10.0.0.1:8000", "http://10.0.0.7:8000"])
    assert fake.expired >= 1 and d.source.gone >= 1 and fake.lists == 2
    # ... and the watch goes on from the new list's resourceVersion
    fake.apply(endpoint_slice("vllm-b", [endpoint("10.0.0.8")], 8000, SERVICE))
    await until(lambda: "http://10.0.0.8:8000" in d.urls())
    assert d.source.errors == 0


async def test_periodic_resync_relists(fake: FakeKubeAPI, discover) -> None:
    fake.apply(endpoint_slice("vllm-a", [endpoint("10.0.0.1")], 8000, SERVICE))
    d = await discover(resync_s=1.5)
    fake.apply(endpoint_slice("vllm-a", [endpoint("10.0.0.1"), endpoint("10.0.0.7")], 8000, SERVICE), silent=True)
    await until(lambda: len(d.urls()) == 2)
    assert fake.lists >= 2 and d.source.gone == 0


async def test_api_errors_back_off_and_recover(fake: FakeKubeAPI, discover) -> None:
    fake.apply(endpoint_slice("vllm-a", [endpoint("10.0.0.1")], 8000, SERVICE))
    fake.fail_next(500, 2)
    fake.fail_next(403)
    d = await discover()
    assert d.urls() == ["http://10.0.0.1:8000"]
    assert d.source.errors == 3 and fake.lists == 1


async def test_start_gives_up_waiting_but_keeps_trying(fake: FakeKubeAPI, discover) -> None:
    fake.fail_next(503, 1000)
    fake.apply(endpoint_slice("vllm-a", [endpoint("10.0.0.1")], 8000, SERVICE))
    d = await discover(start_timeout_s=0.2)
    assert d.snapshots == [] and d.source.errors >= 1


async def test_pools_from_labels_and_the_named_port(fake: FakeKubeAPI, discover) -> None:
    qwen = {**SERVICE, "promptedge.io/model": "qwen"}
    two_ports = endpoint_slice("vllm-q", [endpoint("10.0.0.5")], 8000, qwen)
    two_ports["ports"].append({"name": "metrics", "port": 9100, "protocol": "TCP"})
    fake.apply(endpoint_slice("vllm-l", [endpoint("10.0.0.4")], 8000, SERVICE))
    fake.apply(two_ports)
    fake.apply(endpoint_slice("vllm-x", [endpoint("10.0.0.6")], 8000, SERVICE), namespace="other")
    d = await discover(label_selector="kubernetes.io/service-name in (vllm, vllm-canary),!canary")
    assert d.urls("llama") == ["http://10.0.0.4:8000"]
    assert d.urls("qwen") == ["http://10.0.0.5:8000"]


# --- API discovery: the version read is the one the server serves ---------------------------------


async def test_the_version_read_is_v1_when_served_else_v1beta1(fake: FakeKubeAPI, discover) -> None:
    placed = endpoint("10.0.0.1")
    placed["topology"] = {"kubernetes.io/hostname": "node-a", "topology.kubernetes.io/zone": "z1"}
    fake.apply({**endpoint_slice("vllm-a", [placed], 8000, SERVICE), "apiVersion": "discovery.k8s.io/v1beta1"})
    d = await discover()
    assert d.source.version == ("v1" if "v1" in fake.versions else "v1beta1")
    assert d.urls() == ["http://10.0.0.1:8000"]
    fake.apply(endpoint_slice("vllm-a", [endpoint("10.0.0.1", ready=False), endpoint("10.0.0.2")], 8000, SERVICE))
    await until(lambda: d.taking() == ["http://10.0.0.2:8000"])  # the watch of that version too
    assert d.source.errors == 0


async def test_a_server_serving_no_known_version_is_retried_until_it_does(fake: FakeKubeAPI, discover) -> None:
    served, fake.versions = fake.versions, ()
    fake.apply(endpoint_slice("vllm-a", [endpoint("10.0.0.1")], 8000, SERVICE))
    d = await discover(start_timeout_s=0.3)
    assert d.snapshots == [] and d.source.errors >= 1 and fake.lists == 0
    fake.versions = ("v2alpha1",)  # a group with only versions this router cannot read
    errors = d.source.errors
    await until(lambda: d.source.errors > errors + 1)
    assert d.snapshots == [] and fake.lists == 0
    fake.versions = served  # the cluster is upgraded under the router
    await until(lambda: d.urls() == ["http://10.0.0.1:8000"])


# --- the fake itself keeps the API's contract -------------------------------------------------------


def lines(response: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line) for line in response.text.splitlines() if line]


def test_fake_list_watch_and_410_semantics(fake: FakeKubeAPI) -> None:
    base = f"{fake.url}/apis/discovery.k8s.io/{fake.versions[0]}/namespaces/default/endpointslices"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    rv1 = fake.apply(endpoint_slice("vllm-a", [endpoint("10.0.0.1")], 8000, SERVICE))
    listed = httpx.get(base, params={"labelSelector": "kubernetes.io/service-name=vllm"}, headers=auth).json()
    assert listed["metadata"]["resourceVersion"] == str(rv1) and len(listed["items"]) == 1
    fake.apply(endpoint_slice("vllm-a", [], 8000, SERVICE))
    fake.delete("vllm-a")
    events = lines(
        httpx.get(
            base, params={"watch": "true", "resourceVersion": str(rv1), "timeoutSeconds": "1"}, headers=auth, timeout=5
        )
    )
    assert [(e["type"], int(e["object"]["metadata"]["resourceVersion"])) for e in events] == [
        ("MODIFIED", rv1 + 1),
        ("DELETED", rv1 + 2),
    ]
    assert events[0]["object"]["endpoints"] is None
    fake.compact()
    gone = lines(httpx.get(base, params={"watch": "true", "resourceVersion": str(rv1)}, headers=auth, timeout=5))
    assert gone == [
        {
            "type": "ERROR",
            "object": {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": f"too old resource version: {rv1} ({rv1 + 2})",
                "reason": "Expired",
                "code": 410,
            },
        }
    ]
    assert httpx.get(base, params={"labelSelector": "a in (b"}, headers=auth).status_code == 400
    assert httpx.get(base).status_code == 401


def test_fake_serves_only_its_versions_and_converts_between_them(fake: FakeKubeAPI) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    group = httpx.get(f"{fake.url}/apis/discovery.k8s.io", headers=auth).json()
    assert [v["version"] for v in group["versions"]] == list(fake.versions)
    assert group["preferredVersion"]["version"] == fake.versions[0]
    groups = httpx.get(f"{fake.url}/apis", headers=auth).json()["groups"]
    assert [g["name"] for g in groups] == ["discovery.k8s.io"]
    placed = endpoint("10.0.0.1")
    placed.update(nodeName="node-a", zone="z1")
    fake.apply(endpoint_slice("vllm-a", [placed], 8000, SERVICE))  # written as v1
    for version in ("v1", "v1beta1"):
        answer = httpx.get(
            f"{fake.url}/apis/discovery.k8s.io/{version}/namespaces/default/endpointslices", headers=auth
        )
        if version not in fake.versions:
            assert answer.status_code == 404 and answer.json()["reason"] == "NotFound"
            continue
        (item,) = answer.json()["items"]
        assert answer.json()["apiVersion"] == f"discovery.k8s.io/{version}"
        ep = item["endpoints"][0]
        if version == "v1":
            assert (ep["nodeName"], ep["zone"]) == ("node-a", "z1") and "topology" not in ep
        else:
            assert ep["topology"] == {"kubernetes.io/hostname": "node-a", "topology.kubernetes.io/zone": "z1"}


def test_official_client_raises_410_for_a_too_old_resource_version(fake: FakeKubeAPI, tmp_path: Path) -> None:
    if "v1" not in fake.versions:
        pytest.skip("the typed client reads v1 only")
    rv = fake.apply(endpoint_slice("vllm-a", [endpoint("10.0.0.1")], 8000, SERVICE))
    fake.apply(endpoint_slice("vllm-a", [endpoint("10.0.0.2")], 8000, SERVICE))
    fake.compact()
    api = k8s.DiscoveryV1Api(k8s_config.new_client_from_config(str(fake.kubeconfig(tmp_path / "kc"))))
    with pytest.raises(ApiException) as info:
        list(
            k8s_watch.Watch().stream(
                api.list_namespaced_endpoint_slice, "default", resource_version=str(rv), timeout_seconds=1
            )
        )
    assert info.value.status == 410
