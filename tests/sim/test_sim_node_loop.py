"""The node's reconcile loop over a recording in-memory API, with real replica processes: a
steady Pod writes nothing more, deletion drains then deletes once. (The real control plane is
in test_sim_node_kube.py; this one runs wherever Python does.)"""

from __future__ import annotations

import copy
import random
import time
from pathlib import Path
from typing import Any

from sim.node import NodeSettings, SimNode
from sim.node.process import ReplicaProcess


class RecordingApi:
    """KubeApi's calls, recorded; ``pods`` is what list_pods returns."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.calls: list[tuple[str, Any]] = []
        self.node: dict[str, Any] | None = None

    def list_pods(self, node_name: str) -> list[dict[str, Any]]:
        return copy.deepcopy(self.pods)

    def get_node(self, name: str) -> dict[str, Any] | None:
        return self.node

    def create_node(self, body: dict[str, Any]) -> None:
        self.calls.append(("create_node", body))
        self.node = {**body, "spec": {"taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]}}

    def patch_node(self, name: str, body: dict[str, Any]) -> None:
        self.calls.append(("patch_node", body))
        assert self.node is not None
        self.node["spec"] = body["spec"]

    def patch_node_status(self, name: str, body: dict[str, Any]) -> None:
        self.calls.append(("patch_node_status", body))

    def patch_pod_status(self, namespace: str, name: str, body: dict[str, Any]) -> bool:
        self.calls.append(("patch_pod_status", body))
        return True

    def delete_pod_now(self, namespace: str, name: str, uid: str) -> None:
        self.calls.append(("delete_pod_now", uid))
        self.pods = [p for p in self.pods if p["metadata"]["uid"] != uid]


POD = {
    "metadata": {
        "name": "vllm-0",
        "namespace": "default",
        "uid": "uid-0",
        "annotations": {"promptedge.io/sim-warmup-s": "20"},
    },
    "spec": {
        "nodeName": "sim-gpu-0",
        "terminationGracePeriodSeconds": 600,
        "containers": [
            {
                "name": "vllm",
                "image": "vllm/vllm-openai",
                "command": ["vllm", "serve"],
                "args": ["sim-llama-8b"],
                "ports": [{"containerPort": 8000}],
                "readinessProbe": {"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 2},
            }
        ],
    },
    "status": {"phase": "Pending"},
}


def run_until(node: SimNode, api: RecordingApi, done: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, api.calls[-3:]
        node.sync(api.list_pods("sim-gpu-0"))
        for rt in list(node.pods.values()):
            node.step(rt, time.monotonic())
        time.sleep(0.05)


def pod_statuses(api: RecordingApi) -> list[dict[str, Any]]:
    return [body["status"] for call, body in api.calls if call == "patch_pod_status"]


def ready(status: dict[str, Any]) -> bool:
    return {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"


def test_steady_pod_writes_nothing_and_deletion_drains_then_deletes_once() -> None:
    api = RecordingApi([copy.deepcopy(POD)])
    node = SimNode(api, NodeSettings(ip_base=f"127.0.{random.randint(150, 250)}", time_scale=20.0))  # type: ignore[arg-type]
    try:
        node.register()
        assert api.node is not None and api.node["spec"]["taints"] == []
        run_until(node, api, lambda: any(ready(s) for s in pod_statuses(api)))
        first = pod_statuses(api)[0]
        assert first["phase"] == "Running" and not ready(first)  # warming up: runs, not Ready
        writes = len(api.calls)
        until = time.monotonic() + 1.0  # 20 simulated seconds, ten probe periods, all 200
        run_until(node, api, lambda: time.monotonic() > until)
        assert api.calls[writes:] == []  # nothing changed, nothing written

        proc: ReplicaProcess = node.pods["uid-0"].process  # type: ignore[assignment]
        api.pods[0]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        run_until(node, api, lambda: ("delete_pod_now", "uid-0") in api.calls)
        assert proc.exit_code() == 0  # SIGTERM: drained and exited by itself, no SIGKILL
        assert [c for c, _ in api.calls].count("delete_pod_now") == 1
        run_until(node, api, lambda: "uid-0" not in node.pods)
    finally:
        node.close()


def test_a_replica_that_does_not_drain_in_its_grace_period_is_killed() -> None:
    import threading

    import httpx

    pod = copy.deepcopy(POD)
    pod["metadata"]["annotations"] = {}
    pod["spec"]["terminationGracePeriodSeconds"] = 20  # 1 wall second at 20x
    api = RecordingApi([pod])
    node = SimNode(api, NodeSettings(ip_base=f"127.0.{random.randint(150, 250)}", time_scale=20.0))  # type: ignore[arg-type]
    try:
        run_until(node, api, lambda: any(ready(s) for s in pod_statuses(api)))
        url = f"http://{node.pods['uid-0'].ip}:8000"
        assert httpx.post(f"{url}/sim/faults", json={"hang": True}).status_code == 200

        def hang() -> None:  # never answered: the replica cannot drain; killed under it
            try:
                httpx.post(f"{url}/v1/completions", json={"model": "sim-llama-8b", "prompt": "x"}, timeout=30)
            except httpx.HTTPError:
                pass

        hung = threading.Thread(target=hang, daemon=True)
        hung.start()
        time.sleep(0.5)
        proc: ReplicaProcess = node.pods["uid-0"].process  # type: ignore[assignment]
        api.pods[0]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        started = time.monotonic()
        run_until(node, api, lambda: ("delete_pod_now", "uid-0") in api.calls)
        assert proc.exit_code() == -9  # SIGKILL once the grace period was over
        assert time.monotonic() - started >= 1.0  # not before it (a lower bound: load cannot break it)
    finally:
        node.close()


def test_a_spare_process_becomes_the_replica_and_refuses_bad_settings_as_serve_does() -> None:
    good = copy.deepcopy(POD)
    bad = copy.deepcopy(POD)
    bad["metadata"].update(name="vllm-bad", uid="uid-bad")
    bad["spec"]["containers"][0]["args"] = ["sim-llama-8b", "--max-model-len", "999999"]
    api = RecordingApi([good])
    node = SimNode(
        api,
        NodeSettings(
            ip_base=f"127.0.{random.randint(150, 250)}",
            time_scale=20.0,  # type: ignore[arg-type]
            spares=1,
        ),
    )
    try:
        node.spares.fill()
        spare = node.spares.spares[0]
        run_until(node, api, lambda: any(ready(s) for s in pod_statuses(api)))
        assert node.pods["uid-0"].process is spare  # the pre-started process took the Pod
        node.spares.fill()
        api.pods.append(bad)
        run_until(node, api, lambda: node.pods.get("uid-bad") and node.pods["uid-bad"].last_terminated)
        assert node.pods["uid-bad"].last_terminated.exit_code == 2  # as `sim serve` exits
        assert node.pods["uid-bad"].process is None or node.pods["uid-bad"].restart_count >= 0
        log = Path(node.log_dir / "default_vllm-bad.log").read_text()
        assert "error: max_model_len 999999" in log, log
    finally:
        node.close()


def _pod_with_pre_stop(pre_stop: dict[str, Any], grace_s: int) -> dict[str, Any]:
    pod = copy.deepcopy(POD)
    pod["spec"]["terminationGracePeriodSeconds"] = grace_s
    pod["spec"]["containers"][0]["lifecycle"] = {"preStop": pre_stop}
    return pod


def _delete_and_see_it(node: SimNode, api: RecordingApi) -> float:
    """Set the Pod's deletionTimestamp and let the node see it (one pass); the moment seen."""
    api.pods[0]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    node.sync(api.list_pods("sim-gpu-0"))
    seen = time.monotonic()
    for rt in list(node.pods.values()):
        node.step(rt, seen)
    return seen


