"""The forecaster's 409 path on the real control plane (API server + controller manager), where
the Deployment controller, not the test, writes between the forecaster's read and its patch.

Skipped (with the reason) where ../shared/tools/kube is missing; builds the binaries when needed.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from forecaster.actuate import ActuatorSettings, build_actuator
from forecaster.actuate.kube import KubeScaleAPI
from tests.router.kube_apiserver import running_apiserver

pytestmark = [pytest.mark.kube, pytest.mark.slow]

NS, NAME = "llm", "vllm"


class Decision:
    def __init__(self, replicas: int, reason: str) -> None:
        self.replicas, self.reason = replicas, reason


def _wait(what: str, check, timeout_s: float = 30.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_deployment_controller_status_write_between_read_and_patch_is_a_409_then_a_reread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "kube"
    with running_apiserver(run, control_plane=True):
        kubeconfig = run / "kubeconfig"
        api = k8s_config.new_client_from_config(str(kubeconfig), context="local", persist_config=False)
        core, apps = k8s.CoreV1Api(api), k8s.AppsV1Api(api)
        core.create_namespace({"metadata": {"name": NS}})
        labels = {"app": NAME}
        apps.create_namespaced_deployment(
            NS,
            {
                "metadata": {"name": NAME},
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": labels},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]},
                    },
                },
            },
        )
        _wait(
            "the controller's first status",
            lambda: (
                (d := apps.read_namespaced_deployment(NAME, NS)).status
                and d.status.observed_generation == d.metadata.generation
                and d.status.replicas == 1
            ),
        )
        rs = _wait("the ReplicaSet", lambda: apps.list_namespaced_replica_set(NS, label_selector="app=vllm").items)[0]

        original = KubeScaleAPI.read_scale
        reads: list[str] = []

        def read_then_the_controller_writes(self: KubeScaleAPI):  # type: ignore[no-untyped-def]
            observed = original(self)
            reads.append(observed.resource_version)
            if len(reads) == 1:
                # Provoke the controllers (the ReplicaSet, not the Deployment): the ReplicaSet
                # controller adds Pods, the Deployment controller scales the ReplicaSet back and
                # writes the Deployment's status. The test writes nothing to the Deployment.
                apps.patch_namespaced_replica_set(rs.metadata.name, NS, {"spec": {"replicas": 3}})
                _wait(
                    "a Deployment write by the controller",
                    lambda: (
                        apps.read_namespaced_deployment(NAME, NS).metadata.resource_version != observed.resource_version
                    ),
                )
                # The controllers write the Deployment's status a few times while the ReplicaSet
                # settles; on a loaded machine a write could land between the forecaster's
                # re-read and its second patch (a third attempt: the test failed so once in a
                # full run). Wait until they are done, so exactly one conflict is provoked.
                _wait("the controllers to settle", _settled, timeout_s=60.0)
            return observed

        def _settled() -> bool:
            before = apps.read_namespaced_deployment(NAME, NS).metadata.resource_version
            time.sleep(1.0)
            return apps.read_namespaced_deployment(NAME, NS).metadata.resource_version == before

        monkeypatch.setattr(KubeScaleAPI, "read_scale", read_then_the_controller_writes)
        settings = ActuatorSettings(
            mode="kubernetes",
            namespace=NS,
            deployment=NAME,
            kubeconfig=kubeconfig,
            context="local",
            conflict_backoff_s=0.0,
        )
        result = build_actuator(settings).apply(Decision(4, "forecast peak"), None)  # type: ignore[arg-type]
        print(result.summary(), reads)
        assert (result.action, result.attempts) == ("scaled", 2)
        assert reads[0] != reads[1]  # the re-read saw the controller's write
        deployment = apps.read_namespaced_deployment(NAME, NS)
        assert deployment.spec.replicas == 4
        managers = {f.manager for f in deployment.metadata.managed_fields or []}
        assert "kube-controller-manager" in managers, managers
