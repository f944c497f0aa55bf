"""Kubernetes adapter: the scale subresource, Deployment annotations and pod readiness times.

The one place that talks to the API server (official ``kubernetes`` client) and the one
boundary where its errors (``ApiException``, urllib3 transport errors, config errors) become
``forecaster.actuate.errors`` types. Every call carries a request timeout, so no call can hang a run.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from forecaster.actuate.errors import (
    ActuationConfigError,
    KubeConflict,
    KubeForbidden,
    KubeNotFound,
    KubeResource,
    KubeUnavailable,
)
from forecaster.actuate.reconcile import Scale
from forecaster.actuate.settings import ActuatorSettings

MERGE_PATCH = "application/merge-patch+json"


WARMUP_SAMPLE_ANNOTATION = "promptedge.io/warmup-sample"


@dataclass(frozen=True)
class PodTimes:
    """Facts about one pod for warm-up measurement: creation, Ready condition time, container
    restarts; ``sample`` False when the pod is annotated ``promptedge.io/warmup-sample: "false"``
    (its creation -> Ready is not a warm-up: e.g. restored from a snapshot, or a simulated
    replica that stands for one already serving)."""

    created: datetime
    ready_at: datetime | None
    restarts: int
    sample: bool = True


def new_api_client(settings: ActuatorSettings) -> k8s.ApiClient:
    """API client from ``settings.kubeconfig``/``context``, else in-cluster, else the default kubeconfig.

    Raises ActuationConfigError when no usable configuration is found.
    """
    try:
        configuration = k8s.Configuration()
        if settings.kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            k8s_config.load_incluster_config(client_configuration=configuration)
        else:
            k8s_config.load_kube_config(
                config_file=str(settings.kubeconfig) if settings.kubeconfig else None,
                context=settings.context,
                client_configuration=configuration,
                persist_config=False,
            )
        # no hidden urllib3 retries: each call is bounded by its one REQUEST_TIMEOUT_S (three
        # retries made a silent API server cost 4x that, with the daemon deaf to SIGTERM)
        configuration.retries = False
        return k8s.ApiClient(configuration)
    except (k8s_config.ConfigException, OSError) as exc:
        where = settings.kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise ActuationConfigError(
            f"no usable Kubernetes configuration (kubeconfig {where}, context "
            f"{settings.context or 'current'}; or in-cluster): {exc}"
        ) from None


class KubeScaleAPI:
    """One Deployment's scale subresource, its annotations and its pods.

    ``api_client``: a configured ``kubernetes.client.ApiClient`` (injected so tests can point it
    at a fake or a real local API server). Errors: KubeForbidden, KubeNotFound, KubeConflict,
    KubeUnavailable, each naming namespace/deployment, (sub)resource and verb.
    """

    def __init__(self, api_client: k8s.ApiClient, namespace: str, deployment: str, timeout_s: float) -> None:
        self._apps = k8s.AppsV1Api(api_client)
        self._core = k8s.CoreV1Api(api_client)
        self._namespace = namespace
        self._deployment = deployment
        self._timeout = timeout_s

    def _resource(
        self, resource: str = "deployments", subresource: str | None = None, group: str = "apps"
    ) -> KubeResource:
        return KubeResource(self._namespace, self._deployment, resource, subresource, group)

    def read_scale(self) -> Scale:
        """GET deployments/{name}/scale -> Scale (spec.replicas, resourceVersion, status.selector)."""
        with _boundary(self._resource(subresource="scale"), "get"):
            scale = self._apps.read_namespaced_deployment_scale(
                self._deployment, self._namespace, _request_timeout=self._timeout
            )
        return _to_scale(scale)

    def read_replicas(self) -> tuple[int, int]:
        """GET deployments/{name} -> (spec.replicas, status.readyReplicas); an absent readyReplicas
        (no Pod Ready yet) is 0."""
        with _boundary(self._resource(), "get"):
            deployment = self._apps.read_namespaced_deployment(
                self._deployment, self._namespace, _request_timeout=self._timeout
            )
        spec = deployment.spec.replicas if deployment.spec and deployment.spec.replicas is not None else 1
        ready = deployment.status.ready_replicas if deployment.status else None
        return int(spec), int(ready or 0)

    def patch_scale(self, body: dict[str, Any]) -> Scale:
        """PATCH deployments/{name}/scale with a merge patch; returns the Scale after the write."""
        with _boundary(self._resource(subresource="scale"), "patch"):
            scale = self._apps.patch_namespaced_deployment_scale(
                self._deployment,
                self._namespace,
                body,
                _content_type=MERGE_PATCH,
                _request_timeout=self._timeout,
            )
        return _to_scale(scale)

    def patch_deployment(self, body: dict[str, Any]) -> None:
        """PATCH deployments/{name} with a merge patch (used for annotations only)."""
        with _boundary(self._resource(), "patch"):
            self._apps.patch_namespaced_deployment(
                self._deployment,
                self._namespace,
                body,
                _content_type=MERGE_PATCH,
                _request_timeout=self._timeout,
            )

    def list_pod_times(self, selector: str) -> list[PodTimes]:
        """LIST pods matching ``selector`` in the namespace -> creation / Ready times and restarts."""
        resource = KubeResource(self._namespace, self._deployment, "pods", group="")
        with _boundary(resource, "list"):
            pods = self._core.list_namespaced_pod(
                self._namespace, label_selector=selector, _request_timeout=self._timeout
            )
        return [_pod_times(pod) for pod in pods.items]


def _to_scale(scale: k8s.V1Scale) -> Scale:
    return Scale(
        replicas=(scale.spec.replicas if scale.spec and scale.spec.replicas is not None else 0),
        resource_version=scale.metadata.resource_version or "",
        selector=scale.status.selector if scale.status else None,
    )


def _pod_times(pod: k8s.V1Pod) -> PodTimes:
    conditions = (pod.status.conditions if pod.status else None) or []
    ready_at = next((c.last_transition_time for c in conditions if c.type == "Ready" and c.status == "True"), None)
    statuses = (pod.status.container_statuses if pod.status else None) or []
    return PodTimes(
        created=pod.metadata.creation_timestamp,
        ready_at=ready_at,
        restarts=sum(s.restart_count for s in statuses),
        sample=((pod.metadata.annotations or {}).get(WARMUP_SAMPLE_ANNOTATION, "true").lower() != "false"),
    )


@contextmanager
def _boundary(resource: KubeResource, verb: str) -> Iterator[None]:
    """Translate client errors for one call on ``resource`` with RBAC ``verb``."""
    try:
        yield
    except ApiException as exc:
        detail = _status_message(exc)
        if exc.status == 403:
            raise KubeForbidden(resource, verb, detail) from None
        if exc.status == 404:
            raise KubeNotFound(resource, verb, detail) from None
        if exc.status == 409:
            raise KubeConflict(resource, verb, detail) from None
        raise KubeUnavailable(
            resource, verb, exc.status, f"{verb} {resource} failed: HTTP {exc.status} {detail}"
        ) from None
    except urllib3.exceptions.HTTPError as exc:
        raise KubeUnavailable(
            resource, verb, None, f"{verb} {resource} failed: API server unreachable or too slow: {exc}"
        ) from None


def _status_message(exc: ApiException) -> str:
    """The ``message`` of the API server's Status body, else the HTTP reason."""
    try:
        return str(json.loads(exc.body or "")["message"])
    except (ValueError, KeyError, TypeError):
        return str(exc.reason or "no message")
