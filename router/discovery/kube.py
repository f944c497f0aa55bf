"""Replica discovery from Kubernetes EndpointSlices (``discovery.k8s.io/v1`` or ``v1beta1``).

The official ``kubernetes`` client is synchronous, so the list/watch loop runs in one daemon
thread and hands each new snapshot to the event loop with ``call_soon_threadsafe``; request
handling never waits for the API server. The loop is the informer pattern:

0. API discovery: ``GET /apis/discovery.k8s.io`` names the versions the server serves; the
   loop reads ``v1`` when served (Kubernetes 1.21+), else ``v1beta1`` (1.17-1.24; the only one
   on 1.20), asked again at every (re-)list so a cluster upgraded under the router is followed;
   a server serving neither -> back off and ask again (as for an API error);
1. list the slices matching the label selector -> snapshot, and the list's resourceVersion;
2. watch from that resourceVersion (ADDED / MODIFIED / DELETED / BOOKMARK events), re-opening
   the watch from the last seen resourceVersion when the server ends it, until ``resync_s``
   has passed since the list -> back to 1 (periodic full re-list);
3. a 410 Gone (an ERROR event with a Status of code 410, or an HTTP 410) means the
   resourceVersion is too old -> back to 1 at once; a watch stream that breaks -> back to 1;
4. any other API or connection error -> back to 1 after a bounded exponential backoff with
   jitter (tenacity; ``backoff_initial_s`` doubling up to ``backoff_max_s``), forever.

Settings: env prefix ``PROMPTEDGE_ROUTER_K8S_`` (:class:`KubeDiscoverySettings`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Literal

import tenacity
import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException
from pydantic import Field, ValidationError, model_validator
from pydantic_settings import SettingsConfigDict

from opskit import FileSettings
from router.discovery.base import DiscoveredReplica, DiscoveryError, Publish, SourceStats
from router.discovery.slices import GROUP, SliceRules, choose_version, merge, replicas_of, slice_key
from router.errors import RouterError

log = logging.getLogger("router.discovery")

# Errors after which the loop backs off and re-lists: API and connection errors, and answers
# that are not the JSON or the shape the API documents (ValueError, KeyError, TypeError), so a
# bad answer never ends discovery for good.
_TRANSIENT = (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError, KeyError, TypeError)


class KubeDiscoverySettings(FileSettings):
    """EndpointSlice discovery settings (env ``PROMPTEDGE_ROUTER_K8S_`` + field name upper-cased).

    label_selector: which slices, e.g. ``kubernetes.io/service-name=vllm`` (required; any
    selector syntax the API accepts); port_name: the slice port to use (unset: the only port);
    model_label / model: the pool from a slice label, else this fixed name (one is required);
    kubeconfig / context: unset -> in-cluster config when running in a pod, else the default
    kubeconfig. Durations in seconds.
    """

    model_config = SettingsConfigDict(env_prefix="PROMPTEDGE_ROUTER_K8S_", extra="ignore")

    namespace: str = "default"
    label_selector: str = Field(min_length=1)
    port_name: str | None = None
    model_label: str | None = None
    model: str | None = None
    profile_label: str | None = None
    role_label: str | None = None  # slice label: "long" reserves its replicas for long prompts
    scheme: Literal["http", "https"] = "http"
    kubeconfig: Path | None = None
    context: str | None = None
    resync_s: float = Field(300.0, gt=0)
    backoff_initial_s: float = Field(0.5, gt=0)
    backoff_max_s: float = Field(30.0, gt=0)
    request_timeout_s: float = Field(10.0, gt=0)
    start_timeout_s: float = Field(10.0, ge=0)

    @model_validator(mode="after")
    def _pool_source(self) -> KubeDiscoverySettings:
        if not self.model_label and not self.model:
            raise ValueError("set MODEL_LABEL (pool from a slice label) or MODEL (one fixed pool)")
        return self

    def rules(self) -> SliceRules:
        """The pure slice-to-replica rules of these settings."""
        return SliceRules(
            port_name=self.port_name,
            model_label=self.model_label,
            model=self.model,
            profile_label=self.profile_label,
            role_label=self.role_label,
            scheme=self.scheme,
        )


def load_kube_settings(**overrides: Any) -> KubeDiscoverySettings:
    """Settings from the environment (``overrides`` win); raises DiscoveryError naming the variable."""
    try:
        return KubeDiscoverySettings(**overrides)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        field = ".".join(str(p) for p in error["loc"])
        name = f"PROMPTEDGE_ROUTER_K8S_{field.upper()}" if field else "PROMPTEDGE_ROUTER_K8S_*"
        raise DiscoveryError(f"setting {name}: {error['msg']}") from None


def new_api_client(settings: KubeDiscoverySettings) -> k8s.ApiClient:
    """API client from ``kubeconfig``/``context``, else in-cluster (in a pod), else the default
    kubeconfig. Raises DiscoveryError when none is usable."""
    try:
        if settings.kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            configuration = k8s.Configuration()
            k8s_config.load_incluster_config(client_configuration=configuration)
            return k8s.ApiClient(configuration)
        return k8s_config.new_client_from_config(
            config_file=None if settings.kubeconfig is None else str(settings.kubeconfig),
            context=settings.context,
            persist_config=False,
        )
    except (k8s_config.ConfigException, OSError) as exc:
        where = settings.kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise DiscoveryError(
            f"no usable Kubernetes configuration (kubeconfig {where}, context "
            f"{settings.context or 'current'}; or in-cluster): {exc}"
        ) from None


class _Gone(Exception):
    """The watch's resourceVersion is too old (410): re-list now, without backoff."""


