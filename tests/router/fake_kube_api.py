"""A protocol-level fake Kubernetes API server for EndpointSlice discovery (real HTTP, aiohttp).

It serves ``GET /apis/discovery.k8s.io/{v1,v1beta1}/namespaces/{ns}/endpointslices`` with the
semantics the discovery loop depends on, as the real kube-apiserver has them:

- API discovery: ``/api``, ``/apis`` (APIGroupList), ``/apis/discovery.k8s.io`` (APIGroup:
  served versions, preferred first) and ``/apis/discovery.k8s.io/{version}`` (APIResourceList),
  for the versions given (``versions=("v1beta1",)`` is Kubernetes 1.20, ``("v1", "v1beta1")``
  1.21-1.24, ``("v1",)`` 1.25+); any path of a version not served is a 404 Status;
- one stored object per slice, served in the version asked for (the server converts, as the
  real one does: v1beta1 ``topology`` <-> v1 ``nodeName``/``zone``/``deprecatedTopology``);

- one cluster-wide resourceVersion counter; every write bumps it and stamps the object;
  a list answers ``metadata.resourceVersion`` = the current one;
- ``watch=true`` streams JSON lines ``{"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, "object"}``
  (chunked). From a resourceVersion: every later event, then live ones. Without one (or "0"):
  synthetic ADDED events for the current objects first. ``timeoutSeconds`` ends the stream
  (after a BOOKMARK when ``allowWatchBookmarks=true``);
- label selectors (``=``, ``==``, ``!=``, ``in``, ``notin``, ``key``, ``!key``; 400 when
  unparsable) on list and watch; an object that stops matching is sent as DELETED and one
  that starts matching as ADDED, as the watch cache does;
- a resourceVersion older than the compaction point -> HTTP 200 and one ERROR event whose
  object is a Status with ``code`` 410 and reason ``Expired`` ("too old resource version"),
  then the stream ends; :meth:`FakeKubeAPI.compact` also ends every open watch that way;
- bearer-token authentication (401 Status otherwise); injected failures (``fail_next``).

Tests mutate the state through the server's methods (thread-safe: they run on its loop).
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

TOKEN = "discovery-token"
GROUP = "discovery.k8s.io"
GROUP_VERSION = f"{GROUP}/v1"
HOSTNAME, ZONE = "kubernetes.io/hostname", "topology.kubernetes.io/zone"
T = TypeVar("T")
_CLOSE = "close"


def endpoint(
    ip: str,
    ready: bool | None = True,
    serving: bool | None = None,
    terminating: bool | None = None,
    pod: str | None = None,
) -> dict[str, Any]:
    """One EndpointSlice endpoint; a None condition is left out (the API's "unknown")."""
    conditions = {
        k: v for k, v in (("ready", ready), ("serving", serving), ("terminating", terminating)) if v is not None
    }
    ep: dict[str, Any] = {"addresses": [ip], "conditions": conditions}
    if pod is not None:
        ep["targetRef"] = {"kind": "Pod", "name": pod, "namespace": "default"}
    return ep


def endpoint_slice(
    name: str,
    endpoints: list[dict[str, Any]] | None,
    port: int,
    labels: dict[str, str],
    port_name: str | None = "http",
    address_type: str = "IPv4",
) -> dict[str, Any]:
    """An EndpointSlice object as the API serialises it (``endpoints: null`` when empty)."""
    return {
        "kind": "EndpointSlice",
        "apiVersion": GROUP_VERSION,
        "metadata": {"name": name, "labels": dict(labels)},
        "addressType": address_type,
        "endpoints": endpoints or None,
        "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
    }


def convert(obj: dict[str, Any], version: str) -> dict[str, Any]:
    """``obj`` (either version) as ``discovery.k8s.io/{version}`` serialises it (a copy). The
    fields that differ are the endpoints' placement: v1beta1 ``topology`` (a map holding the
    node's hostname and zone) vs v1 ``nodeName``, ``zone`` and ``deprecatedTopology``."""
    out = copy.deepcopy(obj)
    if "apiVersion" in out:
        out["apiVersion"] = f"{GROUP}/{version}"
    for ep in out.get("endpoints") or []:
        topology = {**(ep.pop("deprecatedTopology", None) or {}), **(ep.pop("topology", None) or {})}
        node = ep.pop("nodeName", None) or topology.get(HOSTNAME)
        zone = ep.pop("zone", None) or topology.get(ZONE)
        if version == "v1beta1":
            topology.update({k: v for k, v in ((HOSTNAME, node), (ZONE, zone)) if v is not None})
            ep.update({"topology": topology} if topology else {})
            ep.update({"nodeName": node} if node is not None else {})
        else:
            rest = {k: v for k, v in topology.items() if k not in (HOSTNAME, ZONE)}
            ep.update(
                {
                    k: v
                    for k, v in (("nodeName", node), ("zone", zone), ("deprecatedTopology", rest or None))
                    if v is not None
                }
            )
    return out


# --- label selectors (k8s.io/apimachinery/pkg/labels syntax, the parts used here) -----------

_KEY = r"[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?"
_VALUE = r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_SET = re.compile(rf"^\s*({_KEY})\s+(in|notin)\s+\(([^()]*)\)\s*$")
_EQ = re.compile(rf"^\s*({_KEY})\s*(==|=|!=)\s*({_VALUE})\s*$")
_EXISTS = re.compile(rf"^\s*(!?)\s*({_KEY})\s*$")
Requirement = Callable[[dict[str, str]], bool]


class SelectorError(ValueError):
    pass


def parse_selector(text: str) -> list[Requirement]:
    """Requirements of a label selector (all must hold); raises SelectorError."""
    parts = [p for p in re.split(r",(?![^()]*\))", text) if p.strip()] if text.strip() else []
    requirements: list[Requirement] = []
    for part in parts:
        if m := _SET.match(part):
            key, op, values = m.group(1), m.group(3), {v.strip() for v in m.group(4).split(",")}
            if op == "in":
                requirements.append(lambda labels, k=key, vs=values: labels.get(k) in vs)
            else:
                requirements.append(lambda labels, k=key, vs=values: labels.get(k) not in vs)
        elif m := _EQ.match(part):
            key, op, value = m.group(1), m.group(3), m.group(4)
            if op == "!=":
                requirements.append(lambda labels, k=key, v=value: labels.get(k) != v)
            else:
                requirements.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif m := _EXISTS.match(part):
            negate, key = m.group(1) == "!", m.group(2)
            requirements.append(lambda labels, k=key, n=negate: (k in labels) != n)
        else:
            raise SelectorError(f"unable to parse requirement: {part.strip()!r}")
    return requirements


def _matches(requirements: list[Requirement], obj: dict[str, Any] | None) -> bool:
    if obj is None:
        return False
    labels = obj["metadata"].get("labels") or {}
    return all(req(labels) for req in requirements)


# --- the server ------------------------------------------------------------------------------


@dataclass
class _Event:
    rv: int
    type: str
    namespace: str
    old: dict[str, Any] | None
    new: dict[str, Any]


@dataclass(eq=False)  # identity: watchers live in a set
class _Watcher:
    namespace: str
    requirements: list[Requirement]
    # None: compacted (send 410 and end); _CLOSE: the server shuts down (just end).
    queue: asyncio.Queue[_Event | str | None] = field(default_factory=asyncio.Queue)


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class FakeKubeAPI:
    """The fake on 127.0.0.1:<ephemeral port>, in its own thread and event loop.

    Counters: ``lists`` and ``watches`` (requests served), ``expired`` (410s sent).
    """

    def __init__(self, versions: tuple[str, ...] = ("v1", "v1beta1")) -> None:
        self.versions = versions  # served versions of discovery.k8s.io, preferred first
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.rv = 100
        self.compacted = self.rv  # a watch from a resourceVersion below this gets 410 (no older history)
        self.history: list[_Event] = []
        self.lists = self.watches = self.expired = 0
        self._failures: list[int] = []
        self._watchers: set[_Watcher] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fake-kube-api", daemon=True)
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeKubeAPI:
        self._thread.start()
        self._call(self._start())
        return self

    def stop(self) -> None:
        self._call(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def kubeconfig(self, path: Path) -> Path:
        """Write a kubeconfig for this server (token auth) to ``path``."""
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "fake",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": "router", "user": {"token": TOKEN}}],
                    "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "router"}}],
                }
            )
        )
        return path

    # --- writes (any thread) -----------------------------------------------------------------

    def apply(self, obj: dict[str, Any], namespace: str = "default", *, silent: bool = False) -> int:
        """Create or replace a slice; returns its new resourceVersion. ``silent``: the write
        is not sent to open watches (they only see it after a re-list; use with compact)."""
        return self._call(self._write(namespace, convert(obj, "v1"), None, silent))

    def delete(self, name: str, namespace: str = "default") -> int:
        """Delete a slice (DELETED event carries the last state with a new resourceVersion)."""
        return self._call(self._write(namespace, None, name, False))

    def compact(self) -> None:
        """Forget all history: older resourceVersions become too old (410), and every open
        watch gets the ERROR 410 event and ends."""
        self._call(self._compact())

    def fail_next(self, status: int, count: int = 1) -> None:
        """Answer the next ``count`` requests with ``status`` and a Status body."""
        self._loop.call_soon_threadsafe(self._failures.extend, [status] * count)

    def open_watches(self) -> int:
        return self._call(self._count_watchers())

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    async def _count_watchers(self) -> int:
        return len(self._watchers)

    async def _write(self, namespace: str, obj: dict[str, Any] | None, name: str | None, silent: bool) -> int:
        self.rv += 1
        key = (namespace, obj["metadata"]["name"] if obj is not None else name or "")
        old = self.objects.get(key)
        if obj is None:
            if old is None:
                raise KeyError(f"no slice {key}")
            new = copy.deepcopy(old)
            del self.objects[key]
            kind = "DELETED"
        else:
            new = obj
            kind = "ADDED" if old is None else "MODIFIED"
            self.objects[key] = new
        new["metadata"]["namespace"] = namespace
        new["metadata"]["resourceVersion"] = str(self.rv)
        event = _Event(self.rv, kind, namespace, copy.deepcopy(old), copy.deepcopy(new))
        if not silent:
            self.history.append(event)
            for watcher in self._watchers:
                watcher.queue.put_nowait(event)
        return self.rv

    async def _compact(self) -> None:
        self.compacted = self.rv
        self.history.clear()
        for watcher in self._watchers:
            watcher.queue.put_nowait(None)

    # --- HTTP ---------------------------------------------------------------------------------

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_get("/api", self._api_versions)
        app.router.add_get("/apis", self._api_groups)
        app.router.add_get(f"/apis/{GROUP}", self._api_group)
        app.router.add_get(f"/apis/{GROUP}/{{version}}", self._api_resources)
        app.router.add_get(f"/apis/{GROUP}/{{version}}/namespaces/{{ns}}/endpointslices", self._endpointslices)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def _shutdown(self) -> None:
        for watcher in self._watchers:
            watcher.queue.put_nowait(_CLOSE)
        if self._runner is not None:
            await self._runner.cleanup()

    def _refused(self, request: web.Request, version: str | None = None) -> web.Response | None:
        """The answer to a request that fails before its handler (401, an injected failure, a
        version not served), else None."""
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.json_response(_status(401, "Unauthorized", "Unauthorized"), status=401)
        if self._failures:
            code = self._failures.pop(0)
            return web.json_response(_status(code, "InternalError", f"injected failure {code}"), status=code)
        if version is not None and version not in self.versions:
            return web.json_response(
                _status(404, "NotFound", "the server could not find the requested resource"), status=404
            )
        return None

    def _group(self) -> dict[str, Any]:
        versions = [{"groupVersion": f"{GROUP}/{v}", "version": v} for v in self.versions]
        return {"name": GROUP, "versions": versions, "preferredVersion": versions[0]}

    async def _api_versions(self, request: web.Request) -> web.Response:
        return self._refused(request) or web.json_response({"kind": "APIVersions", "versions": ["v1"]})

    async def _api_groups(self, request: web.Request) -> web.Response:
        groups = [self._group()] if self.versions else []
        return self._refused(request) or web.json_response(
            {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
        )

    async def _api_group(self, request: web.Request) -> web.Response:
        # no version served: the group is unknown, a 404 Status like any unserved path
        return self._refused(request, None if self.versions else "") or web.json_response(
            {"kind": "APIGroup", "apiVersion": "v1", **self._group()}
        )

    async def _api_resources(self, request: web.Request) -> web.Response:
        version = request.match_info["version"]
        return self._refused(request, version) or web.json_response(
            {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": f"{GROUP}/{version}",
                "resources": [
                    {
                        "name": "endpointslices",
                        "singularName": "",
                        "namespaced": True,
                        "kind": "EndpointSlice",
                        "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
                    }
                ],
            }
        )

    async def _endpointslices(self, request: web.Request) -> web.StreamResponse:
        api_version = request.match_info["version"]
        if (refused := self._refused(request, api_version)) is not None:
            return refused
        query = request.query
        try:
            requirements = parse_selector(query.get("labelSelector", ""))
        except SelectorError as exc:
            return web.json_response(_status(400, "BadRequest", str(exc)), status=400)
        version = query.get("resourceVersion", "")
        if version and not version.isdigit():
            return web.json_response(
                _status(400, "BadRequest", f"resourceVersion: Invalid value: {version!r}"), status=400
            )
        ns = request.match_info["ns"]
        if query.get("watch") in ("true", "1"):
            return await self._watch(request, ns, requirements, version, api_version)
        self.lists += 1
        items = [
            convert(o, api_version)
            for (o_ns, _), o in sorted(self.objects.items())
            if o_ns == ns and _matches(requirements, o)
        ]
        for item in items:  # list items carry no kind/apiVersion, as the API sends them
            item.pop("kind", None)
            item.pop("apiVersion", None)
        return web.json_response(
            {
                "kind": "EndpointSliceList",
                "apiVersion": f"{GROUP}/{api_version}",
                "metadata": {"resourceVersion": str(self.rv)},
                "items": items,
            }
        )

    async def _watch(
        self, request: web.Request, ns: str, requirements: list[Requirement], version: str, api_version: str
    ) -> web.StreamResponse:
        self.watches += 1
        timeout = float(query_timeout) if (query_timeout := request.query.get("timeoutSeconds")) else 1800.0
        bookmarks = request.query.get("allowWatchBookmarks") == "true"
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        if version not in ("", "0") and int(version) < self.compacted:
            await self._send_gone(response, version)
            return response
        watcher = _Watcher(ns, requirements)
        if version in ("", "0"):
            for (o_ns, _), obj in sorted(self.objects.items()):
                watcher.queue.put_nowait(_Event(int(obj["metadata"]["resourceVersion"]), "ADDED", o_ns, None, obj))
        else:
            for event in self.history:
                if event.rv > int(version):
                    watcher.queue.put_nowait(event)
        self._watchers.add(watcher)
        deadline = self._loop.time() + timeout
        try:
            while True:
                try:
                    event = await asyncio.wait_for(watcher.queue.get(), deadline - self._loop.time())
                except TimeoutError:
                    if bookmarks:
                        await self._send(
                            response,
                            "BOOKMARK",
                            {
                                "kind": "EndpointSlice",
                                "apiVersion": f"{GROUP}/{api_version}",
                                "metadata": {"resourceVersion": str(self.rv)},
                            },
                        )
                    break
                if event is None:  # compacted while watching
                    await self._send_gone(response, version)
                    break
                if isinstance(event, str):
                    break
                kind = _visible(event, watcher)
                if kind is not None:
                    await self._send(response, kind, convert(event.new, api_version))
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self._watchers.discard(watcher)
        return response

    async def _send_gone(self, response: web.StreamResponse, version: str) -> None:
        self.expired += 1
        await self._send(
            response, "ERROR", _status(410, "Expired", f"too old resource version: {version} ({self.compacted})")
        )

    @staticmethod
    async def _send(response: web.StreamResponse, kind: str, obj: dict[str, Any]) -> None:
        await response.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")


def _visible(event: _Event, watcher: _Watcher) -> str | None:
    """The event type this watcher sees, after namespace and selector filtering."""
    if event.namespace != watcher.namespace:
        return None
    if event.type == "DELETED":
        return "DELETED" if _matches(watcher.requirements, event.new) else None
    was, now = _matches(watcher.requirements, event.old), _matches(watcher.requirements, event.new)
    if was and now:
        return event.type
    if now:
        return "ADDED"
    if was:
        return "DELETED"
    return None
