"""deploy/router-rbac.yaml against a REAL kube-apiserver (v1.20.2 + etcd, RBAC on) from
../shared/tools/kube: the Role, bound to the kubeconfig's ``limited`` user (there is no
controller-manager to mint ServiceAccount tokens), lets discovery list, watch and get
EndpointSlices in its namespace and nothing else. v1.20 serves EndpointSlices as
``discovery.k8s.io/v1beta1``; RBAC rules name the API group, not the version, so the same rule
covers ``v1`` on current clusters. API discovery (``GET /apis/discovery.k8s.io``, how the router
picks the version) needs no rule in the Role: the default ClusterRole ``system:discovery``
grants it to every authenticated identity. The router's real discovery loop, run as the
limited identity, finds the slices. Skipped only where the tool scripts are absent.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from router.discovery import DiscoveredReplica
from router.discovery.kube import KubeSource, load_kube_settings, new_api_client
from tests.router.fake_kube_api import endpoint, endpoint_slice
from tests.router.kube_apiserver import running_apiserver

pytestmark = [pytest.mark.kube, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
LABELS = {"kubernetes.io/service-name": "vllm"}


class API:
    """Raw HTTP to the API server as one user."""

    def __init__(self, server: str, token: str, verify: ssl.SSLContext) -> None:
        self.client = httpx.Client(
            base_url=server, headers={"Authorization": f"Bearer {token}"}, verify=verify, timeout=10
        )

    def slices(self, namespace: str) -> str:
        return f"/apis/discovery.k8s.io/v1beta1/namespaces/{namespace}/endpointslices"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kube-router-rbac")


@pytest.fixture(scope="module")
def apis(run_dir: Path) -> Iterator[tuple[API, API, str]]:
    """(admin, limited, namespace) on a fresh RBAC API server with deploy/router-rbac.yaml applied."""
    with running_apiserver(run_dir, authz="RBAC") as config:
        server = config["clusters"][0]["cluster"]["server"]
        verify = ssl.create_default_context(cafile=config["clusters"][0]["cluster"]["certificate-authority"])
        tokens = {u["name"]: u["user"]["token"] for u in config["users"]}
        admin, limited = API(server, tokens["admin"], verify), API(server, tokens["limited"], verify)
        yield admin, limited, _apply_rbac(admin)


def _apply_rbac(admin: API) -> str:
    docs = {doc["kind"]: doc for doc in yaml.safe_load_all((ROOT / "deploy" / "router-rbac.yaml").read_text()) if doc}
    namespace = docs["Role"]["metadata"]["namespace"]
    for path, body in [
        ("/api/v1/namespaces", {"metadata": {"name": namespace}}),
        ("/api/v1/namespaces", {"metadata": {"name": "elsewhere"}}),
        (f"/api/v1/namespaces/{namespace}/serviceaccounts", docs["ServiceAccount"]),
        (f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles", docs["Role"]),
        (f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings", docs["RoleBinding"]),
        (
            f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings",
            {
                "metadata": {"name": "test-limited-user"},
                "roleRef": docs["RoleBinding"]["roleRef"],
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "limited"}],
            },
        ),
    ]:
        admin.client.post(path, json=body).raise_for_status()
    for ns in (namespace, "elsewhere"):
        admin.client.post(admin.slices(ns), json=_slice("vllm-a")).raise_for_status()
    return namespace


def _slice(name: str) -> dict[str, Any]:
    return {**endpoint_slice(name, [endpoint("10.0.0.1")], 8000, LABELS), "apiVersion": "discovery.k8s.io/v1beta1"}


def test_the_role_lets_discovery_list_watch_and_get_its_slices(apis: tuple[API, API, str]) -> None:
    _, limited, namespace = apis
    base = limited.slices(namespace)
    listed = limited.client.get(base, params={"labelSelector": "kubernetes.io/service-name=vllm"})
    assert listed.status_code == 200, listed.text
    assert [item["metadata"]["name"] for item in listed.json()["items"]] == ["vllm-a"]
    watched = limited.client.get(
        base,
        params={
            "watch": "true",
            "timeoutSeconds": "1",
            "resourceVersion": listed.json()["metadata"]["resourceVersion"],
        },
    )
    assert watched.status_code == 200, watched.text
    assert limited.client.get(f"{base}/vllm-a").status_code == 200


def test_api_discovery_is_allowed_without_a_rule(apis: tuple[API, API, str]) -> None:
    _, limited, _ = apis
    group = limited.client.get("/apis/discovery.k8s.io")
    assert group.status_code == 200, group.text
    assert [v["version"] for v in group.json()["versions"]] == ["v1beta1"]


async def test_the_router_discovers_its_slices_as_the_limited_identity(
    apis: tuple[API, API, str], run_dir: Path
) -> None:
    _, _, namespace = apis
    settings = load_kube_settings(
        kubeconfig=run_dir / "kubeconfig",
        context="limited",
        namespace=namespace,
        label_selector="kubernetes.io/service-name=vllm",
        model="llama",
        start_timeout_s=20,
    )
    source = KubeSource(new_api_client(settings), settings)
    snapshots: list[list[DiscoveredReplica]] = []
    await source.start(snapshots.append)
    try:
        assert [[r.spec.url for r in s] for s in snapshots] == [["http://10.0.0.1:8000"]]
        assert source.version == "v1beta1" and source.errors == 0
    finally:
        await source.stop()


def test_the_role_grants_nothing_else(apis: tuple[API, API, str]) -> None:
    _, limited, namespace = apis
    assert limited.client.get(limited.slices("elsewhere")).status_code == 403  # other namespaces
    assert limited.client.post(limited.slices(namespace), json=_slice("vllm-b")).status_code == 403
    assert limited.client.delete(f"{limited.slices(namespace)}/vllm-a").status_code == 403
    assert limited.client.get(f"/api/v1/namespaces/{namespace}/endpoints").status_code == 403
    assert limited.client.get(f"/api/v1/namespaces/{namespace}/pods").status_code == 403