class NoServedVersion(RouterError, ValueError):
    """The API server serves no ``discovery.k8s.io`` version this router reads (transient:
    the loop backs off and asks again, as for an API error)."""


class KubeSource:
    """EndpointSlice discovery (a :class:`~router.discovery.ReplicaSource`).

    ``api_client`` is injected so tests can point it at a fake API server. Counters (written by
    the watch thread, read by :meth:`stats` for ``/metrics``): ``lists`` (successful lists),
    ``watches`` (watch requests opened), ``gone`` (410s seen), ``broken`` (watch streams that
    broke), ``errors`` (failed cycles, each followed by a backoff); ``synced_at`` (monotonic s)
    of the last list, watch event or clean watch end.
    """

    def __init__(self, api_client: k8s.ApiClient, settings: KubeDiscoverySettings) -> None:
        self.api_client = api_client
        self.version: str | None = None  # discovery.k8s.io version in use, from API discovery
        self.settings = settings
        self.rules = settings.rules()
        self.lists = self.watches = self.gone = self.broken = self.errors = 0
        self.synced_at: float | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: k8s_watch.Watch | None = None
        self._slices: dict[str, list[DiscoveredReplica]] = {}
        self._published: list[DiscoveredReplica] | None = None
        self._problems: dict[str, str] = {}

    @classmethod
    def from_settings(cls, settings: KubeDiscoverySettings) -> KubeSource:
        """A source with an API client built from ``settings`` (raises DiscoveryError)."""
        return cls(new_api_client(settings), settings)

    async def start(self, publish: Publish) -> None:
        """Start the watch thread; return after the first snapshot is published, or after
        ``start_timeout_s`` (the router then starts with no replicas and keeps trying)."""
        loop = asyncio.get_running_loop()
        first = asyncio.Event()

        def deliver(snapshot: list[DiscoveredReplica]) -> None:
            publish(snapshot)
            first.set()

        def hand_over(snapshot: list[DiscoveredReplica]) -> None:
            try:
                loop.call_soon_threadsafe(deliver, snapshot)
            except RuntimeError:  # the loop closed while the thread was stopping
                self._stopping.set()

        self._thread = threading.Thread(target=self._run, args=(hand_over,), name="router-discovery", daemon=True)
        self._thread.start()
        try:
            await asyncio.wait_for(first.wait(), self.settings.start_timeout_s)
        except TimeoutError:
            log.warning(
                "no EndpointSlice list within %.1f s (namespace %s, selector %s); starting with no "
                "replicas, still trying",
                self.settings.start_timeout_s,
                self.settings.namespace,
                self.settings.label_selector,
            )

    def stats(self) -> SourceStats:
        """The counters so far (plain reads of ints the watch thread writes)."""
        return SourceStats(
            "kubernetes",
            lists=self.lists,
            watches=self.watches,
            gone=self.gone,
            broken=self.broken,
            errors=self.errors,
            synced_at=self.synced_at,
        )

    async def stop(self) -> None:
        """Stop the thread (an open watch is shut down; a list in flight ends within
        ``request_timeout_s``, the thread is a daemon either way) and close the client."""
        self._stopping.set()
        deadline = time.monotonic() + self.settings.request_timeout_s
        while self._thread is not None and self._thread.is_alive() and time.monotonic() < deadline:
            # Again and again: a watch being opened right now has no socket to shut down yet.
            watch = self._watch
            if watch is not None:
                watch.stop()
            await asyncio.to_thread(self._thread.join, 0.05)
        self.api_client.close()

    # --- the watch thread ---------------------------------------------------------------

    def _run(self, hand_over: Publish) -> None:
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(_TRANSIENT),
            wait=tenacity.wait_exponential_jitter(
                multiplier=self.settings.backoff_initial_s,
                jitter=self.settings.backoff_initial_s,
                max=self.settings.backoff_max_s,
            ),
            stop=lambda state: self._stopping.is_set(),
            sleep=self._stopping.wait,
            before_sleep=self._log_error,
            reraise=True,
        )
        while not self._stopping.is_set():
            try:
                # A fresh call per cycle: the backoff restarts once a cycle ended cleanly.
                retrying(self._cycle, hand_over)
            except _TRANSIENT:
                return  # only when stopping: tenacity stops retrying then
            except _Gone:
                self.gone += 1
                log.info("EndpointSlice watch: resourceVersion too old (410 Gone), re-listing")

    def _log_error(self, state: tenacity.RetryCallState) -> None:
        self.errors += 1
        exc = state.outcome.exception() if state.outcome else None
        wait = state.next_action.sleep if state.next_action else 0.0
        detail = f"HTTP {exc.status} {exc.reason}" if isinstance(exc, ApiException) else repr(exc)
        log.warning(
            "EndpointSlice discovery failed (namespace %s, selector %s): %s; retrying in %.1f s",
            self.settings.namespace,
            self.settings.label_selector,
            detail,
            wait,
        )

    def _cycle(self, hand_over: Publish) -> None:
        """Pick the API version, list, then watch until the resync deadline; raises _Gone or a
        transient error."""
        self._pick_version()
        version = self._list(hand_over)
        deadline = time.monotonic() + self.settings.resync_s
        while not self._stopping.is_set():
            left = deadline - time.monotonic()
            if left < 1:
                return
            version = self._watch_once(version, int(left), hand_over)
            if version is None:
                return  # the stream broke: re-list

    def _get(self, path: str, query: list[tuple[str, Any]], request_timeout: Any) -> Any:
        """Raw GET through the client (its host, auth and TLS); returns the unread urllib3
        response. Raises ApiException on a non-2xx answer, as the typed APIs do."""
        request = self.api_client.param_serialize(
            "GET", path, query_params=query, header_params={"Accept": "application/json"}, auth_settings=["BearerToken"]
        )
        response = self.api_client.call_api(*request, _request_timeout=request_timeout)
        if not 200 <= response.status <= 299:
            response.read()
            raise ApiException.from_response(http_resp=response, body=None, data=None)
        return response.response

    def _pick_version(self) -> None:
        """API discovery: the APIGroup document of ``discovery.k8s.io`` -> the version to read.
        Raises NoServedVersion (the group is not served, HTTP 404, or none of its versions is
        known), or a transient API error."""
        try:
            response = self._get(f"/apis/{GROUP}", [], self.settings.request_timeout_s)
        except ApiException as exc:
            if exc.status == 404:
                raise NoServedVersion(f"the API server does not serve API group {GROUP}") from None
            raise
        group = json.loads(response.data)
        chosen = choose_version(group)
        if chosen is None:
            served = [v.get("version") for v in group.get("versions") or []]
            raise NoServedVersion(f"the API server serves {GROUP} versions {served}, none of v1, v1beta1")
        if chosen != self.version:
            log.info(
                "EndpointSlice discovery reads %s/%s (served: %s)",
                GROUP,
                chosen,
                ", ".join(str(v.get("version")) for v in group.get("versions") or []),
            )
        self.version = chosen

    def _request_slices(
        self,
        namespace: str,
        *,
        label_selector: str,
        watch: bool = False,
        resource_version: str | None = None,
        timeout_seconds: int | None = None,
        allow_watch_bookmarks: bool | None = None,
        _preload_content: bool = False,
        _request_timeout: Any = None,
    ) -> Any:
        """List or watch (``watch=True``) the EndpointSlices of ``namespace`` in the picked
        version; the signature is the one the client's ``Watch.stream`` drives."""
        query: list[tuple[str, Any]] = [("labelSelector", label_selector)]
        if watch:
            query.append(("watch", "true"))
        if resource_version is not None:
            query.append(("resourceVersion", resource_version))
        if timeout_seconds is not None:
            query.append(("timeoutSeconds", timeout_seconds))
        if allow_watch_bookmarks is not None:
            query.append(("allowWatchBookmarks", str(allow_watch_bookmarks).lower()))
        return self._get(f"/apis/{GROUP}/{self.version}/namespaces/{namespace}/endpointslices", query, _request_timeout)

    def _list(self, hand_over: Publish) -> str:
        response = self._request_slices(
            self.settings.namespace,
            label_selector=self.settings.label_selector,
            _request_timeout=self.settings.request_timeout_s,
        )
        body = json.loads(response.data)
        self._slices = {}
        for item in body.get("items") or []:
            self._put(item)
        self.lists += 1
        self.synced_at = time.monotonic()
        self._publish(hand_over, force=self.lists == 1)
        return str(body["metadata"]["resourceVersion"])

    def _watch_once(self, version: str, timeout_s: int, hand_over: Publish) -> str | None:
        """One watch request from ``version`` for at most ``timeout_s`` (server side). Returns
        the last seen resourceVersion when the server ended the watch, None if the stream broke."""
        watch = self._watch = k8s_watch.Watch()
        self.watches += 1
        try:
            for event in watch.stream(
                self._request_slices,
                self.settings.namespace,
                label_selector=self.settings.label_selector,
                resource_version=version,
                timeout_seconds=timeout_s,
                allow_watch_bookmarks=True,
                _request_timeout=(self.settings.request_timeout_s, timeout_s + self.settings.request_timeout_s),
            ):
                obj = event["raw_object"]
                version = str(obj["metadata"]["resourceVersion"])
                self.synced_at = time.monotonic()
                if event["type"] in ("ADDED", "MODIFIED"):
                    self._put(obj)
                elif event["type"] == "DELETED":
                    self._slices.pop(slice_key(obj), None)
                    self._problems.pop(slice_key(obj), None)
                self._publish(hand_over)
        except ApiException as exc:
            if exc.status == 410:
                raise _Gone from None
            raise
        except (urllib3.exceptions.ProtocolError, urllib3.exceptions.ReadTimeoutError) as exc:
            if not self._stopping.is_set():
                self.broken += 1
                log.info("EndpointSlice watch stream broke (%r), re-listing", exc)
            return None
        finally:
            self._watch = None
        self.synced_at = time.monotonic()  # the server ended the watch: nothing was missed
        return version

    def _put(self, obj: dict[str, Any]) -> None:
        key = slice_key(obj)
        replicas, problem = replicas_of(obj, self.rules)
        self._slices[key] = replicas
        if problem is None:
            self._problems.pop(key, None)
        elif self._problems.get(key) != problem:  # once per new problem, not on every event
            self._problems[key] = problem
            log.warning("EndpointSlice skipped: %s", problem)

    def _publish(self, hand_over: Publish, force: bool = False) -> None:
        snapshot = merge(self._slices.values())
        if force or snapshot != self._published:
            self._published = snapshot
            if not self._stopping.is_set():
                hand_over(snapshot)
