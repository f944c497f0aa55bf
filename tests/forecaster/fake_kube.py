"""A protocol-level fake Kubernetes API server for fast actuator tests (real HTTP, aiohttp).

It serves the few endpoints the actuator uses, with the API server's semantics that matter:
apps/v1 Deployment and its autoscaling/v1 ``scale`` subresource sharing one resourceVersion,
JSON merge patches only, a ``metadata.resourceVersion`` in a patch as a precondition (409
``Conflict`` Status when stale), bearer-token users with per-verb/resource/name grants (403
``Forbidden`` Status worded like RBAC's), 404 ``NotFound`` Status, and pod lists by label selector.
Every write is recorded so tests can assert that a no-op run writes nothing.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from kubernetes import client as k8s

ADMIN_TOKEN = "admin-token"
MERGE_PATCH = "application/merge-patch+json"
Grant = tuple[str, str, str | None]  # (verb, resource[/subresource], resourceName or None = any)


@dataclass
class FakeDeployment:
    replicas: int
    labels: dict[str, str]
    annotations: dict[str, str] = field(default_factory=dict)
    resource_version: int = 1


@dataclass
class FakeCluster:
    """State behind the fake server; tests mutate it directly (under ``lock``)."""

    deployments: dict[tuple[str, str], FakeDeployment] = field(default_factory=dict)
    pods: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # namespace -> pod JSON
    tokens: dict[str, str] = field(default_factory=lambda: {ADMIN_TOKEN: "admin"})
    grants: dict[str, set[Grant]] = field(default_factory=dict)  # user -> grants; "admin" may do all
    writes: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)  # (method, path, body)
    # One entry per coming PATCH: None, or a write by someone else that lands just before it.
    interference: list[Callable[[FakeDeployment], None] | None] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _version: int = 100

    def add_deployment(self, namespace: str, name: str, replicas: int, labels: dict[str, str] | None = None) -> None:
        with self.lock:
            self._version += 1
            self.deployments[(namespace, name)] = FakeDeployment(
                replicas, labels or {"app": name}, resource_version=self._version
            )

    def bump(self, deployment: FakeDeployment, replicas: int | None = None) -> None:
        """A write by someone else: new resourceVersion (and optionally new replicas). Caller holds ``lock``."""
        self._version += 1
        deployment.resource_version = self._version
        if replicas is not None:
            deployment.replicas = replicas

    def concurrent_write(self, replicas: int | None = None) -> Callable[[FakeDeployment], None]:
        """An ``interference`` entry: another writer updates the Deployment (new version, maybe new replicas)."""
        return lambda deployment: self.bump(deployment, replicas)

    def allowed(self, user: str, verb: str, resource: str, name: str | None) -> bool:
        if user == "admin":
            return True
        return any(
            g_verb == verb and g_res == resource and (g_name is None or g_name == name)
            for g_verb, g_res, g_name in self.grants.get(user, set())
        )


def _status(code: int, reason: str, message: str, name: str | None = None, kind: str = "deployments") -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": {"name": name, "group": "apps", "kind": kind},
        "code": code,
    }
    return web.json_response(body, status=code)


class FakeKubeServer:
    """Runs the fake on 127.0.0.1:<ephemeral port> in a background thread; ``client(token)`` gives an ApiClient."""

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self.port = 0

    def start(self) -> FakeKubeServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    async def _start(self) -> None:
        app = web.Application()
        base = "/apis/apps/v1/namespaces/{ns}/deployments/{name}"
        app.router.add_get(base + "/scale", self._get_scale)
        app.router.add_patch(base + "/scale", self._patch_scale)
        app.router.add_get(base, self._get_deployment)
        app.router.add_patch(base, self._patch_deployment)
        app.router.add_get("/api/v1/namespaces/{ns}/pods", self._list_pods)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def client(self, token: str = ADMIN_TOKEN) -> k8s.ApiClient:
        configuration = k8s.Configuration(host=f"http://127.0.0.1:{self.port}")
        configuration.api_key = {"BearerToken": token}
        configuration.api_key_prefix = {"BearerToken": "Bearer"}
        return k8s.ApiClient(configuration)

    # --- request handling -------------------------------------------------------------

    def _user(self, request: web.Request) -> str | None:
        header = request.headers.get("Authorization", "")
        return self.cluster.tokens.get(header.removeprefix("Bearer ").strip())

    def _check(self, request: web.Request, verb: str, resource: str) -> web.Response | None:
        user = self._user(request)
        ns, name = request.match_info["ns"], request.match_info.get("name")
        if user is None:
            return _status(401, "Unauthorized", "Unauthorized")
        if not self.cluster.allowed(user, verb, resource, name):
            base, _, sub = resource.partition("/")
            what = f'{base}.apps "{name}"' if name else base
            group = "apps" if base == "deployments" else ""
            return _status(
                403,
                "Forbidden",
                f'{what} is forbidden: User "{user}" cannot {verb} resource "{resource}" '
                f'in API group "{group}" in the namespace "{ns}"',
                name,
                base,
            )
        return None

    def _find(self, request: web.Request) -> FakeDeployment | web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        found = self.cluster.deployments.get((ns, name))
        return found if found is not None else _status(404, "NotFound", f'deployments.apps "{name}" not found', name)

    def _scale_json(self, request: web.Request, dep: FakeDeployment) -> dict[str, Any]:
        ns, name = request.match_info["ns"], request.match_info["name"]
        selector = ",".join(f"{k}={v}" for k, v in sorted(dep.labels.items()))
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {"name": name, "namespace": ns, "resourceVersion": str(dep.resource_version)},
            "spec": {"replicas": dep.replicas},
            "status": {"replicas": dep.replicas, "selector": selector},
        }

    def _deployment_json(self, request: web.Request, dep: FakeDeployment) -> dict[str, Any]:
        ns, name = request.match_info["ns"], request.match_info["name"]
        return {
            "kind": "Deployment",
            "apiVersion": "apps/v1",
            "metadata": {
                "name": name,
                "namespace": ns,
                "resourceVersion": str(dep.resource_version),
                "annotations": dict(dep.annotations),
                "labels": dict(dep.labels),
            },
            "spec": {
                "replicas": dep.replicas,
                "selector": {"matchLabels": dict(dep.labels)},
                "template": {
                    "metadata": {"labels": dict(dep.labels)},
                    "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]},
                },
            },
        }

    def _read_patch(self, request: web.Request, raw: bytes, dep: FakeDeployment) -> dict[str, Any] | web.Response:
        """Validate a merge patch and its resourceVersion precondition; caller holds the lock."""
        if request.content_type != MERGE_PATCH:
            return _status(415, "UnsupportedMediaType", f"fake supports only {MERGE_PATCH}, got {request.content_type}")
        body = json.loads(raw)
        if self.cluster.interference:
            other_writer = self.cluster.interference.pop(0)
            if other_writer is not None:
                other_writer(dep)
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != str(dep.resource_version):
            name = request.match_info["name"]
            return _status(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on deployments.apps "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again",
                name,
            )
        return body

    async def _get_scale(self, request: web.Request) -> web.Response:
        denied = self._check(request, "get", "deployments/scale")
        if denied:
            return denied
        with self.cluster.lock:
            dep = self._find(request)
            return dep if isinstance(dep, web.Response) else web.json_response(self._scale_json(request, dep))

    async def _patch_scale(self, request: web.Request) -> web.Response:
        denied = self._check(request, "patch", "deployments/scale")
        if denied:
            return denied
        raw = await request.read()  # before taking the lock: never hold it across an await
        with self.cluster.lock:
            dep = self._find(request)
            if isinstance(dep, web.Response):
                return dep
            body = self._read_patch(request, raw, dep)
            if isinstance(body, web.Response):
                return body
            self.cluster.writes.append(("PATCH", request.path, body))
            self.cluster.bump(dep, int(body.get("spec", {}).get("replicas", dep.replicas)))
            return web.json_response(self._scale_json(request, dep))

    async def _get_deployment(self, request: web.Request) -> web.Response:
        denied = self._check(request, "get", "deployments")
        if denied:
            return denied
        with self.cluster.lock:
            dep = self._find(request)
            return dep if isinstance(dep, web.Response) else web.json_response(self._deployment_json(request, dep))

    async def _patch_deployment(self, request: web.Request) -> web.Response:
        denied = self._check(request, "patch", "deployments")
        if denied:
            return denied
        raw = await request.read()  # before taking the lock: never hold it across an await
        with self.cluster.lock:
            dep = self._find(request)
            if isinstance(dep, web.Response):
                return dep
            body = self._read_patch(request, raw, dep)
            if isinstance(body, web.Response):
                return body
            self.cluster.writes.append(("PATCH", request.path, body))
            for key, value in ((body.get("metadata") or {}).get("annotations") or {}).items():
                if value is None:
                    dep.annotations.pop(key, None)
                else:
                    dep.annotations[key] = value
            self.cluster.bump(dep)
            return web.json_response(self._deployment_json(request, dep))

    async def _list_pods(self, request: web.Request) -> web.Response:
        denied = self._check(request, "list", "pods")
        if denied:
            return denied
        wanted = dict(part.split("=", 1) for part in request.query.get("labelSelector", "").split(",") if part)
        with self.cluster.lock:
            items = [
                pod
                for pod in self.cluster.pods.get(request.match_info["ns"], [])
                if all(pod["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())
            ]
        return web.json_response({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items})
