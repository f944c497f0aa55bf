"""deploy/: manifests parse, RBAC is least privilege and consistent with the workloads, the image covers the imports."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.distributions import closure, image_extras, requirements, third_party_imports, uncovered

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def load(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((DEPLOY / name).read_text()) if doc]


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [doc for doc in docs if doc["kind"] == kind]
    return found


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container["env"]}


# compose.yaml is Docker Compose, not Kubernetes (tests/deploy/test_deploy_compose.py checks it)
@pytest.mark.parametrize(
    "path", sorted(p for p in DEPLOY.glob("*.yaml") if p.name != "compose.yaml"), ids=lambda p: p.name
)
def test_every_manifest_parses_with_kind_and_name(path: Path) -> None:
    docs = load(path.name)
    assert docs
    for doc in docs:
        assert doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"]


def test_role_grants_only_scale_annotations_and_pod_list() -> None:
    role = by_kind(load("forecaster-rbac.yaml"), "Role")
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): r for r in role["rules"]}
    assert set(rules) == {(("apps",), ("deployments/scale",)), (("apps",), ("deployments",)), (("",), ("pods",))}
    scale = rules[("apps",), ("deployments/scale",)]
    assert sorted(scale["verbs"]) == ["get", "patch"] and scale["resourceNames"] == ["vllm"]
    deployments = rules[("apps",), ("deployments",)]
    # get: advisory mode reads status.readyReplicas; patch: the decision's annotations
    assert deployments["verbs"] == ["get", "patch"] and deployments["resourceNames"] == ["vllm"]
    assert rules[("",), ("pods",)]["verbs"] == ["list"]
    assert "*" not in yaml.safe_dump(role["rules"])


def test_workloads_run_as_the_bound_service_account_on_the_granted_deployment() -> None:
    rbac = load("forecaster-rbac.yaml")
    account = by_kind(rbac, "ServiceAccount")["metadata"]["name"]
    binding = by_kind(rbac, "RoleBinding")
    assert binding["roleRef"]["name"] == by_kind(rbac, "Role")["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": "llm"}]
    granted = by_kind(rbac, "Role")["rules"][0]["resourceNames"]

    cron = by_kind(load("forecaster-cronjob.yaml"), "CronJob")
    daemon = by_kind(load("forecaster-daemon.yaml"), "Deployment")
    cron_pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    for pod in (cron_pod, daemon["spec"]["template"]["spec"]):
        assert pod["serviceAccountName"] == account
        env = env_of(pod["containers"][0])
        assert [env["PROMPTEDGE_ACTUATOR_DEPLOYMENT"]] == granted
        assert env["PROMPTEDGE_ACTUATOR_MODE"] == "kubernetes"
    assert cron_pod["containers"][0]["args"] == ["run", "--once"]
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    assert daemon["spec"]["replicas"] == 1 and daemon["spec"]["strategy"]["type"] == "Recreate"


def test_scaled_object_reads_desired_replicas_from_the_endpoint_service() -> None:
    docs = load("keda-scaledobject.yaml")
    scaled = by_kind(docs, "ScaledObject")
    service = by_kind(docs, "Service")
    (trigger,) = [t for t in scaled["spec"]["triggers"] if t["type"] == "metrics-api"]
    meta = trigger["metadata"]
    # AverageValue with target 1 makes the HPA's desired count equal the published number.
    assert (trigger["metricType"], meta["targetValue"], meta["valueLocation"]) == (
        "AverageValue",
        "1",
        "desiredReplicas",
    )
    port = service["spec"]["ports"][0]["port"]
    assert meta["url"] == f"http://{service['metadata']['name']}.llm.svc:{port}/desired"
    assert scaled["spec"]["minReplicaCount"] >= 1
    endpoint = by_kind(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert env_of(endpoint)["PROMPTEDGE_ACTUATOR_DEPLOYMENT"] == scaled["spec"]["scaleTargetRef"]["name"]


def test_dockerfile_installs_every_third_party_import_of_the_forecaster() -> None:
    # the extras it installs plus what they pull in; prophet and matplotlib are optional extras,
    # imported only when asked for (--plot, model "prophet"), each with its pip install hint
    installed = set(closure(requirements(*image_extras(DEPLOY / "Dockerfile"))))
    missing = uncovered(third_party_imports("forecaster", "opskit") - {"prophet", "matplotlib"}, installed)
    assert not missing, f"add to the forecaster extra in pyproject.toml: {missing}"
