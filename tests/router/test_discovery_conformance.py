"""The fake API server and the real kube-apiserver answer one list/watch scenario the same way.

The real server (``../shared/tools/kube``, v1.20.2 + etcd) serves EndpointSlices only as
``discovery.k8s.io/v1beta1``; the fake serves ``v1`` and ``v1beta1`` and runs the scenario in
both. What discovery relies on is the same in both versions and is what this compares: API
discovery (the ``discovery.k8s.io`` APIGroup document naming the served versions, and a 404 for
a version not served), list resourceVersion, the watch event stream from it (types, order,
resourceVersions, ``endpoints: null``), and an object leaving and re-entering the label selector
(DELETED / ADDED). The 410 ``Expired`` ERROR event for a too-old
resourceVersion is checked on the fake only (see :func:`expired`).
"""

from __future__ import annotations

import json
import re
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.router.fake_kube_api import TOKEN, FakeKubeAPI, endpoint, endpoint_slice
from tests.router.kube_apiserver import running_apiserver

VLLM = {"kubernetes.io/service-name": "vllm"}
OTHER = {"kubernetes.io/service-name": "postgres"}
# (type, name, addresses) of each event a watcher of service vllm sees, in order.
EXPECTED = [
    ("MODIFIED", "vllm-a", ["10.0.0.1", "10.0.0.2"]),
    ("DELETED", "vllm-a", ["10.0.0.1", "10.0.0.2"]),  # relabelled away: leaves the selector
    ("ADDED", "vllm-a", ["10.0.0.1", "10.0.0.2"]),  # relabelled back
    ("MODIFIED", "vllm-a", None),  # no endpoints: `endpoints: null`
    ("DELETED", "vllm-a", None),
]


@dataclass
class Target:
    """One API server: where its EndpointSlices live, and how to write them."""

    base: str  # .../namespaces/{ns}/endpointslices
    version: str  # discovery.k8s.io/v1 or v1beta1
    headers: dict[str, str]
    verify: ssl.SSLContext | bool = True
    fake: FakeKubeAPI | None = None

    def apply(self, obj: dict[str, Any]) -> None:
        obj = {**obj, "apiVersion": self.version}
        if self.fake is not None:
            self.fake.apply(obj)
            return
        name = obj["metadata"]["name"]
        with httpx.Client(headers=self.headers, verify=self.verify) as client:
            exists = client.get(f"{self.base}/{name}").status_code == 200
            answer = client.put(f"{self.base}/{name}", json=obj) if exists else client.post(self.base, json=obj)
            answer.raise_for_status()

    def delete(self, name: str) -> None:
        if self.fake is not None:
            self.fake.delete(name)
            return
        httpx.delete(f"{self.base}/{name}", headers=self.headers, verify=self.verify).raise_for_status()

    def get(self, **params: str) -> httpx.Response:
        return httpx.get(self.base, params=params, headers=self.headers, verify=self.verify, timeout=10)


@pytest.fixture(params=["v1", "v1beta1"])
def fake_target(request: pytest.FixtureRequest) -> Iterator[Target]:
    """The fake as 1.21-1.24 (both versions served), read in ``v1`` and in ``v1beta1``."""
    server = FakeKubeAPI(versions=("v1", "v1beta1")).start()
    yield Target(
        f"{server.url}/apis/discovery.k8s.io/{request.param}/namespaces/default/endpointslices",
        f"discovery.k8s.io/{request.param}",
        {"Authorization": f"Bearer {TOKEN}"},
        fake=server,
    )
    server.stop()


@pytest.fixture()
def fake_120_target() -> Iterator[Target]:
    """The fake as 1.20: v1beta1 only, like the real server here."""
    server = FakeKubeAPI(versions=("v1beta1",)).start()
    yield Target(
        f"{server.url}/apis/discovery.k8s.io/v1beta1/namespaces/default/endpointslices",
        "discovery.k8s.io/v1beta1",
        {"Authorization": f"Bearer {TOKEN}"},
        fake=server,
    )
    server.stop()


@pytest.fixture(scope="module")
def real_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    with running_apiserver(tmp_path_factory.mktemp("kube-discovery")) as config:
        cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
        target = Target(
            f"{cluster['server']}/apis/discovery.k8s.io/v1beta1/namespaces/disco/endpointslices",
            "discovery.k8s.io/v1beta1",
            {"Authorization": f"Bearer {user['token']}"},
            verify=ssl.create_default_context(cafile=cluster["certificate-authority"]),
        )
        httpx.post(
            f"{cluster['server']}/api/v1/namespaces",
            json={"metadata": {"name": "disco"}},
            headers=target.headers,
            verify=target.verify,
        ).raise_for_status()
        yield target


