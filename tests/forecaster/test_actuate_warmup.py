"""Warm-up (lead time) from pod creation -> Ready times; the setting when pods cannot tell."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from forecaster.actuate import ActuatorSettings, measure_warmup
from forecaster.actuate.kube import PodTimes
from forecaster.actuate.warmup import warmup_from_pods
from tests.forecaster.fake_kube import FakeCluster, FakeKubeServer

T0 = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)


def times(seconds: float | None, restarts: int = 0) -> PodTimes:
    return PodTimes(T0, None if seconds is None else T0 + timedelta(seconds=seconds), restarts)


def test_nearest_rank_quantile_over_ready_pods_without_restarts() -> None:
    pods = [times(100), times(400), times(200), times(300), times(None), times(900, restarts=2)]
    assert warmup_from_pods(pods, 0.9) == (400, 4)  # the restarted and the unready pod are skipped
    assert warmup_from_pods(pods, 0.5) == (200, 4)
    assert warmup_from_pods([times(None)], 0.9) is None


def pod(name: str, labels: dict[str, str], ready_after_s: float, restarts: int = 0) -> dict[str, Any]:
    stamp = lambda t: t.strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: E731
    return {
        "metadata": {"name": name, "labels": labels, "creationTimestamp": stamp(T0)},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": stamp(T0 + timedelta(seconds=ready_after_s))}
            ],
            "containerStatuses": [
                {"name": "vllm", "image": "vllm/vllm-openai", "imageID": "", "ready": True, "restartCount": restarts}
            ],
        },
    }


@pytest.fixture()
def fake() -> Iterator[FakeKubeServer]:
    cluster = FakeCluster()
    cluster.add_deployment("llm", "vllm", replicas=3)
    cluster.pods["llm"] = [
        pod("vllm-a", {"app": "vllm"}, 240),
        pod("vllm-b", {"app": "vllm"}, 180),
        pod("vllm-c", {"app": "vllm"}, 1200, restarts=1),
        pod("other-a", {"app": "other"}, 5),
    ]
    cluster.tokens["limited-token"] = "limited"
    cluster.grants["limited"] = {("get", "deployments/scale", "vllm")}
    server = FakeKubeServer(cluster).start()
    yield server
    server.stop()


def settings(**overrides: object) -> ActuatorSettings:
    return ActuatorSettings(**{"namespace": "llm", "deployment": "vllm", "warmup_s": 420.0, **overrides})  # type: ignore[arg-type]


def test_measured_from_the_deployments_pods_only(fake: FakeKubeServer) -> None:
    warmup = measure_warmup(settings(), fake.client())
    assert (warmup.source, warmup.seconds, warmup.samples) == ("pods", 240, 2)
    assert "app=vllm" in warmup.note


def test_without_list_permission_falls_back_to_the_setting_and_says_why(
    fake: FakeKubeServer, caplog: pytest.LogCaptureFixture
) -> None:
    warmup = measure_warmup(settings(), fake.client("limited-token"))
    assert (warmup.source, warmup.seconds) == ("setting", 420.0)
    assert 'verbs: ["list"]' in warmup.note and "pods" in warmup.note
    assert "PROMPTEDGE_ACTUATOR_WARMUP_S" in caplog.text


def test_no_deployment_means_the_setting() -> None:
    warmup = measure_warmup(ActuatorSettings(warmup_s=90))
    assert (warmup.source, warmup.seconds, warmup.note) == ("setting", 90, "no deployment configured")


def test_a_pod_marked_as_no_warmup_sample_is_not_measured() -> None:
    # Regression (closed loop, 2 December): the loop's first Pods stand for replicas that were
    # serving before the segment and skip their warm-up; measured, they said the lead time was
    # under a minute, and the forecaster ordered the step's replicas a minute ahead of a
    # 2-minute warm-up. A Pod annotated promptedge.io/warmup-sample: "false" is not a sample.
    warm = PodTimes(T0, T0 + timedelta(seconds=3), 0, sample=False)
    assert warmup_from_pods([warm, warm, times(130)], 0.5) == (130, 1)
    assert warmup_from_pods([warm], 0.9) is None  # then the setting is the lead time
