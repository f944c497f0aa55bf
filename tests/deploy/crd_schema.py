"""Validating custom resources against their CRDs' OpenAPI v3 schemas (tests/deploy/crds/),
offline, with ``jsonschema``, the way the API server does with ``fieldValidation=Strict``:
a field the schema does not declare is an error, not silently pruned."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import jsonschema
import yaml

CRDS = Path(__file__).parent / "crds"
# (apiVersion, kind) -> schema file; the files' headers name the source repository, path, commit.
SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor.yaml",
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitor.yaml",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule.yaml",
    ("keda.sh/v1alpha1", "ScaledObject"): "scaledobject.yaml",
}


@functools.cache
def _published(api_version: str, kind: str) -> dict[str, Any]:
    return yaml.safe_load((CRDS / SCHEMAS[(api_version, kind)]).read_text())


def schema(api_version: str, kind: str) -> dict[str, Any]:
    """A fresh copy of the stored openAPIV3Schema for ``kind``; KeyError for a kind without one."""
    return copy.deepcopy(_published(api_version, kind))


def strict(node: Any) -> Any:
    """``node`` (a schema, changed in place and returned) with ``additionalProperties: false``
    on every object that declares ``properties`` and neither ``additionalProperties`` nor
    ``x-kubernetes-preserve-unknown-fields``: an unknown field there becomes an error."""
    if isinstance(node, dict):
        if (
            "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False
        for value in node.values():
            strict(value)
    elif isinstance(node, list):
        for value in node:
            strict(value)
    return node


def errors(obj: dict[str, Any], crd_schema: dict[str, Any] | None = None) -> list[str]:
    """Every violation of ``obj`` against its kind's schema (or ``crd_schema``), as
    ``"<path>: <message>"`` strings; empty when it validates. KeyError for an unknown kind."""
    checked = strict(crd_schema if crd_schema is not None else schema(obj["apiVersion"], obj["kind"]))
    validator = jsonschema.Draft7Validator(checked)
    return sorted(
        f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}" for e in validator.iter_errors(obj)
    )
