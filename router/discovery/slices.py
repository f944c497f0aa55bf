"""Pure mapping from EndpointSlice JSON (``discovery.k8s.io/v1`` or ``v1beta1``) to wanted replicas.

Input is the API's JSON (camelCase dicts, as listed or as a watch event's object). Condition
semantics are the API's own (k8s.io/api/discovery/v1 and v1beta1 ``EndpointConditions``, the
same in both): ``ready`` nil means ready; ``serving`` nil defers to ``ready``; ``terminating``
nil means not terminating. The mapping reads only fields both versions share with the same
meaning (labels, ``addressType``, ``ports``, ``endpoints[].addresses`` and ``.conditions``);
where the versions differ (v1beta1 ``topology`` map vs v1 ``nodeName``/``zone``/
``deprecatedTopology``; v1beta1's ``hints`` only from 1.21) nothing is read, so one slice gives
the same replicas in either version. On 1.20, ``serving``/``terminating`` are alpha (feature
gate ``EndpointSliceTerminatingCondition``, off by default): a terminating Pod's endpoint then
leaves the slice at once, which removes the replica (its open requests still finish).

- ready and not terminating -> a replica that takes requests;
- terminating (serving or not) -> draining: its open requests finish, nothing new is sent;
- not ready, not terminating (e.g. failing its readiness probe) -> draining as well, so a
  replica the router already knows keeps its in-flight count but gets no traffic, and one it
  does not know is never added.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeGuard

from pydantic import ValidationError

from router.discovery.base import DiscoveredReplica
from router.settings import ReplicaSpec

GROUP = "discovery.k8s.io"
VERSIONS = ("v1", "v1beta1")  # in order of preference


def choose_version(group: Mapping[str, Any]) -> str | None:
    """The version to read from an ``APIGroup`` document (``GET /apis/discovery.k8s.io``):
    ``v1`` when the server serves it, else ``v1beta1``, else None (neither is served)."""
    served = {v.get("version") for v in group.get("versions") or [] if isinstance(v, Mapping)}
    return next((version for version in VERSIONS if version in served), None)


@dataclass(frozen=True, slots=True)
class SliceRules:
    """How a slice becomes replicas.

    port_name: the slice port to use (None: the slice must have exactly one port);
    model_label: slice label holding the pool (model) name; model: the pool when the label is
    unset or missing; profile_label: slice label copied to ``ReplicaSpec.profile``;
    role_label: slice label holding ``ReplicaSpec.role`` (``long`` reserves the slice's
    replicas for long prompts; missing: ``normal``); scheme: ``http`` or ``https``.
    """

    port_name: str | None = None
    model_label: str | None = None
    model: str | None = None
    profile_label: str | None = None
    role_label: str | None = None
    scheme: str = "http"


def slice_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` of a slice object."""
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def replicas_of(obj: Mapping[str, Any], rules: SliceRules) -> tuple[list[DiscoveredReplica], str | None]:
    """The replicas of one EndpointSlice and, when the slice is skipped, why (for a log line).

    Endpoints without addresses are skipped; of several addresses the first is used (the API
    says they are fungible). FQDN slices are used as host names.
    """
    labels = (obj.get("metadata") or {}).get("labels") or {}
    model = labels.get(rules.model_label) if rules.model_label else None
    model = model or rules.model
    if not model:
        return [], f"slice {slice_key(obj)} has no label {rules.model_label!r} and no default model is set"
    port, problem = _port(obj.get("ports") or [], rules.port_name)
    if port is None:
        return [], f"slice {slice_key(obj)}: {problem}"
    ipv6 = obj.get("addressType") == "IPv6"
    profile = labels.get(rules.profile_label) if rules.profile_label else None
    role = (labels.get(rules.role_label) if rules.role_label else None) or "normal"
    if not _is_role(role):
        return [], f"slice {slice_key(obj)}: label {rules.role_label}={role!r} is not 'long' or 'normal'"
    found: list[DiscoveredReplica] = []
    for endpoint in obj.get("endpoints") or []:
        addresses = endpoint.get("addresses") or []
        if not addresses:
            continue
        host = f"[{addresses[0]}]" if ipv6 else addresses[0]
        try:
            spec = ReplicaSpec(url=f"{rules.scheme}://{host}:{port}", model=model, profile=profile, role=role)
        except ValidationError as exc:
            return [], f"slice {slice_key(obj)}: endpoint {addresses[0]!r}: {exc.errors()[0]['msg']}"
        found.append(DiscoveredReplica(spec, draining=not _takes_requests(endpoint.get("conditions") or {})))
    return found, None


def merge(per_slice: Iterable[list[DiscoveredReplica]]) -> list[DiscoveredReplica]:
    """One snapshot from all slices; a URL in several slices (the endpoints controller moves
    endpoints between slices) takes requests if any slice says so. Sorted by URL."""
    merged: dict[str, DiscoveredReplica] = {}
    for replicas in per_slice:
        for replica in replicas:
            known = merged.get(replica.spec.url)
            if known is None or (known.draining and not replica.draining):
                merged[replica.spec.url] = replica
    return [merged[url] for url in sorted(merged)]


def _is_role(value: object) -> TypeGuard[Literal["normal", "long"]]:
    """True for a role ``ReplicaSpec.role`` takes (a label's value may be anything)."""
    return value in ("normal", "long")


def _takes_requests(conditions: Mapping[str, Any]) -> bool:
    return conditions.get("ready") is not False and conditions.get("terminating") is not True


def _port(ports: list[Mapping[str, Any]], name: str | None) -> tuple[int | None, str]:
    if name is not None:
        match = [p for p in ports if p.get("name") == name]
        if not match:
            return None, f"no port named {name!r} (ports: {[p.get('name') for p in ports]})"
        port = match[0].get("port")
    elif len(ports) == 1:
        port = ports[0].get("port")
    else:
        return None, f"{len(ports)} ports and no port name set (PROMPTEDGE_ROUTER_K8S_PORT_NAME)"
    if not isinstance(port, int):
        return None, "the port has no number"
    return port, ""
