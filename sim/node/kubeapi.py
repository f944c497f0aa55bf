"""The stand-in node's only door to Kubernetes: a few CoreV1 calls on the API's JSON.

Every call goes through the official ``kubernetes`` client; bodies and results are plain
dicts (camelCase, as on the wire). Errors are translated here, once: a missing object is
``None``/``False``, anything else (an API error, the server unreachable) is NodeApiError,
which the node's loop logs and retries on its next pass.
"""

from __future__ import annotations

import json
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException


class NodeApiError(RuntimeError):
    """A Kubernetes API call failed for a reason other than "not found" (temporary: retried)."""


def _wrap(what: str, exc: Exception) -> NodeApiError:
    if isinstance(exc, ApiException):
        return NodeApiError(f"{what}: HTTP {exc.status} {exc.reason}")
    return NodeApiError(f"{what}: {type(exc).__name__}: {exc}")


_ERRORS = (ApiException, urllib3.exceptions.HTTPError, OSError)


class KubeApi:
    """The calls the node makes, over ``core`` (a CoreV1Api)."""

    def __init__(self, core: client.CoreV1Api) -> None:
        self.core = core

    def list_pods(self, node_name: str) -> list[dict[str, Any]]:
        """Pods of every namespace bound to ``node_name`` (``spec.nodeName``), as JSON."""
        try:
            resp = self.core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={node_name}", _preload_content=False, _request_timeout=10
            )
            return list(json.loads(resp.data)["items"])
        except _ERRORS as exc:
            raise _wrap("list pods", exc) from None

    def get_node(self, name: str) -> dict[str, Any] | None:
        """The Node as JSON, or None when it does not exist."""
        try:
            resp = self.core.read_node(name, _preload_content=False, _request_timeout=10)
            return dict(json.loads(resp.data))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _wrap(f"read node {name}", exc) from None
        except _ERRORS as exc:
            raise _wrap(f"read node {name}", exc) from None

    def create_node(self, body: dict[str, Any]) -> None:
        """Create the Node; one that already exists is fine."""
        try:
            self.core.create_node(body, _request_timeout=10)
        except ApiException as exc:
            if exc.status != 409:
                raise _wrap("create node", exc) from None
        except _ERRORS as exc:
            raise _wrap("create node", exc) from None

    def patch_node(self, name: str, body: dict[str, Any]) -> None:
        """Strategic-merge patch of the Node (e.g. its taints)."""
        try:
            self.core.patch_node(name, body, _request_timeout=10)
        except _ERRORS as exc:
            raise _wrap(f"patch node {name}", exc) from None

    def patch_node_status(self, name: str, body: dict[str, Any]) -> None:
        """Strategic-merge patch of the Node's status subresource."""
        try:
            self.core.patch_node_status(name, body, _request_timeout=10)
        except _ERRORS as exc:
            raise _wrap(f"patch node status {name}", exc) from None

    def patch_pod_status(self, namespace: str, name: str, body: dict[str, Any]) -> bool:
        """Strategic-merge patch of a Pod's status; False when the Pod no longer exists."""
        try:
            self.core.patch_namespaced_pod_status(name, namespace, body, _request_timeout=10)
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise _wrap(f"patch pod status {namespace}/{name}", exc) from None
        except _ERRORS as exc:
            raise _wrap(f"patch pod status {namespace}/{name}", exc) from None

    def delete_pod_now(self, namespace: str, name: str, uid: str) -> None:
        """Delete the Pod with grace period 0 (the node confirms it stopped); guarded by its
        UID so a new Pod of the same name is never deleted; gone already is fine."""
        body = client.V1DeleteOptions(grace_period_seconds=0, preconditions=client.V1Preconditions(uid=uid))
        try:
            self.core.delete_namespaced_pod(name, namespace, body=body, grace_period_seconds=0, _request_timeout=10)
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise _wrap(f"delete pod {namespace}/{name}", exc) from None
        except _ERRORS as exc:
            raise _wrap(f"delete pod {namespace}/{name}", exc) from None
