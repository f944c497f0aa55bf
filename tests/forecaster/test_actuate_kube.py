"""Actuator against a REAL kube-apiserver (v1.20.2 + etcd, RBAC on) from ../shared/tools/kube.

The fixture builds the binaries when needed (cached per machine; build.sh returns at once when
built), starts etcd + kube-apiserver on free ports in a temporary directory, applies the Role of
deploy/forecaster-rbac.yaml and binds it to the kubeconfig's ``limited`` user, so these tests
run the actuator with exactly the permissions the forecaster gets in a cluster. Skipped only
when the tool scripts (or openssl/curl they need) are absent; a failed build or start fails.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from forecaster.actuate import (
    ActuatorSettings,
    KubeConflict,
    KubeForbidden,
    KubeNotFound,
    build_actuator,
    measure_warmup,
)
from forecaster.actuate.kube import KubeScaleAPI
from forecaster.actuate.reconcile import scale_patch

pytestmark = [pytest.mark.kube, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
TOOLS = Path(os.environ.get("PROMPTEDGE_KUBE_TOOLS", ROOT.parent / "shared" / "tools" / "kube"))
NS, NAME = "llm", "vllm"


@dataclass(frozen=True)
class Decision:
    replicas: int
    reason: str


def _free_ports(count: int) -> int:
    """A base port such that base .. base+count-1 are free on 127.0.0.1."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + count > 65535:
            continue
        try:
            held = []
            for port in range(base, base + count):
                sock = socket.socket()
                held.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise RuntimeError("no free port range")


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    if not (TOOLS / "start.sh").is_file():
        pytest.skip(f"no kube-apiserver tools at {TOOLS} (set PROMPTEDGE_KUBE_TOOLS)")
    missing = [tool for tool in ("openssl", "curl", "apt-get") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"kube-apiserver tools need {missing} on PATH")
    build = subprocess.run([str(TOOLS / "build.sh")], capture_output=True, text=True, timeout=1800)
    if build.returncode != 0:
        pytest.fail(f"{TOOLS}/build.sh failed ({build.returncode}):\n{build.stderr[-3000:]}")
    run = tmp_path_factory.mktemp("kube-run")
    env = {
        **os.environ,
        "RUN": str(run),
        "AUTHZ": "RBAC",
        "API_PORT": str(_free_ports(1)),
        "ETCD_PORT": str(_free_ports(3)),
    }
    start = subprocess.run([str(TOOLS / "start.sh")], env=env, capture_output=True, text=True, timeout=240)
    try:
        if start.returncode != 0:
            log = (run / "kube-apiserver.log").read_text()[-3000:] if (run / "kube-apiserver.log").exists() else ""
            pytest.fail(f"start.sh failed ({start.returncode}): {start.stderr[-2000:]}\n{log}")
        path = Path(start.stdout.strip().splitlines()[-1])
        _seed(path)
        yield path
    finally:
        subprocess.run([str(TOOLS / "stop.sh"), "--wipe"], env=env, capture_output=True, timeout=60)


def _admin(kubeconfig: Path, context: str = "local") -> k8s.ApiClient:
    return k8s_config.new_client_from_config(str(kubeconfig), context=context, persist_config=False)


def _deployment(name: str, replicas: int) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]},
            },
        },
    }


def _seed(kubeconfig: Path) -> None:
    """Namespace, two Deployments, deploy/ RBAC as shipped, and a binding of its Role to user ``limited``."""
    api = _admin(kubeconfig)
    core, apps, rbac = k8s.CoreV1Api(api), k8s.AppsV1Api(api), k8s.RbacAuthorizationV1Api(api)
    core.create_namespace({"metadata": {"name": NS}})
    core.create_namespaced_service_account(NS, {"metadata": {"name": "default"}})  # no controller-manager here
    apps.create_namespaced_deployment(NS, _deployment(NAME, 2))
    apps.create_namespaced_deployment(NS, _deployment("other", 1))
    for doc in yaml.safe_load_all((ROOT / "deploy" / "forecaster-rbac.yaml").read_text()):
        if doc["kind"] == "ServiceAccount":
            core.create_namespaced_service_account(NS, doc)
        elif doc["kind"] == "Role":
            rbac.create_namespaced_role(NS, doc)
            role_name = doc["metadata"]["name"]
        elif doc["kind"] == "RoleBinding":
            rbac.create_namespaced_role_binding(NS, doc)
    rbac.create_namespaced_role_binding(
        NS,
        {
            "metadata": {"name": "test-limited-user"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role_name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "limited"}],
        },
    )


