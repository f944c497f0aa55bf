"""Pure builders of what the stand-in node writes: the Node, its status, each Pod's status.

All bodies are the API's JSON (camelCase), for patches of the ``node``/``node status`` and
``pod status`` resources. Times are RFC 3339 wall-clock strings (the API server's clock).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

NOT_READY_TAINT = "node.kubernetes.io/not-ready"
GPU_RESOURCE = "nvidia.com/gpu"
HOST_IP = "127.0.0.1"


def rfc3339(moment: datetime | None = None) -> str:
    """``moment`` (default: now, UTC) as the API's time format, second precision."""
    return (moment or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_capacity(gpus: int, cpu: str, memory: str, pods: int) -> dict[str, str]:
    """Capacity (= allocatable) of the node: quantities as strings, GPUs as ``nvidia.com/gpu``."""
    return {"cpu": cpu, "memory": memory, "pods": str(pods), GPU_RESOURCE: str(gpus), "ephemeral-storage": "1Ti"}


def node_body(name: str, labels: dict[str, str]) -> dict[str, Any]:
    """A new Node object (status is written separately)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                **labels,
            },
        },
    }


def node_status(capacity: dict[str, str], heartbeat: str, ready_since: str, version: str) -> dict[str, Any]:
    """The node's status patch: capacity, allocatable, a Ready=True condition with this
    heartbeat, the loopback address, and node info naming the sim."""
    return {
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "sim node is posting ready status",
                    "lastHeartbeatTime": heartbeat,
                    "lastTransitionTime": ready_since,
                }
            ],
            "addresses": [{"type": "InternalIP", "address": HOST_IP}, {"type": "Hostname", "address": "localhost"}],
            "nodeInfo": {
                "kubeletVersion": version,
                "kubeProxyVersion": version,
                "operatingSystem": "linux",
                "architecture": "amd64",
                "containerRuntimeVersion": "sim://promptedge",
                "osImage": "PromptEdge sim node",
                "kernelVersion": "",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
            },
        }
    }


def taints_without_not_ready(taints: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """The node's taints minus ``node.kubernetes.io/not-ready``; None when there is none to remove."""
    taints = taints or []
    kept = [t for t in taints if t.get("key") != NOT_READY_TAINT]
    return kept if len(kept) != len(taints) else None


@dataclass(frozen=True)
class Terminated:
    """How the container's last run ended."""

    exit_code: int
    reason: str  # "Completed", "Error" or "OOMKilled"-like; here Completed/Error
    started_at: str
    finished_at: str


@dataclass(frozen=True)
class PodView:
    """Everything the Pod's status is built from (one container per Pod)."""

    ip: str | None
    start_time: str
    container: str
    image: str
    running_since: str | None  # None: the container is not running now
    waiting_reason: str | None  # e.g. "ContainerCreating", "CrashLoopBackOff" when not running
    ready: bool
    ready_changed_at: str
    restart_count: int
    last_terminated: Terminated | None


def pod_status(view: PodView) -> dict[str, Any]:
    """Status patch of a Pod (``phase: Running`` once it has an IP, as with restartPolicy Always
    a crashing container keeps its Pod Running), with Ready/ContainersReady from ``view.ready``."""
    ready = "True" if view.ready else "False"
    state: dict[str, Any]
    if view.running_since is not None:
        state = {"running": {"startedAt": view.running_since}}
    else:
        state = {"waiting": {"reason": view.waiting_reason or "ContainerCreating"}}
    container: dict[str, Any] = {
        "name": view.container,
        "image": view.image,
        "imageID": f"sim://{view.image}",
        "containerID": f"sim://{view.container}-{view.restart_count}",
        "ready": view.ready,
        "started": view.running_since is not None,
        "restartCount": view.restart_count,
        "state": state,
        "lastState": {},
    }
    if view.last_terminated is not None:
        t = view.last_terminated
        container["lastState"] = {
            "terminated": {
                "exitCode": t.exit_code,
                "reason": t.reason,
                "startedAt": t.started_at,
                "finishedAt": t.finished_at,
            }
        }
    status: dict[str, Any] = {
        "phase": "Running" if view.ip else "Pending",
        "hostIP": HOST_IP,
        "startTime": view.start_time,
        "conditions": [
            {"type": "Initialized", "status": "True", "lastTransitionTime": view.start_time},
            {"type": "ContainersReady", "status": ready, "lastTransitionTime": view.ready_changed_at},
            {"type": "Ready", "status": ready, "lastTransitionTime": view.ready_changed_at},
        ],
        "containerStatuses": [container] if view.container else [],
    }
    if view.ip:
        status["podIP"] = view.ip
        status["podIPs"] = [{"ip": view.ip}]
    return {"status": status}


def crash_backoff_s(restarts: int, base_s: float = 10.0, cap_s: float = 300.0) -> float:
    """The kubelet's restart back-off before restart number ``restarts + 1``: 10 s, 20 s, 40 s,
    ... capped at 300 s (simulated seconds)."""
    doublings: int = 2 ** max(0, restarts)  # a non-negative power of two: an int
    return min(cap_s, base_s * doublings)


class IpPool:
    """Unique Pod IPs ``<base>.2`` .. ``<base>.254`` on loopback (``base`` like ``127.0.1``).

    Raises ValueError for a base outside 127.0.0.0/8 or not three octets."""

    def __init__(self, base: str) -> None:
        parts = base.split(".")
        if len(parts) != 3 or parts[0] != "127" or not all(p.isdigit() and 0 <= int(p) <= 255 for p in parts):
            raise ValueError(f"ip base {base!r} must be three octets inside 127.0.0.0/8, e.g. 127.0.1")
        self.base = base
        self._used: set[str] = set()

    def take(self, wanted: str | None = None, usable: Callable[[str], bool] = lambda ip: True) -> str | None:
        """``wanted`` if it is in this pool, free and ``usable``, else the lowest such address;
        None when none is. ``usable`` says whether nothing outside this pool holds the address
        (the node checks that nothing else on the machine listens there)."""
        if wanted and wanted.rsplit(".", 1)[0] == self.base and wanted not in self._used:
            host = wanted.rsplit(".", 1)[1]
            if host.isdigit() and 2 <= int(host) <= 254 and usable(wanted):
                self._used.add(wanted)
                return wanted
        for octet in range(2, 255):
            ip = f"{self.base}.{octet}"
            if ip not in self._used and usable(ip):
                self._used.add(ip)
                return ip
        return None

    def give_back(self, ip: str | None) -> None:
        """Free ``ip`` (no-op for None or an address not taken)."""
        if ip:
            self._used.discard(ip)
