"""Errors the actuator reports, one tree.

``ActuationError`` is the base; the CLI maps every subclass to exit code 3 (see
``forecaster.scheduler.ExitCode``) except ``ActuationConfigError`` (exit code 2, bad settings).
Kubernetes client errors are translated into these in one place, ``forecaster.actuate.kube``.
"""

from __future__ import annotations

from dataclasses import dataclass

from forecaster.errors import ForecasterError


@dataclass(frozen=True)
class KubeResource:
    """The object a call addressed: ``namespace/name`` of ``group`` ``resource[/subresource]``."""

    namespace: str
    name: str
    resource: str = "deployments"
    subresource: str | None = None
    group: str = "apps"

    @property
    def rbac_resource(self) -> str:
        """Resource as an RBAC rule spells it, e.g. ``deployments/scale``."""
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource

    def __str__(self) -> str:
        group = f".{self.group}" if self.group else ""
        return f"{self.rbac_resource}{group} {self.namespace}/{self.name}"


class ActuationError(ForecasterError):
    """Base class: the decision could not be carried out (nothing or only part was written).

    Part of the forecaster's one error tree; callers that map errors to exit codes must test
    for ActuationError before ForecasterError.
    """


class ActuationConfigError(ActuationError):
    """Actuator settings that cannot work (unknown mode, missing deployment, unreadable kubeconfig)."""


class InvalidDecision(ActuationError):
    """A decision the actuator refuses, e.g. a negative replica count."""


class KubeApiError(ActuationError):
    """A Kubernetes API call failed; ``resource`` and ``verb`` name the call, ``status`` the HTTP code."""

    def __init__(self, resource: KubeResource, verb: str, status: int | None, message: str) -> None:
        self.resource = resource
        self.verb = verb
        self.status = status
        super().__init__(message)


class KubeForbidden(KubeApiError):
    """403: the service account lacks the RBAC ``verb`` on ``resource``; the message says what to grant."""

    def __init__(self, resource: KubeResource, verb: str, detail: str) -> None:
        names = f' resourceNames: ["{resource.name}"]' if verb not in ("list", "create") else ""
        super().__init__(
            resource,
            verb,
            403,
            f"forbidden: cannot {verb} {resource}. Missing RBAC rule: apiGroups: "
            f'["{resource.group}"] resources: ["{resource.rbac_resource}"] verbs: ["{verb}"]'
            f"{names} in namespace {resource.namespace} (see deploy/forecaster-rbac.yaml). "
            f"API server said: {detail}",
        )


class KubeNotFound(KubeApiError):
    """404: the Deployment (or its namespace) does not exist."""

    def __init__(self, resource: KubeResource, verb: str, detail: str) -> None:
        super().__init__(
            resource,
            verb,
            404,
            f"not found: {resource} (check PROMPTEDGE_ACTUATOR_NAMESPACE and "
            f"PROMPTEDGE_ACTUATOR_DEPLOYMENT). API server said: {detail}",
        )


class KubeConflict(KubeApiError):
    """409: the object changed since it was read (resourceVersion mismatch); re-read and retry."""

    def __init__(self, resource: KubeResource, verb: str, detail: str) -> None:
        super().__init__(resource, verb, 409, f"conflict on {verb} {resource}: {detail}")


class KubeUnavailable(KubeApiError):
    """The API server could not be reached in time, or answered 5xx/401/other; nothing was decided."""


class PublishUnavailable(ActuationError):
    """The store behind the KEDA/HPA endpoint (Redis) could not be written or read in time."""
