"""The real router (``python -m router serve``) with Kubernetes discovery on the REAL 1.20
control plane (kube-apiserver, controller manager, scheduler from ../shared/tools/kube): a
Service and Deployments whose Pods the project's stand-in node (``python -m sim node``) runs as
real sim replicas on the Pods' loopback addresses, Ready only once their ``/health`` answers,
with the kubelet's ``preStop``, SIGTERM and grace period on deletion.
The EndpointSlice controller publishes them (``discovery.k8s.io/v1beta1``: 1.20 serves no v1),
the router finds them by API discovery and sends them traffic.

Shown here: new Ready Pods get traffic; a Pod that runs but is not Ready gets none; scaling
down under a steady request stream fails no request (the Pods' ``preStop`` sleep keeps each
replica serving until the router has dropped it); without the sleep, a client that keeps
sending for the measured worst-case delay gets refused while with it it does not; a restarted
router rediscovers the Pods. The Service and the Deployments are deploy/vllm-pool.yaml's. The order of
events on scale-down is measured (the node's times from its log) and written to
``scale_down_events.json`` in the test's directory (see router/README.md, Discovery).
"""

from __future__ import annotations

import copy
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from sim.node.pod.spec import WARMUP_ANNOTATION, replica_spec
from tests.router.kube_apiserver import running_apiserver

pytestmark = [pytest.mark.kube, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
NS = "llm"
# The Pods' preStop sleep: 5 s (deploy/vllm-pool.yaml has 10: the shorter one keeps the tests
# short and still covers the measured lag, see the README); PROMPTEDGE_TEST_PRE_STOP_S=N
# replaces it, =0 runs the same tests without it.
PRE_STOP_S = os.environ.get("PROMPTEDGE_TEST_PRE_STOP_S", "5")
# The worst delay measured on 1.20 from the node seeing a deletion to the endpoint leaving the
# slice (router/README.md, Discovery): a router may send that long after.
ROUTER_LAG_S = 1.04


def wait_for(condition: Callable[[], Any], timeout_s: float, what: str, every_s: float = 0.1) -> Any:
    """Poll ``condition`` until it returns something true; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(every_s)


def manifests() -> dict[str, dict[str, Any]]:
    """deploy/vllm-pool.yaml (the Service and the Deployment a user applies) by kind."""
    return {doc["kind"]: doc for doc in yaml.safe_load_all((ROOT / "deploy" / "vllm-pool.yaml").read_text()) if doc}


def _served_model() -> str:
    """The name clients send: what vLLM (and so `sim node`) reads from the manifest's container."""
    template = manifests()["Deployment"]["spec"]["template"]
    return replica_spec({"metadata": template["metadata"], "spec": template["spec"]}, "a100", "0").served_model_name


MODEL = _served_model()


def deployment(
    name: str, tier: str, replicas: int, warmup_s: float, pre_stop_s: str | None = PRE_STOP_S, app: str | None = None
) -> dict[str, Any]:
    """deploy/vllm-pool.yaml's Deployment as ``name`` with a ``tier`` label (two Deployments behind the
    one Service), ``replicas``, the sim replica's warm-up (annotation read by `sim node`), and
    ``pre_stop_s``'s preStop sleep when given (default PROMPTEDGE_TEST_PRE_STOP_S; None keeps the
    file's). ``app`` replaces the ``app`` label (a Deployment the Service does not select)."""
    spec = copy.deepcopy(manifests()["Deployment"])
    spec["metadata"]["name"] = name
    spec["spec"]["replicas"] = replicas
    labels = {**spec["spec"]["selector"]["matchLabels"], "tier": tier, **({"app": app} if app else {})}
    spec["spec"]["selector"]["matchLabels"] = spec["spec"]["template"]["metadata"]["labels"] = labels
    spec["spec"]["template"]["metadata"]["annotations"] = {WARMUP_ANNOTATION: str(warmup_s)}
    container = spec["spec"]["template"]["spec"]["containers"][0]
    container["readinessProbe"]["periodSeconds"] = 1  # the file's 5 s: slower to see, same semantics
    if pre_stop_s is not None:
        container["lifecycle"]["preStop"]["exec"]["command"] = ["sleep", pre_stop_s]
    return spec


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def terminate(process: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM ``process`` if it runs; SIGKILL if it has not exited within 20 s."""
    if process is not None and process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


_POD_MESSAGE = re.compile(r"^pod [^/]+/(\S+): (.*)$")
NODE_EVENTS = {"deletion seen": "deletion_seen", "SIGTERM to replica": "sigterm", "exited with code": "exited"}


class SimNodeProcess:
    """``python -m sim node`` playing Node ``name``, as the product's closed loop runs it (time
    scale 1, Pods on ``127.<net>.<n>.*``); it lists Pods every 50 ms. ``events()``: when the node
    saw each Pod's deletion, sent SIGTERM and saw its replica exit, from its log (wall clock,
    ``time.time()``, millisecond precision)."""

    def __init__(self, kubeconfig: Path, name: str, run_dir: Path) -> None:
        self.log = run_dir / "sim-node.log"
        self.cmd = [
            sys.executable,
            "-m",
            "sim",
            "node",
            "--kubeconfig",
            str(kubeconfig),
            "--context",
            "local",
            "--name",
            name,
            "--ip-base",
            f"127.{random.randint(100, 250)}.{random.randint(1, 250)}",
            "--log-dir",
            str(run_dir / "pods"),
        ]
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("PROMPTEDGE_SIM_")},
            "PROMPTEDGE_SIM_NODE_SYNC_INTERVAL_S": "0.05",
        }
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> SimNodeProcess:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.cmd, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        return self

    def stop(self) -> None:
        """SIGTERM (the node stops its replicas), SIGKILL if it has not exited in 20 s."""
        terminate(self.process)

    def events(self) -> dict[str, dict[str, float]]:
        """event ("deletion_seen", "sigterm", "exited") -> Pod name -> wall time (first seen)."""
        found: dict[str, dict[str, float]] = {e: {} for e in NODE_EVENTS.values()}
        for record in self._records():
            m = _POD_MESSAGE.match(str(record.get("message", "")))
            if record.get("logger") != "sim.node" or not m:
                continue
            for needle, event in NODE_EVENTS.items():
                if needle in m.group(2):
                    found[event].setdefault(m.group(1), datetime.fromisoformat(record["timestamp"]).timestamp())
        return found

    def _records(self) -> list[dict[str, Any]]:
        """The node's log lines, one JSON object each (opskit's format); other lines skipped."""
        records = []
        for line in self.log.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
        return records

    def problems(self) -> list[str]:
        """Tracebacks and warnings in the node's log (none expected in these tests)."""
        return [
            ln
            for ln in self.log.read_text(errors="replace").splitlines()
            if "Traceback" in ln or '"level": "WARNING"' in ln or '"level": "ERROR"' in ln
        ]