def test_pre_stop_sleep_keeps_the_replica_serving_and_ready_then_sigterm_drains_it() -> None:
    import httpx

    # preStop sleep 20 simulated s = 1 wall s at 20x, inside a 600 s grace period
    api = RecordingApi([_pod_with_pre_stop({"exec": {"command": ["/bin/sh", "-c", "sleep 20"]}}, 600)])
    node = SimNode(api, NodeSettings(ip_base=f"127.0.{random.randint(150, 250)}", time_scale=20.0))  # type: ignore[arg-type]
    try:
        run_until(node, api, lambda: any(ready(s) for s in pod_statuses(api)))
        rt = node.pods["uid-0"]
        proc: ReplicaProcess = rt.process  # type: ignore[assignment]
        seen = _delete_and_see_it(node, api)
        # during the preStop sleep the replica still admits requests (no SIGTERM yet) ...
        answer = httpx.post(
            f"http://{rt.ip}:8000/v1/completions",
            timeout=30,
            json={"model": "sim-llama-8b", "prompt": "still serving?", "max_tokens": 4},
        )
        assert answer.status_code == 200, answer.text
        assert not rt.sigterm_sent and proc.exit_code() is None
        assert ready(pod_statuses(api)[-1])  # ... and its readiness follows the probe: still Ready
        run_until(node, api, lambda: ("delete_pod_now", "uid-0") in api.calls)
        assert proc.exit_code() == 0  # then SIGTERM: drained, exited by itself
        assert time.monotonic() - seen >= 1.0  # not before the sleep was over (a lower bound)
    finally:
        node.close()


