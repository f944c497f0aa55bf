"""``python -m sim node`` against the real control plane (API server, controller manager,
scheduler of ../shared/tools/kube, v1.20): real Deployments, ReplicaSets, Pods, EndpointSlices,
real replica processes, real signals. Time runs 20x (one wall second = 20 simulated seconds)."""

from __future__ import annotations

import json
import random
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from tests.router.kube_apiserver import running_apiserver

pytestmark = pytest.mark.kube

SCALE = 20.0  # simulated seconds per wall second
MODEL = "sim-llama-8b"
NS = "default"


class Cluster:
    """A control plane, a clients for it, and one ``sim node`` process playing the node."""

    def __init__(self, kubeconfig: Path, run_dir: Path) -> None:
        cfg = k8s.Configuration()
        k8s_config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
        self.api_client = k8s.ApiClient(cfg)
        self.core = k8s.CoreV1Api(self.api_client)
        self.apps = k8s.AppsV1Api(self.api_client)
        self.ip_base = f"127.{random.randint(100, 250)}.{random.randint(1, 250)}"
        self.node_log = run_dir / "sim-node.log"
        self.kubeconfig, self.run_dir = kubeconfig, run_dir
        self.kubeconfig_doc: dict[str, Any] = {}
        self.start_node()

    def start_node(self) -> None:
        with self.node_log.open("ab") as out:
            self.node = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "sim",
                    "node",
                    "--kubeconfig",
                    str(self.kubeconfig),
                    "--name",
                    "sim-gpu-0",
                    "--gpus",
                    "8",
                    "--ip-base",
                    self.ip_base,
                    "--time-scale",
                    str(SCALE),
                    "--log-dir",
                    str(self.run_dir / "replicas"),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def log(self) -> str:
        return self.node_log.read_text(errors="replace")

    def pods(self, app: str) -> list[Any]:
        return self.core.list_namespaced_pod(NS, label_selector=f"app={app}").items

    def deploy(
        self, app: str, args: list[str], annotations: dict[str, str], replicas: int = 0, grace_s: int = 30
    ) -> None:
        container = k8s.V1Container(
            name="vllm",
            image="vllm/vllm-openai:v0.11.0",
            command=["vllm", "serve"],
            args=args,
            ports=[k8s.V1ContainerPort(container_port=8000, name="http")],
            readiness_probe=k8s.V1Probe(
                http_get=k8s.V1HTTPGetAction(path="/health", port="http"), period_seconds=5, failure_threshold=1
            ),
            resources=k8s.V1ResourceRequirements(limits={"nvidia.com/gpu": "1"}),
        )
        template = k8s.V1PodTemplateSpec(
            metadata=k8s.V1ObjectMeta(labels={"app": app}, annotations=annotations),
            spec=k8s.V1PodSpec(containers=[container], termination_grace_period_seconds=grace_s),
        )
        self.apps.create_namespaced_deployment(
            NS,
            k8s.V1Deployment(
                metadata=k8s.V1ObjectMeta(name=app),
                spec=k8s.V1DeploymentSpec(
                    replicas=replicas, selector=k8s.V1LabelSelector(match_labels={"app": app}), template=template
                ),
            ),
        )
        self.core.create_namespaced_service(
            NS,
            k8s.V1Service(
                metadata=k8s.V1ObjectMeta(name=app),
                spec=k8s.V1ServiceSpec(selector={"app": app}, ports=[k8s.V1ServicePort(port=8000, target_port=8000)]),
            ),
        )

    def scale(self, app: str, replicas: int) -> None:
        self.apps.patch_namespaced_deployment_scale(app, NS, {"spec": {"replicas": replicas}})

    def endpoint_slices(self, service: str) -> list[dict[str, Any]]:
        """A raw GET of discovery.k8s.io/v1beta1 (the only version 1.20 serves)."""
        cluster = self.kubeconfig_doc["clusters"][0]["cluster"]
        token = next(u["user"]["token"] for u in self.kubeconfig_doc["users"] if u["name"] == "admin")
        resp = httpx.get(
            f"{cluster['server']}/apis/discovery.k8s.io/v1beta1/namespaces/{NS}/endpointslices",
            params={"labelSelector": f"kubernetes.io/service-name={service}"},
            headers={"Authorization": f"Bearer {token}"},
            verify=ssl.create_default_context(cafile=cluster["certificate-authority"]),
            timeout=10,
        )
        resp.raise_for_status()
        return list(resp.json()["items"])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    run_dir = tmp_path_factory.mktemp("kube")
    with running_apiserver(run_dir, control_plane=True) as kubeconfig_doc:
        c = Cluster(run_dir / "kubeconfig", run_dir)
        c.kubeconfig_doc = kubeconfig_doc
        try:
            yield c
        finally:
            c.node.send_signal(signal.SIGTERM)
            try:
                c.node.wait(timeout=20)
            except subprocess.TimeoutExpired:
                c.node.kill()
                c.node.wait()


