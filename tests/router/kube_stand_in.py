"""A minimal stand-in kubelet for the router's discovery tests on the real control plane.

``sim node`` (branch ``h10-node``) is the product's stand-in node; this test-only one does the
few things the discovery tests need, with timestamps, and nothing else. Through the official
client only, it registers a Node (Ready, schedulable, the admission taint removed) and, for
each Pod the scheduler binds to it:

- starts ``python -m sim serve`` on a loopback address of its own (``127.<net>.0.<n>``) and the
  Pod's first container port, with the container's ``env`` (``PROMPTEDGE_SIM_WARMUP_S`` is the
  replica's warm-up), and reports the Pod ``Running`` with that ``podIP``, not Ready;
- reports it Ready once the replica's ``/health`` answers 200 (readiness-probe semantics);
- on deletion (``deletionTimestamp`` set), as the kubelet does: runs the ``preStop`` hook (only
  ``exec: [sleep, N]`` is understood), then SIGTERM, SIGKILL after the rest of the grace period,
  then deletes the Pod with grace period 0.

Times (``time.monotonic()``) per Pod name: ``seen_deleted``, ``sigterm``, ``exited``. The loop
polls the Pod list every ``poll_s`` (0.05 s): the delay a kubelet's watch would not have is at
most that.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from kubernetes import client as k8s

ROOT = Path(__file__).resolve().parents[2]


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def pre_stop_sleep(pod: Any) -> float:
    """Seconds of the first container's ``preStop: exec: [sleep, N]`` hook (0 when none)."""
    hook = pod.spec.containers[0].lifecycle and pod.spec.containers[0].lifecycle.pre_stop
    action = hook.var_exec if hook is not None else None   # the client's name for the `exec` field
    command = action.command if action is not None else None
    if command and command[0] == "sleep" and len(command) == 2:
        return float(command[1])
    return 0.0


class StandInNode:
    """Plays the kubelet of Node ``name`` for the Pods of ``namespace`` (see the module doc)."""

    def __init__(self, core: k8s.CoreV1Api, name: str, namespace: str, net: int, log_dir: Path,
                 poll_s: float = 0.05) -> None:
        self.core, self.name, self.namespace, self.net = core, name, namespace, net
        self.log_dir, self.poll_s = log_dir, poll_s
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.addresses: dict[str, str] = {}           # pod name -> podIP
        self.ready: set[str] = set()
        self.stopping: set[str] = set()
        self.seen_deleted: dict[str, float] = {}
        self.sigterm: dict[str, float] = {}
        self.exited: dict[str, float] = {}
        self.errors: list[str] = []
        self._next = 1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"stand-in-{name}", daemon=True)

    def start(self) -> StandInNode:
        self.core.create_node(k8s.V1Node(metadata=k8s.V1ObjectMeta(name=self.name)))
        self.core.patch_node_status(self.name, {"status": {
            "capacity": {"cpu": "64", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "8"},
            "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "lastHeartbeatTime": _now(), "lastTransitionTime": _now()}]}})
        self.core.patch_node(self.name, {"spec": {"taints": None, "unschedulable": False}})
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)

    def _run(self) -> None:
        with httpx.Client(timeout=1.0) as http:
            while not self._stop.wait(self.poll_s):
                try:
                    pods = self.core.list_namespaced_pod(self.namespace, field_selector=f"spec.nodeName={self.name}",
                                                         _request_timeout=5).items
                except Exception as exc:  # noqa: BLE001 - a test helper: note it and try again
                    self.errors.append(repr(exc))
                    continue
                for pod in pods:
                    self._sync(pod, http)

    def _sync(self, pod: Any, http: httpx.Client) -> None:
        name = pod.metadata.name
        if pod.metadata.deletion_timestamp is not None:
            if name not in self.stopping:
                self.stopping.add(name)
                self.seen_deleted[name] = time.monotonic()
                threading.Thread(target=self._terminate, args=(pod,), daemon=True).start()
            return
        if name not in self.processes:
            self._launch(pod)
        elif name not in self.ready and self._healthy(http, name, pod):
            self._report(pod, ready=True)
            self.ready.add(name)

    def _port(self, pod: Any) -> int:
        return pod.spec.containers[0].ports[0].container_port

    def _launch(self, pod: Any) -> None:
        name = pod.metadata.name
        ip = f"127.{self.net}.0.{self._next}"
        self._next += 1
        env = {**os.environ, **{e.name: e.value for e in pod.spec.containers[0].env or [] if e.value is not None}}
        log = (self.log_dir / f"{name}.log").open("wb")
        self.processes[name] = subprocess.Popen(
            [sys.executable, "-m", "sim", "serve", "--host", ip, "--port", str(self._port(pod))],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.addresses[name] = ip
        self._report(pod, ready=False)

    def _healthy(self, http: httpx.Client, name: str, pod: Any) -> bool:
        try:
            return http.get(f"http://{self.addresses[name]}:{self._port(pod)}/health").status_code == 200
        except httpx.HTTPError:
            return False

    def _report(self, pod: Any, ready: bool) -> None:
        flag = "True" if ready else "False"
        conditions = [{"type": t, "status": s, "lastTransitionTime": _now()} for t, s in
                      (("PodScheduled", "True"), ("Initialized", "True"), ("ContainersReady", flag), ("Ready", flag))]
        container = pod.spec.containers[0]
        self.core.patch_namespaced_pod_status(pod.metadata.name, self.namespace, {"status": {
            "phase": "Running", "podIP": self.addresses[pod.metadata.name],
            "podIPs": [{"ip": self.addresses[pod.metadata.name]}], "hostIP": "127.0.0.1", "startTime": _now(),
            "conditions": conditions,
            "containerStatuses": [{"name": container.name, "image": container.image, "imageID": "",
                                   "ready": ready, "restartCount": 0, "started": True,
                                   "state": {"running": {"startedAt": _now()}}}]}})

    def _terminate(self, pod: Any) -> None:
        name = pod.metadata.name
        grace = pod.spec.termination_grace_period_seconds
        deadline = self.seen_deleted[name] + (30 if grace is None else grace)
        time.sleep(min(pre_stop_sleep(pod), max(0.0, deadline - time.monotonic())))
        process = self.processes.get(name)
        if process is not None:
            self.sigterm[name] = time.monotonic()
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
            self.exited[name] = time.monotonic()
        try:
            self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)
        except k8s.ApiException as exc:
            if exc.status != 404:
                self.errors.append(repr(exc))