class RouterProcess:
    """``python -m router serve`` with Kubernetes discovery, as a user starts it."""

    def __init__(self, kubeconfig: Path, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("PROMPTEDGE_ROUTER_")}
        self.env.update(
            {
                "PROMPTEDGE_REDIS_URL": os.environ.get("PROMPTEDGE_TEST_REDIS_URL", "redis://127.0.0.1:6379/15"),
                "PROMPTEDGE_ROUTER_DISCOVERY": "kubernetes",
                "PROMPTEDGE_ROUTER_K8S_KUBECONFIG": str(kubeconfig),
                "PROMPTEDGE_ROUTER_K8S_CONTEXT": "local",
                "PROMPTEDGE_ROUTER_K8S_NAMESPACE": NS,
                "PROMPTEDGE_ROUTER_K8S_LABEL_SELECTOR": "kubernetes.io/service-name=vllm",
                "PROMPTEDGE_ROUTER_K8S_PORT_NAME": "http",
                "PROMPTEDGE_ROUTER_K8S_MODEL": MODEL,
                "PROMPTEDGE_ROUTER_HEALTH_INTERVAL_S": "0.2",
            }
        )
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> RouterProcess:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "router", "serve", "--port", str(self.port)],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        wait_for(self._up, 60, f"router on {self.url} (log {self.log})", every_s=0.2)
        return self

    def _up(self) -> bool:
        assert self.process is not None and self.process.poll() is None, self.log.read_text()[-3000:]
        try:
            return httpx.get(f"{self.url}/v1/models", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        terminate(self.process)

    def ready(self) -> int:
        models = httpx.get(f"{self.url}/v1/models", timeout=5).json()["data"]
        return sum(m["ready"] for m in models if m["id"] == MODEL)


@dataclass
class World:
    core: k8s.CoreV1Api
    apps: k8s.AppsV1Api
    node: SimNodeProcess
    router: RouterProcess
    run_dir: Path

    def scale(self, name: str, replicas: int) -> None:
        self.apps.patch_namespaced_deployment_scale(name, NS, {"spec": {"replicas": replicas}})

    def pods_left(self, tier: str) -> int:
        """The tier's Pods in the API, those being deleted included (gone once the node stopped them)."""
        return len(self.core.list_namespaced_pod(NS, label_selector=f"app=vllm,tier={tier}").items)

    def pod_ips(self, tier: str) -> dict[str, str]:
        """Pod name -> podIP of the tier's Pods that are not being deleted."""
        pods = self.core.list_namespaced_pod(NS, label_selector=f"app=vllm,tier={tier}").items
        return {
            p.metadata.name: p.status.pod_ip for p in pods if p.metadata.deletion_timestamp is None and p.status.pod_ip
        }

    def slice_endpoints(self) -> dict[str, bool]:
        """podIP -> ready, from the Service's EndpointSlices (v1beta1, raw: the typed client reads v1 only)."""
        raw = self.core.api_client.call_api(
            *self.core.api_client.param_serialize(
                "GET",
                f"/apis/discovery.k8s.io/v1beta1/namespaces/{NS}/endpointslices",
                query_params=[("labelSelector", "kubernetes.io/service-name=vllm")],
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
            )
        )
        raw.read()
        assert raw.status == 200, raw.data[:500]
        found: dict[str, bool] = {}
        for item in json.loads(raw.data)["items"]:
            for ep in item.get("endpoints") or []:
                found[ep["addresses"][0]] = (ep.get("conditions") or {}).get("ready") is not False
        return found


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    run_dir = tmp_path_factory.mktemp("kube-cluster")
    with running_apiserver(run_dir, control_plane=True):
        api_client = k8s_config.new_client_from_config(
            str(run_dir / "kubeconfig"), context="local", persist_config=False
        )
        core, apps = k8s.CoreV1Api(api_client), k8s.AppsV1Api(api_client)
        core.create_namespace({"metadata": {"name": NS}})
        node = SimNodeProcess(run_dir / "kubeconfig", "node-a", run_dir).start()
        try:
            core.create_namespaced_service(NS, manifests()["Service"])
            apps.create_namespaced_deployment(NS, deployment("vllm", "warm", 2, warmup_s=1))
            apps.create_namespaced_deployment(NS, deployment("vllm-cold", "cold", 1, warmup_s=3600))
            router = RouterProcess(run_dir / "kubeconfig", run_dir / "router.log").start()
            try:
                yield World(core, apps, node, router, run_dir)
            finally:
                router.stop()
        finally:
            alive = node.process is not None and node.process.poll() is None
            node.stop()
            assert alive, node.log.read_text()[-3000:]
            assert not node.problems(), node.problems()


@dataclass
class Traffic:
    """A steady stream of distinct chat requests (never cache hits) through the router from
    ``workers`` threads, until stopped or ``max_s`` passed (bounded). Each outcome: (start,
    end, status or the exception's name, the replica the router named)."""

    url: str
    workers: int = 4
    max_s: float = 120.0
    outcomes: list[tuple[float, float, int | str, str | None]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _pool: ThreadPoolExecutor | None = None

    def __enter__(self) -> Traffic:
        self._pool = ThreadPoolExecutor(self.workers)
        for worker in range(self.workers):
            self._pool.submit(self._run, worker)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._pool is not None
        self._pool.shutdown(wait=True)

    def _run(self, worker: int) -> None:
        deadline = time.monotonic() + self.max_s
        with httpx.Client(timeout=30) as client:
            n = 0
            while not self._stop.is_set() and time.monotonic() < deadline:
                n += 1
                body = {
                    "model": MODEL,
                    "max_tokens": 8,
                    "messages": [{"role": "user", "content": f"worker {worker} question {n} {random.random()}"}],
                }
                start = time.time()  # wall clock: compared with the node's log times
                try:
                    answer = client.post(f"{self.url}/v1/chat/completions", json=body)
                    outcome: int | str = answer.status_code
                    replica = answer.headers.get("x-promptedge-replica")
                except httpx.HTTPError as exc:
                    outcome, replica = type(exc).__name__, None
                self.outcomes.append((start, time.time(), outcome, replica))

    def failed(self) -> list[tuple[float, float, int | str, str | None]]:
        return [o for o in self.outcomes if o[2] != 200]

    def hosts(self, since: float = 0.0) -> set[str]:
        return {httpx.URL(o[3]).host for o in self.outcomes if o[3] and o[0] >= since}


def _settle(world: World, warm: int) -> dict[str, str]:
    """Scale the warm Deployment to ``warm`` and wait until the router admits exactly those."""
    world.scale("vllm", warm)
    wait_for(
        lambda: len(world.pod_ips("warm")) == warm and world.pods_left("warm") == warm,
        120,
        f"{warm} warm Pods running, no other left",
    )
    wait_for(lambda: world.router.ready() == warm, 60, f"router admits {warm} replicas")
    return world.pod_ips("warm")


def test_new_ready_pods_get_traffic_and_a_running_unready_pod_gets_none(world: World) -> None:
    warm = _settle(world, 2)
    (cold_ip,) = wait_for(lambda: world.pod_ips("cold"), 60, "the cold Pod running").values()
    assert world.slice_endpoints()[cold_ip] is False  # published, not ready
    with Traffic(world.router.url) as traffic:
        wait_for(lambda: len(traffic.outcomes) >= 20, 60, "20 answers")
        grown = time.time()
        world.scale("vllm", 3)
        new = wait_for(lambda: set(world.pod_ips("warm")) - set(warm), 60, "a third warm Pod")
        (new_ip,) = [world.pod_ips("warm")[n] for n in new]
        wait_for(lambda: new_ip in traffic.hosts(grown), 60, "traffic to the new Pod")
    assert traffic.failed() == []
    assert traffic.hosts() == set(world.pod_ips("warm").values())  # every warm Pod served
    assert cold_ip not in traffic.hosts()
    assert world.pod_ips("cold") and world.router.ready() == 3


def test_scale_down_under_load_fails_no_request(world: World) -> None:
    before = _settle(world, 3)
    slice_seen: dict[str, float] = {}

    def watch_slices(stop: threading.Event) -> None:  # when each IP leaves the slice or turns not ready
        while not stop.wait(0.02):
            endpoints = world.slice_endpoints()
            for ip in before.values():
                if ip not in slice_seen and not endpoints.get(ip, False):
                    slice_seen[ip] = time.time()

    stop = threading.Event()
    watcher = threading.Thread(target=watch_slices, args=(stop,), daemon=True)
    watcher.start()
    with Traffic(world.router.url) as traffic:
        wait_for(lambda: len(traffic.outcomes) >= 20, 60, "20 answers")
        scaled = time.time()
        world.scale("vllm", 1)
        wait_for(lambda: len(world.pod_ips("warm")) == 1, 60, "two warm Pods deleted")
        gone = [n for n in before if n not in world.pod_ips("warm")]
        wait_for(lambda: world.pods_left("warm") == 1, 60, "their replicas stopped and the Pods gone")
        end = time.time()
        wait_for(lambda: len([o for o in traffic.outcomes if o[0] > end]) >= 20, 60, "20 answers after")
    stop.set()
    watcher.join(timeout=5)
    node = world.node.events()
    events = []
    for name in gone:
        ip = before[name]
        last = max((o[0] for o in traffic.outcomes if o[3] and httpx.URL(o[3]).host == ip), default=None)
        deleted = node["deletion_seen"][name]
        events.append(
            {
                "pod": name,
                "scale_to_node_sees_deletion_s": deleted - scaled,
                "deletion_to_endpoint_out_of_slice_s": slice_seen.get(ip, float("nan")) - deleted,
                "deletion_to_last_request_sent_s": None if last is None else last - deleted,
                "deletion_to_sigterm_s": node["sigterm"][name] - deleted,
                "sigterm_to_exit_s": node["exited"][name] - node["sigterm"][name],
            }
        )
    (world.run_dir / "scale_down_events.json").write_text(json.dumps(events, indent=2))
    print(json.dumps(events, indent=2))
    assert traffic.failed() == [], traffic.failed()
    assert len(traffic.outcomes) >= 40
    for event, name in zip(events, gone, strict=True):
        # the router stopped sending to the replica before it got SIGTERM
        assert (
            event["deletion_to_last_request_sent_s"] is None
            or event["deletion_to_last_request_sent_s"] < event["deletion_to_sigterm_s"]
        ), event
        assert before[name] in slice_seen
    assert traffic.hosts(end) == set(world.pod_ips("warm").values())


@pytest.mark.parametrize("pre_stop_s", [None, "0"], ids=["deploy-pre-stop", "no-pre-stop"])
def test_a_client_lagging_by_the_measured_delay_is_served_only_with_the_pre_stop_sleep(
    world: World, pre_stop_s: str | None
) -> None:
    """The race made visible without waiting for its slow case: a client that keeps sending to a
    deleted Pod for ROUTER_LAG_S after the node saw the deletion, as a router may (measured).
    With deploy/vllm-pool.yaml's preStop sleep every request is answered; without it the replica got
    SIGTERM at once and refuses them (503 or connection refused: a router retries those
    elsewhere, a plain client fails). The Pod is not behind the Service (no router involved)."""
    name = f"lag-{'file' if pre_stop_s is None else pre_stop_s}"
    world.apps.create_namespaced_deployment(NS, deployment(name, "lag", 1, warmup_s=0, pre_stop_s=pre_stop_s, app=name))

    def ready_pod() -> tuple[str, str] | None:
        for p in world.core.list_namespaced_pod(NS, label_selector=f"app={name}").items:
            if p.status.pod_ip and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or []):
                return p.metadata.name, p.status.pod_ip
        return None

    pod, ip = wait_for(ready_pod, 60, f"the {name} Pod Ready")
    outcomes: list[tuple[float, int | str]] = []
    stop = threading.Event()

    def client() -> None:
        with httpx.Client(timeout=10) as http:
            n = 0
            while not stop.is_set():
                n += 1
                start = time.time()
                try:
                    status: int | str = http.post(
                        f"http://{ip}:8000/v1/chat/completions",
                        json={
                            "model": MODEL,
                            "max_tokens": 4,
                            "messages": [{"role": "user", "content": f"lagging {n}"}],
                        },
                    ).status_code
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                outcomes.append((start, status))
                stop.wait(0.02)

    sender = threading.Thread(target=client, daemon=True)
    sender.start()
    try:
        wait_for(lambda: len(outcomes) >= 5, 30, "5 answers before the deletion")
        world.core.delete_namespaced_pod(pod, NS)
        seen = wait_for(lambda: world.node.events()["deletion_seen"].get(pod), 30, "the node sees the deletion")
        wait_for(lambda: time.time() > seen + ROUTER_LAG_S, ROUTER_LAG_S + 30, "the measured lag")
    finally:
        stop.set()
        sender.join(timeout=15)
    wait_for(lambda: world.node.events()["exited"].get(pod), 90, "the replica stopped")
    world.apps.delete_namespaced_deployment(name, NS)
    events = world.node.events()
    lagging = [status for start, status in outcomes if seen <= start <= seen + ROUTER_LAG_S]
    record = {
        "pre_stop_s": pre_stop_s
        or manifests()["Deployment"]["spec"]["template"]["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"][
            "command"
        ][1],
        "requests_in_lag": len(lagging),
        "refused_in_lag": sum(1 for s in lagging if s != 200),
        "deletion_to_sigterm_s": events["sigterm"][pod] - seen,
    }
    (world.run_dir / f"{name}.json").write_text(json.dumps(record, indent=2))
    print(json.dumps(record))
    assert len(lagging) >= 3, outcomes  # the client really sent during the lag
    if pre_stop_s is None:
        assert all(s == 200 for s in lagging), lagging
        assert events["sigterm"][pod] - seen >= ROUTER_LAG_S
    else:
        assert any(s != 200 for s in lagging), lagging
        assert events["sigterm"][pod] - seen < ROUTER_LAG_S


def test_a_restarted_router_rediscovers_the_pods(world: World) -> None:
    warm = _settle(world, 2)
    world.router.stop()
    world.router.start()
    wait_for(lambda: world.router.ready() == 2, 60, "the restarted router admits both replicas")
    with Traffic(world.router.url) as traffic:
        wait_for(lambda: traffic.hosts() == set(warm.values()), 60, "traffic to both Pods")
    assert traffic.failed() == []
