"""The custom resources in deploy/ (Prometheus Operator ServiceMonitor, PodMonitor,
PrometheusRule; KEDA ScaledObject) validate against their CRDs' OpenAPI v3 schemas, stored in
tests/deploy/crds/ with their source; unknown fields are errors, as under strict field
validation. kubernetes-validate has no schemas for these kinds (test_deploy_render.py)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.crd_schema import SCHEMAS, errors, schema
from tests.deploy.kustomize import DEPLOY, needs_kustomize, render, rendered

FILES = [
    DEPLOY / "monitoring" / "servicemonitors.yaml",
    DEPLOY / "monitoring" / "podmonitor.yaml",
    DEPLOY / "monitoring" / "prometheusrule.yaml",
    DEPLOY / "components" / "keda" / "scaledobject.yaml",
    DEPLOY / "keda-scaledobject.yaml",
]


def custom_resources(path: Path) -> list[dict[str, Any]]:
    """The objects in ``path`` whose kind has a stored CRD schema."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return [d for d in docs if (d["apiVersion"], d["kind"]) in SCHEMAS]


def test_every_custom_resource_file_is_checked() -> None:
    kinds = {o["kind"] for path in FILES for o in custom_resources(path)}
    assert kinds == {kind for _, kind in SCHEMAS}


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_custom_resources_validate_against_their_crd(path: Path) -> None:
    objects = custom_resources(path)
    assert objects
    for obj in objects:
        assert errors(obj) == [], f"{obj['kind']}/{obj['metadata']['name']}"


@needs_kustomize
def test_rendered_custom_resources_validate() -> None:
    objects = [
        o
        for o in render(DEPLOY / "monitoring") + list(rendered("central-keda"))
        if (o["apiVersion"], o["kind"]) in SCHEMAS
    ]
    assert {o["kind"] for o in objects} == {kind for _, kind in SCHEMAS}
    for obj in objects:
        assert errors(obj) == [], f"{obj['kind']}/{obj['metadata']['name']}"


def _first(path: Path, kind: str) -> dict[str, Any]:
    return copy.deepcopy(next(o for o in custom_resources(path) if o["kind"] == kind))


def test_a_misspelt_field_fails() -> None:
    monitor = _first(DEPLOY / "monitoring" / "servicemonitors.yaml", "ServiceMonitor")
    monitor["spec"]["endpoints"][0]["intervall"] = monitor["spec"]["endpoints"][0].pop("interval")
    assert errors(monitor) == ["spec.endpoints.0: Additional properties are not allowed ('intervall' was unexpected)"]
    pods = _first(DEPLOY / "monitoring" / "podmonitor.yaml", "PodMonitor")
    pods["spec"]["podMetricEndpoints"] = pods["spec"].pop("podMetricsEndpoints")
    assert errors(pods) == ["spec: Additional properties are not allowed ('podMetricEndpoints' was unexpected)"]


def test_wrong_values_fail() -> None:
    rule = _first(DEPLOY / "monitoring" / "prometheusrule.yaml", "PrometheusRule")
    rule["spec"]["groups"][0]["rules"][0]["for"] = "5 minutes"
    del rule["spec"]["groups"][0]["rules"][1]["expr"]
    assert [e.split(":")[0] for e in errors(rule)] == ["spec.groups.0.rules.0.for", "spec.groups.0.rules.1"]
    scaled = _first(DEPLOY / "keda-scaledobject.yaml", "ScaledObject")
    scaled["spec"]["fallback"]["behavior"] = "currentReplicasIfHigherr"
    assert [e.split(":")[0] for e in errors(scaled)] == ["spec.fallback.behavior"]


def test_fallback_behavior_needs_keda_2_17() -> None:
    """Without 2.17's fallback.behavior (the published pre-2.17 schema) the ScaledObject fails:
    deploy/README.md's 'KEDA >= 2.17' is a requirement, not a preference."""
    older = schema("keda.sh/v1alpha1", "ScaledObject")
    del older["properties"]["spec"]["properties"]["fallback"]["properties"]["behavior"]
    for path in (DEPLOY / "keda-scaledobject.yaml", DEPLOY / "components" / "keda" / "scaledobject.yaml"):
        assert errors(_first(path, "ScaledObject"), older) == [
            "spec.fallback: Additional properties are not allowed ('behavior' was unexpected)"
        ]
