"""Advisory mode end to end with real parts: a real Prometheus (Debian's ``prometheus``) scraping
simulated vLLM replicas (``python -m sim serve``, vLLM's metric names), the real kube-apiserver
holding the vLLM Deployment, real Redis for the record. Nothing is configured for the
forecaster but the Prometheus URL and the Deployment's name (plus the test's own Redis database
and kubeconfig, which a Pod gets from its cluster): the default query finds the demand, the
default mode advises without scaling, and each cycle records Ready replicas and demand.
Bad input -- a Deployment that does not exist, a query that returns nothing -- is recorded as
unknown, never as a number.

Skipped, saying why, where ``prometheus`` or ../shared/tools/kube is missing.
"""

from __future__ import annotations

import math
import os
import shutil
import threading
import time
from pathlib import Path

import httpx
import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from forecaster.actuate import build_actuator, load_actuator_settings
from forecaster.advisory.observe import READY
from forecaster.advisory.record import AdvisoryLog, advisory_key
from forecaster.advisory.report import build_report
from forecaster.live import cycle
from forecaster.settings import ForecasterSettings
from forecaster.sources import open_source
from tests.deploy.test_deploy_dashboard_live import _prometheus
from tests.router.kube_apiserver import running_apiserver
from tests.router.router_process import free_port
from tests.sim.replica_process import start_replica

pytestmark = [
    pytest.mark.kube,
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("prometheus") is None, reason="no prometheus on PATH (Debian: apt-get install prometheus)"
    ),
]

NAME = "vllm"


def _traffic(ports: list[int], stop: threading.Event) -> None:
    """Requests round-robin over the replicas until ``stop``, about 4 a second."""
    with httpx.Client(timeout=30) as client:
        i = 0
        while not stop.is_set():
            port = ports[i % len(ports)]
            client.post(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                json={"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": f"q {i}"}]},
            )
            i += 1
            time.sleep(0.25)


def _deployment(apps: k8s.AppsV1Api, replicas: int, ready: int) -> None:
    """The vLLM Deployment with the status a controller would write (no controller runs here)."""
    labels = {"app": NAME}
    apps.create_namespaced_deployment(
        "default",
        {
            "metadata": {"name": NAME},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]},
                },
            },
        },
    )
    body = apps.read_namespaced_deployment(NAME, "default")
    body.status = k8s.V1DeploymentStatus(replicas=replicas, ready_replicas=ready, available_replicas=ready)
    apps.replace_namespaced_deployment_status(NAME, "default", body)


def test_only_the_prometheus_url_and_the_deployment_name_advise_and_record(
    tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ports = [free_port(), free_port()]
    replicas = [start_replica(p, "--model", "m", "--time-scale", "50") for p in ports]
    prometheus = None
    stop = threading.Event()
    try:
        prometheus, url = _prometheus(tmp_path, {f"vllm-{i}": (p, {"pod": f"vllm-{i}"}) for i, p in enumerate(ports)})
        sender = threading.Thread(target=_traffic, args=(ports, stop), daemon=True)
        sender.start()
        started = time.time()
        run = tmp_path / "kube"
        with running_apiserver(run):
            api = k8s_config.new_client_from_config(str(run / "kubeconfig"), context="local", persist_config=False)
            apps = k8s.AppsV1Api(api)
            _deployment(apps, replicas=3, ready=2)
            for key in [k for k in os.environ if k.startswith(("PROMPTEDGE_FORECASTER_", "PROMPTEDGE_ACTUATOR_"))]:
                monkeypatch.delenv(key)
            monkeypatch.setenv("PROMPTEDGE_FORECASTER_PROMETHEUS_URL", url)
            monkeypatch.setenv("PROMPTEDGE_ACTUATOR_DEPLOYMENT", NAME)
            monkeypatch.setenv("PROMPTEDGE_REDIS_URL", redis_url)  # the test's own database
            # in a Pod the cluster is found in-cluster; here the kubeconfig names it
            monkeypatch.setenv("PROMPTEDGE_ACTUATOR_KUBECONFIG", str(run / "kubeconfig"))
            monkeypatch.setenv("PROMPTEDGE_ACTUATOR_CONTEXT", "local")
            # The last complete minute must have been scraped: wait for a minute boundary at
            # least 15 s after scraping began (several scrapes and requests inside the rate's
            # window on a loaded machine), then plan as of one minute after it.
            boundary = math.ceil((started + 15) / 60) * 60
            time.sleep(max(0.0, boundary + 2 - time.time()))
            settings = ForecasterSettings()
            actuator_settings = load_actuator_settings()
            assert settings.source == "prometheus" and actuator_settings.mode == "advisory"
            outcome = cycle(
                settings, actuator_settings, open_source(settings), build_actuator(actuator_settings), now=boundary + 60
            )
            assert outcome.actuation is not None and outcome.actuation.action == "advised", outcome
            assert (outcome.actuation.observed, outcome.actuation.ready) == (3, 2), outcome.actuation
            assert outcome.result.demand is not None and outcome.result.demand > 0.5, outcome.result.series
            assert READY._value.get() == 2  # type: ignore[attr-defined]
            assert apps.read_namespaced_deployment_scale(NAME, "default").spec.replicas == 3  # never scaled
            record = AdvisoryLog(redis_url, advisory_key(f"default/{NAME}"))
            (seen,), _ = record.read(0, 4e9)
            assert (seen.ready, seen.spec, seen.desired) == (2, 3, outcome.result.decision.replicas)
            assert seen.demand == pytest.approx(outcome.result.demand)

            # The report reads the demand from Prometheus over the window.
            report = build_report(settings, record, f"default/{NAME}", 180, boundary + 120)
            assert report.document["demand_source"].startswith("Prometheus: sum(rate(vllm:request_success_total")
            assert report.document["observations"] == 1

            # A Deployment that does not exist: advising goes on, Ready is recorded as unknown.
            monkeypatch.setenv("PROMPTEDGE_ACTUATOR_DEPLOYMENT", "nope")
            missing = load_actuator_settings()
            outcome = cycle(settings, missing, open_source(settings), build_actuator(missing), now=boundary + 60)
            assert outcome.actuation is not None and outcome.actuation.ready is None, outcome
            assert "not found" in outcome.actuation.note, outcome.actuation
            (seen,), _ = AdvisoryLog(redis_url, advisory_key("default/nope")).read(0, 4e9)
            assert seen.ready is None and seen.spec is None and "not found" in seen.note

            # A query that returns nothing: a hold, and no demand recorded.
            empty = ForecasterSettings(prometheus_query="sum(rate(vllm:no_such_metric_total[1m]))")
            outcome = cycle(
                empty, actuator_settings, open_source(empty), build_actuator(actuator_settings), now=boundary + 120
            )
            assert outcome.result.decision.action == "hold" and outcome.result.demand is None, outcome.result
            observations, _ = record.read(boundary + 90, 4e9)
            assert observations[-1].demand is None and observations[-1].ready == 2, observations
    finally:
        stop.set()
        for proc in [*replicas, prometheus]:
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=10)
