"""The objects of each overlay fit together: the router discovers the example vLLM pool, finds
Redis, may reach both through the NetworkPolicies; probes, disruption budget and autoscaler
point at the right Pods; every generated ConfigMap/Secret a Pod names exists; the base's RBAC
equals the plain manifests tested against a real API server; and one change in an overlay's
kustomization.yaml (namespace, scaled Deployment) reaches every object that depends on it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from router.discovery.kube import KubeDiscoverySettings
from router.settings import RouterSettings
from tests.deploy.kustomize import DEPLOY, kubectl, needs_kustomize, one, render, rendered
from tests.deploy.test_deploy_settings import container_env, use_pod_settings


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["template"]["spec"]


def pod_labels(obj: dict[str, Any]) -> dict[str, str]:
    return obj["spec"]["template"]["metadata"]["labels"]


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Kubernetes label-selector semantics (matchLabels, In, NotIn, Exists, DoesNotExist)."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        ok = {
            "In": labels.get(key) in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def allowed_egress_ports(policy: dict[str, Any], labels: dict[str, str]) -> set[int]:
    """TCP ports ``policy`` lets its Pods open to a same-namespace Pod with ``labels``."""
    ports = set()
    for rule in policy["spec"].get("egress", []):
        peers = rule.get("to")
        if peers and not any(
            "podSelector" in p and "namespaceSelector" not in p and selects(p["podSelector"], labels) for p in peers
        ):
            continue
        ports.update(p["port"] for p in rule.get("ports", []) if p.get("protocol", "TCP") == "TCP")
    return ports


def allowed_ingress_from(policy: dict[str, Any], labels: dict[str, str], port: int) -> bool:
    """Whether ``policy`` admits a same-namespace Pod with ``labels`` on TCP ``port``."""
    for rule in policy["spec"].get("ingress", []):
        peers = rule.get("from")
        if peers and not any(
            "podSelector" in p and "namespaceSelector" not in p and selects(p["podSelector"], labels) for p in peers
        ):
            continue
        if not rule.get("ports") or any(p["port"] == port for p in rule["ports"]):
            return True
    return False


def test_selector_semantics() -> None:
    assert selects({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": "1"})
    assert not selects({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"b": "1"})
    assert not selects({"matchLabels": {"a": "1"}}, {"a": "2"})


@needs_kustomize
def test_router_discovers_the_example_pool_and_may_reach_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    objects = rendered("edge-pop")
    use_pod_settings(monkeypatch, tmp_path, objects, "promptedge-router")
    kube = KubeDiscoverySettings()
    key, _, service_name = kube.label_selector.partition("=")
    assert key == "kubernetes.io/service-name"  # the label the EndpointSlice controller sets
    service = one(objects, "Service", service_name)
    port = next(p for p in service["spec"]["ports"] if p["name"] == kube.port_name)
    # The slices carry the Service's labels: the pool name comes from there.
    assert kube.model_label in service["metadata"]["labels"]
    vllm = one(objects, "Deployment", "vllm")
    assert selects({"matchLabels": service["spec"]["selector"]}, pod_labels(vllm))
    container_port = next(
        p["containerPort"] for p in pod_spec(vllm)["containers"][0]["ports"] if p["name"] == port["targetPort"]
    )
    assert container_port in allowed_egress_ports(one(objects, "NetworkPolicy", "promptedge-router"), pod_labels(vllm))
    router = one(objects, "Deployment", "promptedge-router")
    assert allowed_ingress_from(one(objects, "NetworkPolicy", "vllm"), pod_labels(router), container_port)


@needs_kustomize
def test_router_finds_redis_and_may_reach_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    objects = rendered("edge-pop")
    use_pod_settings(monkeypatch, tmp_path, objects, "promptedge-router")
    url = urlsplit(RouterSettings().redis_url)
    service = one(objects, "Service", url.hostname)
    assert url.port in [p["port"] for p in service["spec"]["ports"]]
    redis = one(objects, "StatefulSet", service["metadata"]["name"])
    assert redis["spec"]["serviceName"] == service["metadata"]["name"] and redis["spec"]["replicas"] == 1
    router = one(objects, "Deployment", "promptedge-router")
    assert url.port in allowed_egress_ports(one(objects, "NetworkPolicy", "promptedge-router"), pod_labels(redis))
    assert allowed_ingress_from(one(objects, "NetworkPolicy", "promptedge-redis"), pod_labels(router), url.port)
    conf = one(objects, "ConfigMap", "promptedge-redis-config")["data"]["redis.conf"].split("\n")
    assert "appendonly yes" in conf


@needs_kustomize
def test_router_is_highly_available_and_scales_on_cpu() -> None:
    objects = rendered("edge-pop")
    router = one(objects, "Deployment", "promptedge-router")
    labels = pod_labels(router)
    assert router["spec"]["replicas"] >= 2
    terms = pod_spec(router)["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert any(selects(t["podAffinityTerm"]["labelSelector"], labels) for t in terms)
    assert selects(one(objects, "PodDisruptionBudget", "promptedge-router")["spec"]["selector"], labels)
    hpa = one(objects, "HorizontalPodAutoscaler", "promptedge-router")["spec"]
    assert hpa["scaleTargetRef"]["name"] == router["metadata"]["name"] and hpa["minReplicas"] >= 2
    assert [m["resource"]["name"] for m in hpa["metrics"]] == ["cpu"]
    container = pod_spec(router)["containers"][0]
    named_ports = {p["name"] for p in container["ports"]}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/health" and container[probe]["httpGet"]["port"] in named_ports


@needs_kustomize
def test_vllm_replicas_load_drain_and_get_a_gpu() -> None:
    spec = pod_spec(one(rendered("edge-pop"), "Deployment", "vllm"))
    container = spec["containers"][0]
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600  # model download + load
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    sleep = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert 0 < sleep < spec["terminationGracePeriodSeconds"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"


@needs_kustomize
def test_every_referenced_configmap_and_secret_is_rendered() -> None:
    for overlay in ("edge-pop", "central", "central-keda"):
        objects = rendered(overlay)
        names = {(o["kind"], o["metadata"]["name"]) for o in objects}
        for workload in (o for o in objects if o["kind"] in ("Deployment", "StatefulSet")):
            spec = pod_spec(workload)
            refs = [("ConfigMap", v["configMap"]["name"]) for v in spec.get("volumes", []) if "configMap" in v]
            for c in spec["containers"]:
                refs += [("ConfigMap", s["configMapRef"]["name"]) for s in c.get("envFrom", []) if "configMapRef" in s]
                refs += [
                    ("ConfigMap", e["valueFrom"]["configMapKeyRef"]["name"])
                    for e in c.get("env", [])
                    if "configMapKeyRef" in e.get("valueFrom", {})
                ]
                refs += [("Secret", s["secretRef"]["name"]) for s in c.get("envFrom", []) if "secretRef" in s]
            assert set(refs) <= names, f"{overlay}: {workload['metadata']['name']} names {set(refs) - names}"


def _rules(path: Path) -> list[dict[str, Any]]:
    (role,) = [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == "Role"]
    return role["rules"]


def test_base_rbac_equals_the_plain_manifests() -> None:
    """deploy/*-rbac.yaml are applied to a real API server by the router and forecaster tests."""
    assert _rules(DEPLOY / "base/router/rbac.yaml") == _rules(DEPLOY / "router-rbac.yaml")
    assert _rules(DEPLOY / "base/forecaster/rbac.yaml") == _rules(DEPLOY / "forecaster-rbac.yaml")


def _copy_overlay(source: Path, target: Path, edits: dict[str, str]) -> None:
    """``source`` (its kustomization.yaml and the files next to it, settings.yaml among them) in
    ``target`` (a sibling of the other copies) with the paths into deploy/ rewritten relative to
    ``target`` (kustomize refuses absolute ones) and ``edits``."""
    text = (source / "kustomization.yaml").read_text().replace("../../", os.path.relpath(DEPLOY, target) + "/")
    for old, new in edits.items():
        assert old in text, old
        text = text.replace(old, new)
    shutil.copytree(source, target)
    (target / "kustomization.yaml").write_text(text)


@needs_kustomize
def test_one_change_in_the_overlay_reaches_every_dependent_field(tmp_path: Path) -> None:
    _copy_overlay(
        DEPLOY / "overlays/central",
        tmp_path / "central",
        {"namespace: llm": "namespace: pop-7", "DEPLOYMENT=vllm": "DEPLOYMENT=vllm-big"},
    )
    _copy_overlay(DEPLOY / "overlays/central-keda", tmp_path / "central-keda", {})
    objects = render(tmp_path / "central-keda")
    assert {o["metadata"]["namespace"] for o in objects} == {"pop-7"}
    for rule in one(objects, "Role", "promptedge-forecaster")["rules"][:2]:
        assert rule["resourceNames"] == ["vllm-big"]
    scaled = one(objects, "ScaledObject", "vllm-big")["spec"]
    assert scaled["scaleTargetRef"]["name"] == "vllm-big"
    assert urlsplit(scaled["triggers"][0]["metadata"]["url"]).hostname == "promptedge-desired.pop-7.svc"
    assert 'namespace="pop-7"' in scaled["triggers"][1]["metadata"]["query"]
    assert container_env(tuple(objects), "promptedge-forecaster")["PROMPTEDGE_ACTUATOR_DEPLOYMENT"] == "vllm-big"


def _scaled_objects() -> list[dict[str, Any]]:
    plain = [
        d
        for d in yaml.safe_load_all((DEPLOY / "keda-scaledobject.yaml").read_text())
        if d and d["kind"] == "ScaledObject"
    ]
    # the rendered overlay too where kubectl can render it (the plain file alone otherwise)
    return plain + ([one(rendered("central-keda"), "ScaledObject", "vllm")] if kubectl() is not None else [])


def test_every_keda_trigger_says_average_value() -> None:
    """KEDA's ScaledObject reference (keda-docs content/docs/2.17/reference/scaledobject-spec.md,
    "triggers"): with AverageValue the HPA's desired count is metric / target whatever runs now
    (the forecast's desiredReplicas / 1; waiting requests / 8), with Value it is current
    replicas x metric / target, which would multiply a replica count; and `fallback` works only
    for AverageValue triggers. Explicit, not left to the default, so an edit cannot drift."""
    scaled = _scaled_objects()
    assert scaled
    for obj in scaled:
        for trigger in obj["spec"]["triggers"]:
            assert trigger.get("metricType") == "AverageValue", (obj["metadata"]["name"], trigger["name"])