def test_pre_stop_http_get_is_called_on_the_pod_before_sigterm() -> None:
    import http.server
    import threading

    import httpx

    calls: list[tuple[str, int]] = []
    replica: dict[str, str] = {}

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            # while the hook runs, the replica must not have had SIGTERM: /health still 200
            calls.append((self.path, httpx.get(f"{replica['url']}/health", timeout=10).status_code))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    pod = _pod_with_pre_stop(
        {"httpGet": {"host": "127.0.0.1", "port": server.server_address[1], "path": "/drain"}}, 600
    )
    api = RecordingApi([pod])
    node = SimNode(api, NodeSettings(ip_base=f"127.0.{random.randint(150, 250)}", time_scale=20.0))  # type: ignore[arg-type]
    try:
        run_until(node, api, lambda: any(ready(s) for s in pod_statuses(api)))
        replica["url"] = f"http://{node.pods['uid-0'].ip}:8000"
        proc: ReplicaProcess = node.pods["uid-0"].process  # type: ignore[assignment]
        _delete_and_see_it(node, api)
        run_until(node, api, lambda: ("delete_pod_now", "uid-0") in api.calls)
        assert calls == [("/drain", 200)]
        assert proc.exit_code() == 0
    finally:
        node.close()
        server.shutdown()
        server.server_close()


def test_a_pre_stop_longer_than_the_grace_period_is_cut_by_it() -> None:
    # sleep 6000 simulated s, grace 20 s: SIGTERM after 1 wall s (at 20x), not after 300
    api = RecordingApi([_pod_with_pre_stop({"exec": {"command": ["sleep", "6000"]}}, 20)])
    node = SimNode(api, NodeSettings(ip_base=f"127.0.{random.randint(150, 250)}", time_scale=20.0))  # type: ignore[arg-type]
    try:
        run_until(node, api, lambda: any(ready(s) for s in pod_statuses(api)))
        proc: ReplicaProcess = node.pods["uid-0"].process  # type: ignore[assignment]
        _delete_and_see_it(node, api)
        run_until(node, api, lambda: ("delete_pod_now", "uid-0") in api.calls, timeout_s=60)
        rt = node.pods["uid-0"]
        assert rt.hook_cut and rt.sigterm_sent  # SIGTERM once the grace period was over (the wait above)
        assert proc.exit_code() in (0, -9)  # drained, or SIGKILL after the kubelet's 2 s minimum (0.1 wall s)
    finally:
        node.close()