def wait_for(what: str, check: Callable[[], Any], cluster: Cluster, timeout_s: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; node log:\n{cluster.log()[-4000:]}")


def is_ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def replica_pids(ip: str) -> list[int]:
    """Processes listening on the Pod's IP (a replica may be a pre-started spare, whose command
    line does not name it)."""
    return sorted(
        {
            c.pid
            for c in psutil.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.ip == ip and c.pid
        }
    )


def alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def health_status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return None


def complete(url: str, max_tokens: int = 3) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": max_tokens}, timeout=30
    )


def test_node_registers_ready_with_gpus_and_without_the_not_ready_taint(cluster: Cluster) -> None:
    def registered() -> Any:
        nodes = cluster.core.list_node().items
        return nodes and not nodes[0].spec.taints and nodes[0]

    node = wait_for("the node", registered, cluster, 60)
    assert node.metadata.name == "sim-gpu-0"
    assert node.status.allocatable["nvidia.com/gpu"] == "8"
    assert {c.type: c.status for c in node.status.conditions}["Ready"] == "True"


def test_scale_up_warms_up_then_ready_and_scale_down_drains_in_flight(cluster: Cluster) -> None:
    # warm-up 100 s simulated = 5 wall s; probe every 5 s simulated; grace 600 s simulated = 30 wall s
    cluster.deploy(
        "llama",
        ["sim-llama-8b", "--port", "8000", "--max-model-len", "4k"],
        {"promptedge.io/sim-warmup-s": "100", "promptedge.io/sim-profile": "t4"},
        grace_s=600,
    )
    cluster.scale("llama", 3)
    seen_warming: set[str] = set()

    def all_ready() -> list[Any] | None:
        pods = cluster.pods("llama")
        for p in pods:
            if p.status.phase == "Running" and p.status.pod_ip and not is_ready(p):
                seen_warming.add(p.metadata.name)
        return pods if len(pods) == 3 and all(is_ready(p) for p in pods) else None

    pods = wait_for("3 Ready pods", all_ready, cluster)
    assert seen_warming == {p.metadata.name for p in pods}  # each ran, not Ready, during its warm-up
    ips = {p.status.pod_ip for p in pods}
    assert len(ips) == 3 and all(ip.startswith(cluster.ip_base + ".") for ip in ips)
    wait_for(
        "readyReplicas 3",
        lambda: cluster.apps.read_namespaced_deployment("llama", NS).status.ready_replicas == 3,
        cluster,
    )

    def slice_ready() -> dict[str, bool] | None:
        eps = {
            a: bool(e.get("conditions", {}).get("ready"))
            for s in cluster.endpoint_slices("llama")
            for e in s.get("endpoints") or []
            for a in e["addresses"]
        }
        return eps if eps == {ip: True for ip in ips} else None

    wait_for("an EndpointSlice listing the 3 pods ready", slice_ready, cluster, 30)
    for ip in ips:
        assert complete(f"http://{ip}:8000").status_code == 200

    # scale 3 -> 1 while a long request streams on every pod: t4 decodes one token per
    # ~26 ms simulated, so 3,000 tokens take ~80 s simulated, well within the 600 s grace
    results: dict[str, int] = {}
    finished: dict[str, float] = {}
    started = {ip: threading.Event() for ip in ips}

    def stream(ip: str) -> None:
        body = {"model": MODEL, "prompt": "hi", "max_tokens": 3000, "stream": True}
        lines = []
        with httpx.stream("POST", f"http://{ip}:8000/v1/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line:
                    lines.append(line)
                    started[ip].set()
        finished[ip] = time.monotonic()
        assert lines[-1] == "data: [DONE]"
        results[ip] = sum(len(json.loads(ln[6:])["choices"][0]["text"].split()) for ln in lines[:-1])

    threads = [threading.Thread(target=stream, args=(ip,)) for ip in ips]
    for t in threads:
        t.start()
    assert all(e.wait(30) for e in started.values())  # every request is running
    cluster.scale("llama", 1)
    deleting = wait_for(
        "2 pods deleting",
        lambda: (lambda ps: ps if len(ps) == 2 else None)(
            [p for p in cluster.pods("llama") if p.metadata.deletion_timestamp]
        ),
        cluster,
        30,
    )
    deletion_seen = time.monotonic()
    gone = {p.status.pod_ip for p in deleting}
    left = wait_for("2 pods gone", lambda: (lambda ps: ps if len(ps) == 1 else None)(cluster.pods("llama")), cluster)
    for t in threads:
        t.join(timeout=120)
    assert gone == ips - {left[0].status.pod_ip}
    assert results == {ip: 3000 for ip in ips}  # every in-flight request completed, on the drained pods too
    assert all(finished[ip] > deletion_seen for ip in gone)  # ... though they were still running at deletion
    assert all(replica_pids(ip) == [] for ip in gone)  # their processes exited
    log = cluster.log()
    assert sum("SIGTERM to replica" in line for line in log.splitlines()) == 2
    assert "SIGKILL" not in log  # they drained within the grace period
    assert is_ready(left[0])


def test_a_replica_that_never_becomes_healthy_stays_not_ready(cluster: Cluster) -> None:
    # --max-model-len beyond t4's KV cache: `sim serve` exits 2, as vLLM refuses to start
    cluster.deploy(
        "broken", ["sim-llama-8b", "--max-model-len", "999999"], {"promptedge.io/sim-profile": "t4"}, replicas=1
    )
    cluster.deploy("frozen", ["sim-llama-8b"], {"promptedge.io/sim-warmup-s": "1000000"}, replicas=1)

    def crashed() -> Any:
        pods = cluster.pods("broken")
        cs = pods and pods[0].status.container_statuses
        return cs and cs[0].restart_count >= 1 and pods[0]

    pod = wait_for("a restart of the crashing replica", crashed, cluster)
    status = pod.status.container_statuses[0]
    assert pod.status.phase == "Running" and not is_ready(pod) and not status.ready
    assert status.last_state.terminated.exit_code == 2
    assert status.state.waiting is None or status.state.waiting.reason == "CrashLoopBackOff"
    frozen = wait_for(
        "the frozen pod running", lambda: [p for p in cluster.pods("frozen") if p.status.pod_ip], cluster
    )[0]
    health = f"http://{frozen.status.pod_ip}:8000/health"
    assert wait_for("its replica answering", lambda: health_status(health), cluster) == 503
    time.sleep(1.5)  # 30 simulated seconds: six probe periods, all failed
    frozen = cluster.core.read_namespaced_pod(frozen.metadata.name, NS)
    assert not is_ready(frozen) and frozen.status.container_statuses[0].started
    assert frozen.status.container_statuses[0].restart_count == 0  # running, just never healthy
    for app in ("broken", "frozen"):
        cluster.scale(app, 0)


def test_a_frozen_replica_goes_not_ready_and_a_killed_one_is_restarted(cluster: Cluster) -> None:
    cluster.deploy("victim", ["sim-llama-8b"], {"promptedge.io/sim-warmup-s": "20"}, replicas=1)
    pod = wait_for("a Ready pod", lambda: [p for p in cluster.pods("victim") if is_ready(p)], cluster)[0]
    ip = pod.status.pod_ip
    (pid,) = replica_pids(ip)
    # a replica that stops answering (frozen: its probes time out) goes not Ready, and back
    psutil.Process(pid).suspend()
    try:
        wait_for(
            "not Ready while frozen",
            lambda: not is_ready(cluster.core.read_namespaced_pod(pod.metadata.name, NS)),
            cluster,
            30,
        )
    finally:
        psutil.Process(pid).resume()
    back = wait_for(
        "Ready again when answering",
        lambda: (lambda p: is_ready(p) and p)(cluster.core.read_namespaced_pod(pod.metadata.name, NS)),
        cluster,
        30,
    )
    assert back.status.container_statuses[0].restart_count == 0  # same process, no restart
    # a replica that dies goes not Ready, then is restarted
    psutil.Process(pid).kill()
    wait_for("not Ready", lambda: not is_ready(cluster.core.read_namespaced_pod(pod.metadata.name, NS)), cluster, 30)

    def restarted() -> Any:
        p = cluster.core.read_namespaced_pod(pod.metadata.name, NS)
        return is_ready(p) and p.status.container_statuses[0].restart_count == 1 and p

    again = wait_for("Ready again after a restart", restarted, cluster, 60)
    assert again.status.pod_ip == ip and replica_pids(ip) not in ([], [pid])
    assert complete(f"http://{ip}:8000").status_code == 200
    assert again.status.container_statuses[0].last_state.terminated.exit_code == 128 + signal.SIGKILL
    cluster.scale("victim", 0)


def test_an_address_another_process_listens_on_is_never_a_pod_ip(cluster: Cluster) -> None:
    # Pods of a real cluster each have their own network namespace; here they share the machine's
    # loopback, where another node or loop may already listen on the address the next Pod would get.
    # That Pod's replica could not bind, and the other process answered its readiness probe.
    class Squatter(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"another process")

        def log_message(self, *args: Any) -> None:
            pass

    servers = []
    for host in range(2, 41):  # every address of the first 39 not held by this node's own Pods
        try:
            servers.append(ThreadingHTTPServer((f"{cluster.ip_base}.{host}", 8000), Squatter))
        except OSError:
            pass
    taken = {server.server_address[0] for server in servers}
    assert len(taken) > 30
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cluster.deploy("squatted", ["sim-llama-8b"], {}, replicas=1)
        pod = wait_for("a Ready pod", lambda: [p for p in cluster.pods("squatted") if is_ready(p)], cluster)[0]
        ip = pod.status.pod_ip
        assert ip not in taken
        assert replica_pids(ip), f"nothing of this node listens on {ip}"
        models = httpx.get(f"http://{ip}:8000/v1/models", timeout=5).json()
        assert [m["id"] for m in models["data"]] == [MODEL]
        time.sleep(1)  # 20 simulated seconds: it stays up, no crash loop
        pod = cluster.core.read_namespaced_pod(pod.metadata.name, NS)
        assert is_ready(pod) and pod.status.container_statuses[0].restart_count == 0
        cluster.scale("squatted", 0)
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def test_a_pod_it_cannot_run_is_removed_when_deleted_and_frees_its_gpus(cluster: Cluster) -> None:
    # "5m" is no warm-up the node reads: the Pod waits with the reason; deleted, it stayed
    # Terminating for ever and kept its GPUs from the scheduler (attack round, 4 December)
    cluster.deploy("typo", ["sim-llama-8b"], {"promptedge.io/sim-warmup-s": "5m"}, replicas=1)

    def waiting() -> Any:
        pods = cluster.pods("typo")
        cs = pods and pods[0].status.container_statuses
        return cs and cs[0].state.waiting and cs[0].state.waiting.reason == "CreateContainerConfigError" and pods[0]

    wait_for("the Pod waiting with its reason", waiting, cluster)
    cluster.scale("typo", 0)
    wait_for("the Pod gone", lambda: cluster.pods("typo") == [], cluster, 20)


def test_no_replica_outlives_the_node(cluster: Cluster) -> None:
    cluster.deploy("orphans", ["sim-llama-8b"], {}, replicas=2)

    def running() -> set[str] | None:
        ips = {p.status.pod_ip for p in cluster.pods("orphans") if p.status.pod_ip}
        return ips if len(ips) == 2 and all(replica_pids(ip) for ip in ips) else None

    ips = wait_for("2 replica processes", running, cluster)
    children = [p.pid for p in psutil.Process(cluster.node.pid).children(recursive=True)]
    assert len(children) >= 2  # the replicas, and the spares kept pre-started
    cluster.node.send_signal(signal.SIGTERM)
    assert cluster.node.wait(timeout=30) == 0
    assert alive(children) == []  # all stopped on the way out

    restarts = {p.metadata.name: p.status.container_statuses[0].restart_count for p in cluster.pods("orphans")}
    cluster.start_node()  # a new node takes the Pods over, on the same addresses
    assert wait_for("replicas started again", running, cluster) == ips
    # their replicas are new processes that warmed up again: restarts, as the forecaster's
    # warm-up measure must see them (it skips restarted Pods; a count kept at 0 made a 20 s
    # warm-up read as 295 s, attack round, 4 December)
    wait_for(
        "each adopted Pod counting one restart",
        lambda: (
            {
                p.metadata.name: p.status.container_statuses[0].restart_count
                for p in cluster.pods("orphans")
                if p.status.container_statuses
            }
            == {name: n + 1 for name, n in restarts.items()}
        ),
        cluster,
        15,
    )
    time.sleep(1)  # its spares started too
    children = [p.pid for p in psutil.Process(cluster.node.pid).children(recursive=True)]
    cluster.node.kill()  # SIGKILL: the node cannot clean up; the kernel does (PR_SET_PDEATHSIG)
    cluster.node.wait()
    wait_for("replicas and spares gone with their node", lambda: alive(children) == [], cluster, 15)
