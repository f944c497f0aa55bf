"""deploy/overlays/vllm-advisory: the forecaster in advisory mode next to an existing vLLM
Deployment, reading Prometheus with the default query, and the one setting that switches it to
scaling. Rendered with kustomize (skipped, saying why, without kustomize v5) and loaded with
the real settings loader, as the Pod would."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from forecaster.actuate.settings import ActuatorSettings
from forecaster.settings import ForecasterSettings
from tests.deploy.kustomize import DEPLOY, needs_kustomize, one, render, rendered
from tests.deploy.test_deploy_settings import use_pod_settings

OVERLAY = "vllm-advisory"


@needs_kustomize
def test_the_drop_in_advises_on_the_named_deployment_from_prometheus(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    objects = rendered(OVERLAY)
    use_pod_settings(monkeypatch, tmp_path, objects, "promptedge-forecaster")
    actuator, forecaster = ActuatorSettings(), ForecasterSettings()
    assert (actuator.mode, actuator.namespace, actuator.deployment) == ("advisory", "llm", "vllm")
    # no source and no query written: the Prometheus URL alone selects vLLM's own counter
    assert forecaster.source == "prometheus"
    assert forecaster.prometheus_query == ForecasterSettings.model_fields["prometheus_query"].default
    assert forecaster.redis_url == actuator.redis_url == "redis://promptedge-redis:6379/0"
    role = one(objects, "Role", "promptedge-forecaster")
    deployments = [r for r in role["rules"] if r["resources"] == ["deployments"]]
    assert deployments[0]["resourceNames"] == ["vllm"] and "get" in deployments[0]["verbs"]
    assert not [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "vllm"]  # yours


@needs_kustomize
@pytest.mark.parametrize("mode", ["kubernetes", "keda"])
def test_one_setting_switches_it_to_scaling(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, mode: str) -> None:
    """A user's overlay on top that changes PROMPTEDGE_ACTUATOR_MODE and nothing else."""
    overlay = tmp_path / "mine"
    shutil.copytree(DEPLOY / "overlays" / OVERLAY, tmp_path / "deploy" / "overlays" / OVERLAY)
    for part in ("base", "components"):
        (tmp_path / "deploy" / part).symlink_to(DEPLOY / part)
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [../deploy/overlays/{OVERLAY}]\n"
        "configMapGenerator:\n  - name: promptedge-forecaster-settings\n    behavior: merge\n"
        f"    literals: [PROMPTEDGE_ACTUATOR_MODE={mode}]\n"
    )
    objects = tuple(render(overlay))
    use_pod_settings(monkeypatch, tmp_path, objects, "promptedge-forecaster")
    assert ActuatorSettings().mode == mode
    assert ForecasterSettings().source == "prometheus"
