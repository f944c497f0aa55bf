"""deploy/overlays render with kustomize and every object passes kubernetes-validate in strict
mode (unknown fields are errors) for Kubernetes 1.29, 1.30 and 1.31."""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import pytest

from tests.deploy.kustomize import OVERLAYS, needs_kustomize, one, rendered

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="pip install -e '.[test]' (kubernetes-validate)"
)

VERSIONS = ("1.29", "1.30", "1.31")
# Custom resources: kubernetes-validate ships only the built-in kinds' schemas.
CUSTOM_KINDS = {"ScaledObject", "ServiceMonitor", "PodMonitor", "PrometheusRule"}

# What each overlay must hold (kind -> count): a missing or doubled object is a failure.
EXPECTED = {
    "edge-pop": {
        "Deployment": 2,
        "StatefulSet": 1,
        "Service": 3,
        "ConfigMap": 2,
        "Secret": 1,
        "ServiceAccount": 1,
        "Role": 1,
        "RoleBinding": 1,
        "PodDisruptionBudget": 1,
        "HorizontalPodAutoscaler": 1,
        "NetworkPolicy": 3,
    },
    "central": {
        "Deployment": 1,
        "Service": 1,
        "ConfigMap": 1,
        "ServiceAccount": 1,
        "Role": 1,
        "RoleBinding": 1,
        "NetworkPolicy": 1,
    },
    "central-keda": {
        "Deployment": 2,
        "Service": 2,
        "ConfigMap": 1,
        "ServiceAccount": 1,
        "Role": 1,
        "RoleBinding": 1,
        "NetworkPolicy": 2,
        "ScaledObject": 1,
    },
    "vllm-advisory": {
        "Deployment": 1,
        "StatefulSet": 1,
        "Service": 2,
        "ConfigMap": 2,
        "ServiceAccount": 1,
        "Role": 1,
        "RoleBinding": 1,
        "NetworkPolicy": 2,
    },
}


def test_every_overlay_is_known() -> None:
    assert sorted(p.name for p in OVERLAYS) == sorted(EXPECTED)


@needs_kustomize
@pytest.mark.parametrize("overlay", sorted(EXPECTED))
def test_overlay_renders_the_expected_objects_in_its_namespace(overlay: str) -> None:
    objects = rendered(overlay)
    assert Counter(o["kind"] for o in objects) == EXPECTED[overlay]
    assert {o["metadata"].get("namespace") for o in objects} == {"llm"}


def _validate(obj: dict[str, Any], version: str) -> None:
    kubernetes_validate.validate(obj, version, strict=True)


@needs_kustomize
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("overlay", sorted(EXPECTED))
def test_every_rendered_object_validates_strictly(overlay: str, version: str) -> None:
    custom = []
    for obj in rendered(overlay):
        try:
            _validate(obj, version)
        except kubernetes_validate.SchemaNotFoundError:
            custom.append(obj["kind"])
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(
                f"{overlay}: {obj['kind']}/{obj['metadata']['name']} on {version}: {exc.message} at {list(exc.path)}"
            ) from None
    assert set(custom) <= CUSTOM_KINDS, f"no schema for built-in kinds {set(custom) - CUSTOM_KINDS}"


@needs_kustomize
def test_strict_validation_rejects_a_misspelt_field() -> None:
    """The check above can fail: a probe under a misspelt key is an error, not ignored."""
    deployment = copy.deepcopy(one(rendered("edge-pop"), "Deployment", "promptedge-router"))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(deployment, "1.30")