def limited(kubeconfig: Path, **overrides: object) -> ActuatorSettings:
    base: dict[str, object] = {
        "mode": "kubernetes",
        "namespace": NS,
        "deployment": NAME,
        "kubeconfig": kubeconfig,
        "context": "limited",
        "conflict_backoff_s": 0.0,
    }
    base.update(overrides)
    return ActuatorSettings(**base)  # type: ignore[arg-type]


def _read(kubeconfig: Path) -> k8s.V1Deployment:
    return k8s.AppsV1Api(_admin(kubeconfig)).read_namespaced_deployment(NAME, NS)


def test_limited_role_scales_up_and_annotates(kubeconfig: Path) -> None:
    result = build_actuator(limited(kubeconfig)).apply(Decision(5, "P90 forecast 41 req/s at t+5min"), 2)
    print(result.summary())
    assert (result.action, result.observed, result.annotated) == ("scaled", 2, True)
    deployment = _read(kubeconfig)
    assert deployment.spec.replicas == 5
    assert deployment.metadata.annotations["promptedge.io/desired-replicas"] == "5"
    assert deployment.metadata.annotations["promptedge.io/reason"] == "P90 forecast 41 req/s at t+5min"


def test_no_op_run_leaves_resource_version_unchanged(kubeconfig: Path) -> None:
    actuator = build_actuator(limited(kubeconfig))
    actuator.apply(Decision(4, "set up"), None)
    before = _read(kubeconfig).metadata.resource_version
    result = actuator.apply(Decision(4, "same again"), 4)
    print(result.summary())
    assert result.action == "none"
    assert _read(kubeconfig).metadata.resource_version == before
    assert _read(kubeconfig).metadata.annotations["promptedge.io/reason"] == "set up"


def test_server_rejects_stale_resource_version_on_scale_patch(kubeconfig: Path) -> None:
    api = KubeScaleAPI(_admin(kubeconfig, "limited"), NS, NAME, 10.0)
    stale = api.read_scale()
    api.patch_scale(scale_patch(stale, stale.replicas + 1))
    with pytest.raises(KubeConflict, match="the object has been modified"):
        api.patch_scale(scale_patch(stale, stale.replicas + 2))


