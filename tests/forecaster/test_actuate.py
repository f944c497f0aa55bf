"""Actuator against the protocol-level fake API server (real HTTP): reconcile, 409, 403, 404, dry-run."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from forecaster.actuate import (
    ActuationConfigError,
    ActuatorSettings,
    InvalidDecision,
    KubeConflict,
    KubeForbidden,
    KubeNotFound,
    KubeUnavailable,
    build_actuator,
    load_actuator_settings,
)
from forecaster.actuate.kube import KubeScaleAPI
from tests.forecaster.fake_kube import FakeCluster, FakeKubeServer

NS, NAME = "llm", "vllm"


@dataclass(frozen=True)
class Decision:
    replicas: int
    reason: str


@pytest.fixture()
def fake() -> Iterator[FakeKubeServer]:
    cluster = FakeCluster()
    cluster.add_deployment(NS, NAME, replicas=2)
    cluster.tokens["limited-token"] = "limited"
    server = FakeKubeServer(cluster).start()
    yield server
    server.stop()


def settings(**overrides: object) -> ActuatorSettings:
    base: dict[str, object] = {
        "mode": "kubernetes",
        "namespace": NS,
        "deployment": NAME,
        "conflict_backoff_s": 0.0,
        "request_timeout_s": 5.0,
    }
    base.update(overrides)
    return ActuatorSettings(**base)  # type: ignore[arg-type]


def test_scale_up_patches_scale_with_resource_version_and_annotates(fake: FakeKubeServer) -> None:
    version_before = fake.cluster.deployments[(NS, NAME)].resource_version
    result = build_actuator(settings(), api_client=fake.client()).apply(Decision(5, "peak at 14:05 needs 5"), 2)

    assert (result.action, result.observed, result.desired, result.attempts) == ("scaled", 2, 5, 1)
    assert result.annotated
    deployment = fake.cluster.deployments[(NS, NAME)]
    assert deployment.replicas == 5
    (_, scale_path, scale_body), (_, meta_path, meta_body) = fake.cluster.writes
    assert scale_path.endswith(f"/deployments/{NAME}/scale")
    assert scale_body == {"metadata": {"resourceVersion": str(version_before)}, "spec": {"replicas": 5}}
    assert meta_path.endswith(f"/deployments/{NAME}")
    assert deployment.annotations["promptedge.io/desired-replicas"] == "5"
    assert deployment.annotations["promptedge.io/reason"] == "peak at 14:05 needs 5"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", deployment.annotations["promptedge.io/decided-at"])
    assert "scaled 2 -> 5" in result.summary()


def test_no_op_run_writes_nothing(fake: FakeKubeServer) -> None:
    result = build_actuator(settings(), api_client=fake.client()).apply(Decision(2, "steady"), 2)

    assert result.action == "none"
    assert not result.annotated
    assert fake.cluster.writes == []
    assert fake.cluster.deployments[(NS, NAME)].annotations == {}


def test_conflict_on_scale_patch_rereads_and_succeeds(fake: FakeKubeServer) -> None:
    """Regression (issue 5): a 409 on patch re-reads the scale and retries with the new version."""
    fake.cluster.interference = [fake.cluster.concurrent_write()]
    result = build_actuator(settings(), api_client=fake.client()).apply(Decision(4, "rise"), 2)

    assert (result.action, result.attempts) == ("scaled", 2)
    assert fake.cluster.deployments[(NS, NAME)].replicas == 4
    scale_writes = [w for w in fake.cluster.writes if w[1].endswith("/scale")]
    assert len(scale_writes) == 1  # the rejected patch was not applied


def test_conflict_where_other_writer_already_set_desired_writes_nothing_more(fake: FakeKubeServer) -> None:
    fake.cluster.interference = [fake.cluster.concurrent_write(replicas=4)]
    result = build_actuator(settings(), api_client=fake.client()).apply(Decision(4, "rise"), 2)

    assert result.action == "none"
    assert fake.cluster.writes == []


def test_conflicts_are_bounded(fake: FakeKubeServer) -> None:
    fake.cluster.interference = [fake.cluster.concurrent_write() for _ in range(10)]
    with pytest.raises(KubeConflict, match="deployments/scale.apps llm/vllm"):
        build_actuator(settings(conflict_attempts=3), api_client=fake.client()).apply(Decision(6, "x"), 2)
    assert fake.cluster.deployments[(NS, NAME)].replicas == 2
    assert len(fake.cluster.interference) == 7  # exactly three patch attempts


def test_annotation_conflict_retries_when_scale_still_ours(fake: FakeKubeServer) -> None:
    fake.cluster.interference = [None, fake.cluster.concurrent_write()]
    result = build_actuator(settings(), api_client=fake.client()).apply(Decision(3, "a"), 2)
    assert result.annotated
    assert fake.cluster.deployments[(NS, NAME)].annotations["promptedge.io/desired-replicas"] == "3"


def test_annotation_skipped_when_another_writer_changed_scale(fake: FakeKubeServer) -> None:
    fake.cluster.interference = [None, fake.cluster.concurrent_write(replicas=7)]
    result = build_actuator(settings(), api_client=fake.client()).apply(Decision(3, "a"), 2)
    assert result.action == "scaled" and not result.annotated
    deployment = fake.cluster.deployments[(NS, NAME)]
    assert deployment.replicas == 7 and deployment.annotations == {}


def test_annotate_off_writes_only_the_scale(fake: FakeKubeServer) -> None:
    build_actuator(settings(annotate=False), api_client=fake.client()).apply(Decision(3, "a"), 2)
    assert [w[1].rsplit("/", 1)[-1] for w in fake.cluster.writes] == ["scale"]


def test_forbidden_read_names_resource_and_verb(fake: FakeKubeServer) -> None:
    actuator = build_actuator(settings(), api_client=fake.client("limited-token"))
    with pytest.raises(KubeForbidden) as caught:
        actuator.apply(Decision(3, "a"), 2)
    message = str(caught.value)
    assert caught.value.verb == "get"
    assert 'resources: ["deployments/scale"] verbs: ["get"]' in message
    assert 'resourceNames: ["vllm"]' in message and "llm/vllm" in message
    assert 'User "limited" cannot get' in message


def test_forbidden_patch_names_patch_verb(fake: FakeKubeServer) -> None:
    fake.cluster.grants["limited"] = {("get", "deployments/scale", NAME)}
    with pytest.raises(KubeForbidden) as caught:
        build_actuator(settings(), api_client=fake.client("limited-token")).apply(Decision(3, "a"), 2)
    assert (caught.value.verb, caught.value.resource.rbac_resource) == ("patch", "deployments/scale")
    assert fake.cluster.writes == []


def test_forbidden_annotation_after_scale_names_deployments_patch(fake: FakeKubeServer) -> None:
    fake.cluster.grants["limited"] = {("get", "deployments/scale", NAME), ("patch", "deployments/scale", NAME)}
    with pytest.raises(KubeForbidden) as caught:
        build_actuator(settings(), api_client=fake.client("limited-token")).apply(Decision(3, "a"), 2)
    assert (caught.value.verb, caught.value.resource.rbac_resource) == ("patch", "deployments")
    assert fake.cluster.deployments[(NS, NAME)].replicas == 3  # the scale write itself stands


def test_missing_deployment_is_not_found_naming_it(fake: FakeKubeServer) -> None:
    actuator = build_actuator(settings(deployment="nope"), api_client=fake.client())
    with pytest.raises(KubeNotFound, match=r"deployments/scale\.apps llm/nope.*PROMPTEDGE_ACTUATOR_DEPLOYMENT"):
        actuator.read_current()


def test_unreachable_api_server_is_unavailable() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    from kubernetes import client as k8s

    configuration = k8s.Configuration(host=f"http://127.0.0.1:{port}")
    configuration.retries = 0
    with pytest.raises(KubeUnavailable, match="unreachable"):
        build_actuator(settings(), api_client=k8s.ApiClient(configuration)).read_current()


def test_read_current_returns_spec_replicas(fake: FakeKubeServer) -> None:
    assert build_actuator(settings(), api_client=fake.client()).read_current() == 2


def test_dry_run_reads_cluster_and_writes_nothing(fake: FakeKubeServer) -> None:
    result = build_actuator(settings(mode="dry-run"), api_client=fake.client()).apply(Decision(5, "x"), None)
    assert (result.action, result.observed) == ("would-scale", 2)
    assert fake.cluster.writes == []


def test_dry_run_without_deployment_needs_no_cluster() -> None:
    actuator = build_actuator(ActuatorSettings(mode="dry-run"))
    assert actuator.read_current() is None
    assert actuator.apply(Decision(3, "x"), 3).action == "none"
    assert actuator.apply(Decision(4, "x"), 3).action == "would-scale"


def test_negative_decision_is_refused(fake: FakeKubeServer) -> None:
    with pytest.raises(InvalidDecision):
        build_actuator(settings(), api_client=fake.client()).apply(Decision(-1, "bug"), 2)
    assert fake.cluster.writes == []


def test_kubernetes_mode_without_deployment_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMPTEDGE_ACTUATOR_MODE", "kubernetes")
    monkeypatch.delenv("PROMPTEDGE_ACTUATOR_DEPLOYMENT", raising=False)
    with pytest.raises(ActuationConfigError, match="PROMPTEDGE_ACTUATOR_DEPLOYMENT is required"):
        load_actuator_settings()
    monkeypatch.setenv("PROMPTEDGE_ACTUATOR_MODE", "scale-it")
    with pytest.raises(ActuationConfigError, match="PROMPTEDGE_ACTUATOR_MODE"):
        load_actuator_settings()


def test_missing_kubeconfig_is_a_config_error(tmp_path: object) -> None:
    actuator = build_actuator(settings(kubeconfig=f"{tmp_path}/absent"))
    with pytest.raises(ActuationConfigError, match="absent"):
        actuator.read_current()


def test_scale_api_reports_pod_selector(fake: FakeKubeServer) -> None:
    api = KubeScaleAPI(fake.client(), NS, NAME, 5.0)
    assert api.read_scale().selector == "app=vllm"


def test_redis_url_from_shared_variable_or_keyword(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMPTEDGE_REDIS_URL", "redis://shared:6379/1")
    assert ActuatorSettings().redis_url == "redis://shared:6379/1"
    assert ActuatorSettings(redis_url="redis://kw:6379/2").redis_url == "redis://kw:6379/2"


@dataclass(frozen=True)
class PlannerDecision:
    """Shape of forecaster.plan.Decision as far as the actuator looks."""

    replicas: int
    reason: str
    action: str


def test_hold_never_scales_down_but_a_real_decision_does(fake: FakeKubeServer) -> None:
    fake.cluster.deployments[(NS, NAME)].replicas = 5
    actuator = build_actuator(settings(), api_client=fake.client())

    held = actuator.apply(PlannerDecision(3, "hold: source unavailable; keeping last decision 3", "hold"), 5)
    assert (held.action, held.desired) == ("none", 5)
    assert fake.cluster.writes == []

    assert actuator.apply(PlannerDecision(6, "hold: but more is fine", "hold"), 5).action == "scaled"
    assert actuator.apply(PlannerDecision(3, "forecast falls", "down"), 6).action == "scaled"
    assert fake.cluster.deployments[(NS, NAME)].replicas == 3


def test_in_cluster_without_service_account_token_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    with pytest.raises(ActuationConfigError, match="in-cluster"):
        build_actuator(settings()).read_current()


def test_a_silent_api_server_costs_one_timeout_per_call_not_four(tmp_path) -> None:
    # Attack round: REQUEST_TIMEOUT_S is documented as the bound on every API call, but urllib3's
    # default retries connected again three times, so a read took 4 x 10 s and the daemon could
    # not stop meanwhile. Counted here as connections the silent server accepts.
    import json
    import threading

    from forecaster.actuate.kube import new_api_client
    from forecaster.actuate.settings import ActuatorSettings

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(listener.accept()[0])  # and never answer
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "x",
                "clusters": [
                    {
                        "name": "x",
                        "cluster": {
                            "server": f"https://127.0.0.1:{listener.getsockname()[1]}",
                            "insecure-skip-tls-verify": True,
                        },
                    }
                ],
                "users": [{"name": "x", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}],
            }
        )
    )
    settings = ActuatorSettings(mode="kubernetes", namespace="llm", deployment="vllm", kubeconfig=kubeconfig)
    try:
        with pytest.raises(KubeUnavailable):
            KubeScaleAPI(new_api_client(settings), "llm", "vllm", 0.3).read_scale()
        assert len(accepted) == 1
    finally:
        listener.close()
        for conn in accepted:
            conn.close()
