"""The overlays applied to the real Kubernetes 1.20 API server of ``../shared/tools/kube`` (the
control plane the closed loop runs on): what 1.20 accepts and what it cannot serve.

1.20 serves neither ``policy/v1`` PodDisruptionBudget (1.21) nor ``autoscaling/v2``
HorizontalPodAutoscaler (1.23); the base uses those versions because 1.25 and 1.26 removed
the old ones (policy/v1beta1, autoscaling/v2beta2). Every other object is created as rendered.
Custom resources (ScaledObject) need KEDA's CRD, which this server does not have.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from tests.deploy.kustomize import kubectl, needs_kustomize, rendered
from tests.router.kube_apiserver import running_apiserver

NOT_SERVED_BY_1_20 = {("PodDisruptionBudget", "policy/v1"), ("HorizontalPodAutoscaler", "autoscaling/v2")}


@needs_kustomize
def test_1_20_creates_everything_but_the_kinds_it_does_not_serve(tmp_path: Path) -> None:
    objects = [*rendered("edge-pop"), *rendered("central")]
    manifest = tmp_path / "all.yaml"
    manifest.write_text(yaml.safe_dump_all(objects))
    with running_apiserver(tmp_path / "kube"):
        base = [kubectl() or "kubectl", "--kubeconfig", str(tmp_path / "kube" / "kubeconfig")]
        subprocess.run([*base, "create", "namespace", "llm"], check=True, capture_output=True, timeout=60)
        done = subprocess.run(
            [*base, "create", "-f", str(manifest), "-o", "name"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    created = set(done.stdout.split())
    refused = set()
    for obj in objects:
        group = obj["apiVersion"].split("/")[0] if "/" in obj["apiVersion"] else ""
        name = f"{obj['kind'].lower()}{'.' + group if group else ''}/{obj['metadata']['name']}"
        if name not in created:
            refused.add((obj["kind"], obj["apiVersion"]))
    assert refused == NOT_SERVED_BY_1_20, done.stderr
    for kind, version in NOT_SERVED_BY_1_20:
        assert f'kind "{kind}" in version "{version}"' in done.stderr
    assert len(created) == len(objects) - len(NOT_SERVED_BY_1_20)