def test_conflict_on_patch_rereads_and_succeeds(kubeconfig: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression (issue 5) on the real server: another writer lands between our read and patch."""
    admin_apps = k8s.AppsV1Api(_admin(kubeconfig))
    original = KubeScaleAPI.read_scale
    reads = 0

    def read_then_someone_writes(self: KubeScaleAPI):  # type: ignore[no-untyped-def]
        nonlocal reads
        reads += 1
        observed = original(self)
        if reads == 1:
            admin_apps.patch_namespaced_deployment(
                NAME,
                NS,
                {"metadata": {"labels": {"touched": "yes"}}},
                _content_type="application/merge-patch+json",
            )
        return observed

    monkeypatch.setattr(KubeScaleAPI, "read_scale", read_then_someone_writes)
    result = build_actuator(limited(kubeconfig)).apply(Decision(7, "conflict test"), None)
    print(result.summary())
    assert (result.action, result.attempts) == ("scaled", 2)
    assert _read(kubeconfig).spec.replicas == 7


def test_role_does_not_reach_other_deployments_or_verbs(kubeconfig: Path) -> None:
    with pytest.raises(KubeForbidden) as caught:
        build_actuator(limited(kubeconfig, deployment="other")).apply(Decision(3, "x"), None)
    print(caught.value)
    assert caught.value.verb == "get" and "deployments/scale" in str(caught.value)
    assert 'User "limited" cannot get' in str(caught.value)

    apps = k8s.AppsV1Api(_admin(kubeconfig, "limited"))
    attempts = {
        "get other deployment": lambda: apps.read_namespaced_deployment("other", NS),
        "list deployments": lambda: apps.list_namespaced_deployment(NS),
        "delete deployment": lambda: apps.delete_namespaced_deployment(NAME, NS),
        "update scale": lambda: apps.replace_namespaced_deployment_scale(
            NAME, NS, {"metadata": {"name": NAME, "namespace": NS}, "spec": {"replicas": 1}}
        ),
        "patch other scale": lambda: apps.patch_namespaced_deployment_scale(
            "other", NS, {"spec": {"replicas": 9}}, _content_type="application/merge-patch+json"
        ),
        "create deployment": lambda: apps.create_namespaced_deployment(NS, _deployment("new", 1)),
    }
    for what, call in attempts.items():
        with pytest.raises(ApiException) as denied:
            call()
        assert denied.value.status == 403, what


def test_limited_role_advises_with_the_ready_replicas_and_writes_nothing(kubeconfig: Path) -> None:
    """Advisory mode (the default) under the shipped Role: it may read the Deployment's status."""
    before = _read(kubeconfig)
    result = build_actuator(limited(kubeconfig, mode="advisory")).apply(Decision(9, "advice"), None)
    print(result.summary())
    assert (result.action, result.observed, result.desired) == ("advised", before.spec.replicas, 9)
    assert result.ready == (before.status.ready_replicas or 0) and result.note == ""
    after = _read(kubeconfig)
    assert after.metadata.resource_version == before.metadata.resource_version  # nothing written
    other = build_actuator(limited(kubeconfig, mode="advisory", deployment="other")).apply(Decision(2, "x"), None)
    assert other.ready is None and 'User "limited" cannot get' in other.note


def test_missing_deployment_is_not_found(kubeconfig: Path) -> None:
    admin = limited(kubeconfig, context="local", deployment="ghost")
    with pytest.raises(KubeNotFound, match="llm/ghost"):
        build_actuator(admin).read_current()


def test_warmup_measured_from_pod_ready_times(kubeconfig: Path) -> None:
    core = k8s.CoreV1Api(_admin(kubeconfig))
    for index, seconds in enumerate((150, 210, 95)):
        pod = core.create_namespaced_pod(
            NS,
            {
                "metadata": {"name": f"vllm-{index}", "labels": {"app": NAME}},
                "spec": {
                    "automountServiceAccountToken": False,
                    "containers": [{"name": "vllm", "image": "vllm/vllm-openai"}],
                },
            },
        )
        ready = pod.metadata.creation_timestamp + timedelta(seconds=seconds)
        core.patch_namespaced_pod_status(
            pod.metadata.name,
            NS,
            {
                "status": {
                    "conditions": [
                        {"type": "Ready", "status": "True", "lastTransitionTime": ready.strftime("%Y-%m-%dT%H:%M:%SZ")}
                    ]
                }
            },
            _content_type="application/merge-patch+json",
        )
    warmup = measure_warmup(limited(kubeconfig, warmup_quantile=0.5))
    print(warmup)
    assert (warmup.source, warmup.samples, warmup.seconds) == ("pods", 3, 150)


def _seed_counters(redis_url: str, now: float) -> None:
    """Three hours of router counters (router's Redis layout) rising from 1 to 10 requests/s."""
    client = redis.Redis.from_url(redis_url)
    last = int(now // 60) - 1
    for i, minute in enumerate(range(last - 179, last + 1)):
        per_minute = 60 + 540 * i // 179
        key = f"promptedge:traffic:sim-llama-8b:{minute // 1440}"
        client.hset(key, mapping={f"{minute}:requests": per_minute, f"{minute}:misses": per_minute})
    client.sadd("promptedge:traffic:models", "sim-llama-8b")


def test_run_once_cli_scales_the_real_deployment_then_is_a_no_op(
    kubeconfig: Path, redis_url: str, tmp_path: Path
) -> None:
    """`python -m forecaster run --once` end to end: Redis counters -> plan -> scale, as the limited user."""
    k8s.AppsV1Api(_admin(kubeconfig)).patch_namespaced_deployment_scale(
        NAME, NS, {"spec": {"replicas": 2}}, _content_type="application/merge-patch+json"
    )
    now = 1_795_000_000.0
    _seed_counters(redis_url, now)
    env = {
        **os.environ,
        "PROMPTEDGE_REDIS_URL": redis_url,
        "PROMPTEDGE_ACTUATOR_MODE": "kubernetes",
        "PROMPTEDGE_ACTUATOR_NAMESPACE": NS,
        "PROMPTEDGE_ACTUATOR_DEPLOYMENT": NAME,
        "PROMPTEDGE_ACTUATOR_KUBECONFIG": str(kubeconfig),
        "PROMPTEDGE_ACTUATOR_CONTEXT": "limited",
        "PROMPTEDGE_FORECASTER_CAPACITY_PER_REPLICA": "2",
        "PROMPTEDGE_FORECASTER_TIME_BUDGET_S": "1",
        "PROMPTEDGE_FORECASTER_HISTORY_S": "10800",
    }
    command = [
        sys.executable,
        "-m",
        "forecaster",
        "run",
        "--once",
        "--now",
        str(now),
        "--json",
        str(tmp_path / "plan.json"),
    ]

    first = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    print(first.stdout, first.stderr)
    assert first.returncode == 0, first.stderr
    decided = json.loads((tmp_path / "plan.json").read_text())["decision"]["replicas"]
    assert decided > 2 and "actuation: kubernetes llm/vllm: scaled 2 -> " in first.stdout
    deployment = _read(kubeconfig)
    assert deployment.spec.replicas == decided
    assert deployment.metadata.annotations["promptedge.io/desired-replicas"] == str(decided)

    second = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    print(second.stdout, second.stderr)
    assert second.returncode == 0, second.stderr
    assert f"unchanged at {decided}" in second.stdout
    assert _read(kubeconfig).metadata.resource_version == deployment.metadata.resource_version
