"""KEDA/HPA mode: the decision goes to Redis and the endpoint serves it over real HTTP."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import redis
import uvicorn
import yaml
from prometheus_client.parser import text_string_to_metric_families

from forecaster.actuate import ActuatorSettings, DesiredStore, PublishUnavailable, build_actuator, create_app

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Decision:
    replicas: int
    reason: str


@pytest.fixture()
def keda_settings(redis_url: str) -> ActuatorSettings:
    return ActuatorSettings(mode="keda", namespace="llm", deployment="vllm", redis_url=redis_url, stale_after_s=60)


@contextmanager
def serve(settings: ActuatorSettings) -> Iterator[str]:
    """create_app served by uvicorn on an ephemeral port; yields its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(settings), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(timeout=10)
    sock.close()


@pytest.fixture()
def endpoint(keda_settings: ActuatorSettings) -> Iterator[str]:
    with serve(keda_settings) as url:
        yield url


def gjson_simple(document: dict[str, object], path: str) -> object:
    """Enough of KEDA's GJSON valueLocation for dotted object paths."""
    value: object = document
    for part in path.split("."):
        assert isinstance(value, dict)
        value = value[part]
    return value


def test_endpoint_is_503_until_something_is_published(endpoint: str) -> None:
    response = httpx.get(f"{endpoint}/desired")
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "not_published"
    metrics = httpx.get(f"{endpoint}/metrics").text
    assert "promptedge_desired_replicas" not in metrics  # absent, not 0: an HPA then holds


def test_keda_mode_publishes_and_keda_reads_value_location(endpoint: str, keda_settings: ActuatorSettings) -> None:
    actuator = build_actuator(keda_settings)
    result = actuator.apply(Decision(6, "forecast P90 needs 6 at t+5min"), 4)
    assert (result.action, result.observed) == ("published", 4)

    body = httpx.get(f"{endpoint}/desired").json()
    assert body["reason"] == "forecast P90 needs 6 at t+5min"
    assert body["stale"] is False and body["target"] == "llm/vllm"
    scaled = [
        d
        for d in yaml.safe_load_all((ROOT / "deploy/keda-scaledobject.yaml").read_text())
        if d["kind"] == "ScaledObject"
    ][0]
    (trigger,) = [t for t in scaled["spec"]["triggers"] if t["type"] == "metrics-api"]
    assert gjson_simple(body, trigger["metadata"]["valueLocation"]) == 6

    families = {f.name: f for f in text_string_to_metric_families(httpx.get(f"{endpoint}/metrics").text)}
    (sample,) = families["promptedge_desired_replicas"].samples
    assert sample.value == 6 and sample.labels == {"namespace": "llm", "deployment": "vllm"}


def test_quiet_forecaster_is_held_and_flagged_stale(endpoint: str, keda_settings: ActuatorSettings) -> None:
    store = DesiredStore.from_settings(keda_settings)
    store.publish(3, "old", datetime.now(UTC) - timedelta(hours=2))
    body = httpx.get(f"{endpoint}/desired").json()
    assert body["desiredReplicas"] == 3  # held, never dropped to a minimum
    assert body["stale"] is True and body["ageSeconds"] >= 7200


def test_store_unreachable_is_503_on_endpoint_and_typed_error_on_publish() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings = ActuatorSettings(
        mode="keda", deployment="vllm", redis_url=f"redis://127.0.0.1:{port}/0", request_timeout_s=1
    )
    with pytest.raises(PublishUnavailable, match="promptedge:forecaster:desired:default:vllm"):
        build_actuator(settings).apply(Decision(2, "x"), None)
    with serve(settings) as url:
        response = httpx.get(f"{url}/desired")
    assert response.status_code == 503 and response.json()["error"]["code"] == "store_unavailable"


def test_publish_writes_the_documented_key(redis_url: str, keda_settings: ActuatorSettings) -> None:
    build_actuator(keda_settings).apply(Decision(2, "r"), None)
    fields = redis.Redis.from_url(redis_url).hgetall("promptedge:forecaster:desired:llm:vllm")
    assert fields[b"replicas"] == b"2" and fields[b"reason"] == b"r"


@dataclass(frozen=True)
class PlannerDecision:
    replicas: int
    reason: str
    action: str


def test_hold_publishes_no_less_than_what_runs(redis_url: str, keda_settings: ActuatorSettings) -> None:
    result = build_actuator(keda_settings).apply(PlannerDecision(2, "hold: no data", "hold"), 5)
    assert result.desired == 5
    assert DesiredStore.from_settings(keda_settings).read().replicas == 5  # type: ignore[union-attr]