def scenario(target: Target) -> None:
    a = endpoint_slice("vllm-a", [endpoint("10.0.0.1")], 8000, VLLM)
    target.apply(a)
    target.apply(endpoint_slice("postgres-a", [endpoint("10.0.1.1")], 5432, OTHER))
    listed = target.get(labelSelector="kubernetes.io/service-name=vllm").json()
    assert [item["metadata"]["name"] for item in listed["items"]] == ["vllm-a"]
    start = listed["metadata"]["resourceVersion"]

    two = endpoint_slice("vllm-a", [endpoint("10.0.0.1"), endpoint("10.0.0.2")], 8000, VLLM)
    target.apply(two)
    target.apply({**two, "metadata": {**two["metadata"], "labels": OTHER}})
    target.apply(two)
    target.apply(endpoint_slice("vllm-a", None, 8000, VLLM))
    target.delete("vllm-a")

    watched = target.get(
        labelSelector="kubernetes.io/service-name=vllm", watch="true", resourceVersion=start, timeoutSeconds="1"
    )
    events = [json.loads(line) for line in watched.text.splitlines() if line]
    trace = [
        (
            e["type"],
            e["object"]["metadata"]["name"],
            None if e["object"]["endpoints"] is None else [ep["addresses"][0] for ep in e["object"]["endpoints"]],
        )
        for e in events
    ]
    assert trace == EXPECTED
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert versions == sorted(versions) and versions[0] > int(start)
    relisted = target.get(labelSelector="kubernetes.io/service-name=vllm").json()
    assert relisted["items"] == [] and int(relisted["metadata"]["resourceVersion"]) >= versions[-1]


def expired(target: Target) -> None:
    """Only on the fake: a fresh real apiserver keeps every event since start-up in its watch
    cache, and grows that cache while events are fresh, so no resourceVersion is too old there.
    The event's shape is the apiserver's (k8s.io/apiserver storage/cacher watch_cache.go:
    ``NewResourceExpired("too old resource version: %d (%d)")``, sent as an ERROR event)."""
    gone = target.get(watch="true", resourceVersion="1", timeoutSeconds="1")
    assert gone.status_code == 200
    (error,) = [json.loads(line) for line in gone.text.splitlines() if line]
    assert error["type"] == "ERROR"
    status = error["object"]
    assert (status["kind"], status["status"], status["code"], status["reason"]) == ("Status", "Failure", 410, "Expired")
    assert re.fullmatch(r"too old resource version: 1 \(\d+\)", status["message"])


def api_discovery(target: Target) -> dict[str, object]:
    """What API discovery sees: the group document and the status of each version's slices,
    as one comparable dict (the v1beta1-only server of Kubernetes 1.20)."""
    root = target.base.split("/apis/")[0]
    group = httpx.get(f"{root}/apis/discovery.k8s.io", headers=target.headers, verify=target.verify).json()
    groups = httpx.get(f"{root}/apis", headers=target.headers, verify=target.verify).json()
    listed = [g for g in groups["groups"] if g["name"] == "discovery.k8s.io"]
    statuses = {}
    for version in ("v1", "v1beta1"):
        answer = httpx.get(
            target.base.replace("/v1beta1/", f"/{version}/"), headers=target.headers, verify=target.verify
        )
        statuses[version] = (answer.status_code, answer.json().get("kind"), answer.json().get("reason"))
    return {
        "group": {k: group.get(k) for k in ("kind", "apiVersion", "name", "versions", "preferredVersion")},
        "in_apis": listed,
        "slices": statuses,
    }


EXPECTED_120 = {
    "group": {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": "discovery.k8s.io",
        "versions": [{"groupVersion": "discovery.k8s.io/v1beta1", "version": "v1beta1"}],
        "preferredVersion": {"groupVersion": "discovery.k8s.io/v1beta1", "version": "v1beta1"},
    },
    "in_apis": [
        {
            "name": "discovery.k8s.io",
            "versions": [{"groupVersion": "discovery.k8s.io/v1beta1", "version": "v1beta1"}],
            "preferredVersion": {"groupVersion": "discovery.k8s.io/v1beta1", "version": "v1beta1"},
        }
    ],
    "slices": {"v1": (404, "Status", "NotFound"), "v1beta1": (200, "EndpointSliceList", None)},
}


def test_fake_answers_the_scenario(fake_target: Target) -> None:
    scenario(fake_target)
    expired(fake_target)


def test_fake_as_1_20_answers_api_discovery_as_the_real_server(fake_120_target: Target) -> None:
    assert api_discovery(fake_120_target) == EXPECTED_120
    scenario(fake_120_target)


@pytest.mark.kube
@pytest.mark.slow
def test_real_kube_apiserver_answers_the_scenario_the_same_way(real_target: Target) -> None:
    assert api_discovery(real_target) == EXPECTED_120
    scenario(real_target)
