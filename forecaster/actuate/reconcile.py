"""Pure reconcile logic: compare desired with observed scale and build the patch bodies.

No I/O here. Patch bodies are JSON merge patches (RFC 7386) that carry
``metadata.resourceVersion``: the API server then applies them only if the object is still at
that version and answers 409 otherwise (optimistic concurrency, as in kopf and sample-controller).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from forecaster.actuate.errors import InvalidDecision


class DecisionLike(Protocol):
    """What the actuator needs of a planner decision (``forecaster.plan.Decision``)."""

    @property
    def replicas(self) -> int: ...

    @property
    def reason(self) -> str: ...


@dataclass(frozen=True)
class Scale:
    """Observed state of a Deployment's ``scale`` subresource (autoscaling/v1 Scale).

    replicas: ``spec.replicas`` (what is asked for; ``status.replicas`` lags behind it);
    resource_version: the Deployment's resourceVersion; selector: ``status.selector``, the
    label selector of its pods as a string (``app=vllm``), or None when not reported.
    """

    replicas: int
    resource_version: str
    selector: str | None = None


def desired_replicas(decision: DecisionLike) -> int:
    """The replica count to write; raises InvalidDecision for negative or non-integer counts."""
    replicas = decision.replicas
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        raise InvalidDecision(f"decision replicas must be an integer >= 0, got {replicas!r}")
    return replicas


def is_hold(decision: DecisionLike) -> bool:
    """True for a fail-safe hold (``forecaster.plan.Decision.action == "hold"``: inputs were missing)."""
    return getattr(decision, "action", None) == "hold"


def hold_floor(desired: int, observed: int | None, holding: bool) -> int:
    """Replicas to write: on a hold never fewer than observed (no scale-down on missing data), else ``desired``."""
    if holding and observed is not None and observed > desired:
        return observed
    return desired


def needs_scale(observed: Scale, desired: int) -> bool:
    """True when the scale must be written; equal counts mean nothing to do (and nothing is written)."""
    return observed.replicas != desired


def scale_patch(observed: Scale, desired: int) -> dict[str, Any]:
    """Merge patch for the scale subresource, guarded by the observed resourceVersion."""
    return {"metadata": {"resourceVersion": observed.resource_version}, "spec": {"replicas": desired}}


def decision_annotations(prefix: str, desired: int, reason: str, decided_at: datetime) -> dict[str, str]:
    """Annotations recording a decision: ``{prefix}/desired-replicas``, ``/reason``, ``/decided-at`` (RFC 3339 UTC)."""
    stamp = decided_at.astimezone(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    return {
        f"{prefix}/desired-replicas": str(desired),
        f"{prefix}/reason": reason,
        f"{prefix}/decided-at": stamp,
    }


def annotation_patch(resource_version: str, annotations: dict[str, str]) -> dict[str, Any]:
    """Merge patch adding ``annotations`` to the Deployment, guarded by ``resource_version``."""
    return {"metadata": {"resourceVersion": resource_version, "annotations": dict(annotations)}}
