"""The stand-in kubelet: registers a Node and runs each Pod bound to it as a sim replica.

One loop (``SimNode.run``) does everything, on wall time derived from simulated time by
``time_scale``: every ``sync_interval_s`` it lists the Pods bound to the node; on each pass it
starts, probes, restarts and stops replicas and writes a Pod's status only when it changed.
Readiness probes run on a small thread pool so a hung replica never stalls the loop.
"""

from __future__ import annotations

import logging
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from sim.node.kubeapi import KubeApi, NodeApiError
from sim.node.pod.prestop import prestop_sleep_wall_s, sigkill_at
from sim.node.pod.spec import PodSpecError, replica_spec
from sim.node.pod.warmup import WarmupError, warmup_seconds
from sim.node.process import ReplicaProcess, SparePool, replica_settings, serve_command
from sim.node.runtime import PodRuntime
from sim.node.settings import NodeSettings
from sim.node.status import (
    IpPool,
    Terminated,
    crash_backoff_s,
    node_body,
    node_capacity,
    node_status,
    pod_status,
    rfc3339,
    taints_without_not_ready,
)

log = logging.getLogger("sim.node")

KUBELET_VERSION = "v1.20.2-sim"
HEARTBEAT_S = 10.0  # simulated seconds between node status updates (the kubelet's default)
MIN_HEARTBEAT_WALL_S = 1.0  # ... but at most once a wall second
MIN_PROBE_TIMEOUT_WALL_S = 1.0  # a probe's timeout is never below one wall second (CPU queueing)
BACKOFF_RESET_S = 600.0  # a run this long (simulated) resets the crash back-off, as the kubelet
STOP_WAIT_WALL_S = 3.0  # on node exit: SIGTERM, then SIGKILL after this many wall seconds
TICK_WALL_S = 0.05
WARN_EVERY_WALL_S = 5.0  # the same API error is logged at most this often


def _hook_get(http: httpx.Client, url: str, timeout_s: float) -> str:
    """A preStop ``httpGet``: the outcome for the log (a failed hook is logged, never fatal)."""
    try:
        return f"HTTP {http.get(url, timeout=timeout_s).status_code}"
    except httpx.HTTPError as exc:
        return f"failed: {type(exc).__name__}"


def _probe(http: httpx.Client, url: str, timeout_s: float) -> bool:
    """An HTTP readiness probe: any status 200..399 in time is a success."""
    try:
        return 200 <= http.get(url, timeout=timeout_s).status_code < 400
    except httpx.HTTPError:
        return False


def address_free(ip: str, port: int) -> bool:
    """Whether a replica could listen on ``ip:port`` now: a test bind with SO_REUSEADDR, as
    uvicorn binds, so only a listening socket (another node's replica, any server) makes it
    False, not a closed connection's TIME_WAIT. Pods share this machine's loopback, unlike
    the network namespaces of a real cluster."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((ip, port))
        except OSError:
            return False
    return True


class SimNode:
    """A Node and its Pods' replicas. ``run(stop)`` until ``stop`` is set, then ``close()``."""

    def __init__(self, api: KubeApi, settings: NodeSettings) -> None:
        self.api = api
        self.settings = settings
        self.scale = settings.time_scale
        self.ips = IpPool(settings.ip_base)
        self.pods: dict[str, PodRuntime] = {}
        self._tmp_logs: Path | None = None
        if settings.log_dir is None:
            self._tmp_logs = Path(tempfile.mkdtemp(prefix="promptedge-sim-node-"))
        self.log_dir = settings.log_dir or self._tmp_logs or Path(".")
        self._http = httpx.Client()
        self._probes = ThreadPoolExecutor(max_workers=8, thread_name_prefix="sim-node-probe")
        self._ready_since = rfc3339()
        self._warned: dict[str, float] = {}
        self.spares = SparePool(settings.spares, self.log_dir)

    # --- the Node -------------------------------------------------------------------------

    def register(self) -> None:
        """Create the Node if needed, post its status (Ready, capacity incl. GPUs) and remove
        the not-ready taint that admission put on it."""
        if self.api.get_node(self.settings.name) is None:
            self.api.create_node(node_body(self.settings.name, {"promptedge.io/sim-node": "true"}))
            log.info("node %s: registered (%s nvidia.com/gpu)", self.settings.name, self.settings.gpus)
        self.heartbeat()

    def heartbeat(self) -> None:
        """Post the node status with a fresh heartbeat; drop the not-ready taint if present."""
        s = self.settings
        capacity = node_capacity(s.gpus, s.cpu, s.memory, s.max_pods)
        self.api.patch_node_status(s.name, node_status(capacity, rfc3339(), self._ready_since, KUBELET_VERSION))
        node = self.api.get_node(s.name) or {}
        kept = taints_without_not_ready((node.get("spec") or {}).get("taints"))
        if kept is not None:
            self.api.patch_node(s.name, {"spec": {"taints": kept}})
            log.info("node %s: Ready, removed taint node.kubernetes.io/not-ready", s.name)

    # --- the loop ---------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Register, then sync Pods and drive replicas until ``stop`` is set. API errors are
        logged and retried on the next pass; the node never gives up on its own."""
        registered = False
        next_sync = next_beat = 0.0
        beat_s = max(HEARTBEAT_S / self.scale, MIN_HEARTBEAT_WALL_S)
        while not stop.is_set():
            now = time.monotonic()
            try:
                if not registered:
                    self.register()
                    registered, next_beat = True, now + beat_s
                if now >= next_sync:
                    next_sync = now + self.settings.sync_interval_s
                    self.sync(self.api.list_pods(self.settings.name))
                if now >= next_beat:
                    next_beat = now + beat_s
                    self.heartbeat()
            except NodeApiError as exc:
                self._warn(str(exc))
                stop.wait(1.0)
            for rt in list(self.pods.values()):
                self.step(rt, time.monotonic())
            if registered:
                self.spares.fill()
            stop.wait(TICK_WALL_S)

    def sync(self, pods: list[dict[str, Any]]) -> None:
        """Reconcile the known Pods with the listed ones (the API's JSON)."""
        seen = set()
        for pod in pods:
            meta = pod.get("metadata") or {}
            uid = meta.get("uid", "")
            seen.add(uid)
            phase = (pod.get("status") or {}).get("phase")
            rt = self.pods.get(uid)
            if rt is None:
                if phase in ("Succeeded", "Failed"):
                    continue
                rt = self._admit(pod)
                self.pods[uid] = rt
            if meta.get("deletionTimestamp") and not rt.terminating:
                self._begin_termination(rt, pod)
        for uid in [u for u in self.pods if u not in seen]:
            rt = self.pods.pop(uid)
            self._forget(rt, "deleted")

    def _admit(self, pod: dict[str, Any]) -> PodRuntime:
        meta = pod["metadata"]
        status = pod.get("status") or {}
        rt = PodRuntime(
            uid=meta["uid"],
            namespace=meta["namespace"],
            name=meta["name"],
            spec=None,
            ip=None,
            warmup_s=0.0,
            start_ts=status.get("startTime") or rfc3339(),
            start_at=time.monotonic(),
        )
        try:
            rt.spec = replica_spec(pod, self.settings.profile, self.settings.warmup)
            rt.warmup_s = warmup_seconds(rt.spec.warmup, rt.name)
        except (PodSpecError, WarmupError) as exc:
            rt.error = str(exc)
            log.warning("pod %s: cannot run it: %s", rt.key, exc)
            return rt
        except Exception as exc:  # noqa: BLE001 - a spec this parser did not foresee must not stop the node
            rt.error = f"cannot read its spec: {type(exc).__name__}: {exc}"
            log.warning("pod %s: %s", rt.key, rt.error)
            return rt
        previous = (status.get("containerStatuses") or [{}])[0]
        ran = (previous.get("state") or {}).get("running")
        if ran is not None:
            # a node before this one ran its replica, which died with it: the new process is a
            # restart (the forecaster's warm-up measure skips restarted Pods), reported as the
            # kubelet reports a container killed by SIGKILL
            rt.restart_count = int(previous.get("restartCount") or 0)
            rt.last_terminated = Terminated(137, "Error", ran.get("startedAt") or rt.start_ts, rfc3339())
        port = rt.spec.port
        rt.ip = self.ips.take(status.get("podIP"), usable=lambda ip: address_free(ip, port))
        if rt.ip is None:
            rt.error = f"no free Pod IP in {self.settings.ip_base}.0/24"
        return rt

    # --- one Pod ----------------------------------------------------------------------------

    def step(self, rt: PodRuntime, now: float) -> None:
        """Advance one Pod: start/restart, collect an exit, probe, terminate; then publish."""
        if rt.deleted:
            return
        if rt.error is None and rt.spec is not None:
            if rt.process is not None and rt.process.exit_code() is not None:
                self._on_exit(rt, now)
            if rt.terminating:
                self._terminate(rt, now)
                if rt.deleted:
                    return
            elif rt.process is None and now >= rt.start_at:
                self._start(rt, now)
            if rt.process is not None:
                self._probe_step(rt, now)
        elif rt.terminating:  # it never ran (a spec it cannot map, no address): nothing to stop
            self._terminate(rt, now)
            if rt.deleted:
                return
        self._publish(rt)

    def _start(self, rt: PodRuntime, now: float) -> None:
        spec = rt.spec
        assert spec is not None and rt.ip is not None
        if not address_free(rt.ip, spec.port):
            # taken since admission (or before a restart) by a process outside this node: a
            # replica there would fail to bind while the other process answered its probes
            other = self.ips.take(usable=lambda ip: address_free(ip, spec.port))
            if other is None:
                rt.error = f"no free Pod IP in {self.settings.ip_base}.0/24"
                return
            log.warning(
                "pod %s: %s:%d is in use by another process on this machine; the Pod moves to %s",
                rt.key,
                rt.ip,
                spec.port,
                other,
            )
            self.ips.give_back(rt.ip)
            rt.ip = other
        if rt.last_terminated is not None:
            rt.restart_count += 1
        log_path = self.log_dir / f"{rt.namespace}_{rt.name}.log"
        args = (rt.ip, spec.port, spec.served_model_name, spec.profile, rt.warmup_s, self.scale, spec.max_model_len)
        try:
            rt.process = self.spares.take(replica_settings(*args), log_path) or ReplicaProcess(
                serve_command(*args), log_path
            )
        except OSError as exc:
            rt.error = f"cannot start replica: {exc}"
            return
        rt.running_since_ts, rt.run_started_at = rfc3339(), now
        rt.readiness.reset()
        rt.next_probe_at = now + spec.probe.initial_delay_s / self.scale
        rt.probe_future = None

    def _on_exit(self, rt: PodRuntime, now: float) -> None:
        proc = rt.process
        assert proc is not None and rt.spec is not None
        code = proc.exit_code() or 0
        if code < 0:  # killed by a signal: reported as a container runtime does, 128 + signal
            code = 128 - code
        ran_s = (now - rt.run_started_at) * self.scale
        rt.crashes = 0 if ran_s >= BACKOFF_RESET_S else rt.crashes + 1
        rt.last_terminated = Terminated(
            code, "Completed" if code == 0 else "Error", rt.running_since_ts or rt.start_ts, rfc3339()
        )
        self._set_ready(rt, False)
        rt.readiness.reset()
        rt.process, rt.probe_future = None, None
        backoff = crash_backoff_s(rt.crashes - 1)
        rt.start_at = now + backoff / self.scale
        rt.waiting_reason = "CrashLoopBackOff"
        if rt.terminating:
            log.info("pod %s: replica pid %d exited with code %d", rt.key, proc.pid, code)
        else:
            log.info(
                "pod %s: replica pid %d exited with code %d after %.1f s (simulated): %s; restart in %.0f s",
                rt.key,
                proc.pid,
                code,
                ran_s,
                proc.last_line() or "-",
                backoff,
            )

    def _probe_step(self, rt: PodRuntime, now: float) -> None:
        spec = rt.spec
        assert spec is not None
        fut = rt.probe_future
        if fut is not None and fut.done():
            rt.probe_future = None
            if rt.readiness.observe(fut.result(), spec.probe):
                rt.ready_changed_ts = rfc3339()
        if rt.probe_future is None and now >= rt.next_probe_at:
            rt.next_probe_at = now + spec.probe.period_s / self.scale
            url = f"http://{rt.ip}:{spec.probe.port}{spec.probe.path}"
            timeout = max(spec.probe.timeout_s / self.scale, MIN_PROBE_TIMEOUT_WALL_S)
            rt.probe_future = self._probes.submit(_probe, self._http, url, timeout)

    def _set_ready(self, rt: PodRuntime, ready: bool) -> None:
        if rt.readiness.ready != ready:
            rt.readiness.ready = ready
            rt.ready_changed_ts = rfc3339()

    def _begin_termination(self, rt: PodRuntime, pod: dict[str, Any]) -> None:
        """The node saw the deletion: start the preStop hook, bounded by the grace period
        counted from now; ``_terminate`` sends SIGTERM once it is over. No running replica:
        no hook (the Pod is deleted at once)."""
        now = time.monotonic()
        rt.terminating = True
        grace = (pod.get("metadata") or {}).get("deletionGracePeriodSeconds")
        rt.grace_s = float(grace) if grace is not None else (rt.spec.grace_s if rt.spec else 0.0)
        rt.deleted_at = rt.hook_until = now
        if rt.process is None:
            log.info("pod %s: deletion seen, no replica running", rt.key)
            return
        grace_end = now + rt.grace_s / self.scale
        hook = rt.spec.pre_stop if rt.spec is not None else None
        if hook is None or rt.grace_s <= 0:
            what = "no preStop hook"
        elif hook.kind == "sleep":
            what = f"preStop sleep {hook.sleep_s:g} s"
            rt.hook_cut = hook.sleep_s > rt.grace_s
            rt.hook_until = min(grace_end, now + prestop_sleep_wall_s(hook.sleep_s, self.scale))
        elif hook.kind == "http":
            url = hook.url(rt.ip or "127.0.0.1")
            what = f"preStop httpGet {url}"
            rt.hook_until = grace_end
            timeout = max(rt.grace_s / self.scale, MIN_PROBE_TIMEOUT_WALL_S)
            rt.hook_future = self._probes.submit(_hook_get, self._http, url, timeout)
        else:
            what = f"preStop skipped: {hook.what}"
        log.info("pod %s: deletion seen, grace %g s (simulated); %s", rt.key, rt.grace_s, what)

    def _hook_over(self, rt: PodRuntime, now: float) -> bool:
        """Whether the preStop hook is over (done, or cut by the grace period)."""
        fut = rt.hook_future
        if fut is not None and fut.done():
            log.info("pod %s: preStop httpGet %s", rt.key, fut.result())
            rt.hook_future = None
            return True
        if fut is not None and now >= rt.hook_until:
            rt.hook_cut, rt.hook_future = True, None  # the thread ends at its own timeout
        return now >= rt.hook_until and rt.hook_future is None

    def _terminate(self, rt: PodRuntime, now: float) -> None:
        proc = rt.process
        if proc is not None:
            if not rt.sigterm_sent:
                if not self._hook_over(rt, now):
                    return
                proc.signal(signal.SIGTERM)
                rt.sigterm_sent = True
                rt.kill_at = sigkill_at(rt.deleted_at, rt.grace_s, now, self.scale)
                log.info(
                    "pod %s: SIGTERM to replica pid %d%s; killed if still running in %.1f s (simulated)",
                    rt.key,
                    proc.pid,
                    " (preStop cut by the grace period)" if rt.hook_cut else "",
                    (rt.kill_at - now) * self.scale,
                )
            elif now >= rt.kill_at and not rt.killed:
                proc.signal(signal.SIGKILL)
                rt.killed = True
                log.info("pod %s: grace period over, SIGKILL to replica pid %d", rt.key, proc.pid)
            return
        self.api_safe(lambda: self.api.delete_pod_now(rt.namespace, rt.name, rt.uid))
        rt.deleted = True
        self.ips.give_back(rt.ip)
        self._log_transition(rt, "Deleted")

    def _forget(self, rt: PodRuntime, why: str) -> None:
        if rt.process is not None:
            rt.process.signal(signal.SIGKILL)
        if not rt.deleted:
            self.ips.give_back(rt.ip)
            self._log_transition(rt, f"Gone ({why})")

    def _publish(self, rt: PodRuntime) -> None:
        body = pod_status(rt.view())
        if body != rt.last_sent:
            if self.api_safe(lambda: self.api.patch_pod_status(rt.namespace, rt.name, body)):
                rt.last_sent = body
        self._log_transition(rt, rt.describe())

    def _log_transition(self, rt: PodRuntime, label: str) -> None:
        if label == rt.label:
            return
        where = f" ip={rt.ip}:{rt.spec.port}" if rt.ip and rt.spec else ""
        pid = f" pid={rt.process.pid}" if rt.process is not None else ""
        extra = (
            f" model={rt.spec.served_model_name} profile={rt.spec.profile} warmup={rt.warmup_s:.1f}s"
            if rt.spec and not rt.label
            else ""
        )
        log.info(
            "pod %s: %s -> %s%s%s restarts=%d%s", rt.key, rt.label or "new", label, where, pid, rt.restart_count, extra
        )
        rt.label = label

    def api_safe(self, call: Any) -> Any:
        """Run an API call; a NodeApiError gives None (retried on a later pass) and is logged,
        the same message at most once per WARN_EVERY_WALL_S."""
        try:
            return call()
        except NodeApiError as exc:
            self._warn(str(exc))
            return None

    def _warn(self, message: str) -> None:
        now = time.monotonic()
        if now - self._warned.get(message, -WARN_EVERY_WALL_S) >= WARN_EVERY_WALL_S:
            self._warned[message] = now
            if len(self._warned) > 1000:  # bounded: forget the oldest messages
                for old in sorted(self._warned, key=self._warned.__getitem__)[:500]:
                    del self._warned[old]
            log.warning("node %s: %s (retrying)", self.settings.name, message)

    # --- exit -------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every replica (SIGTERM to each process group, SIGKILL after a few seconds) and
        release the probe threads and the temporary log folder. Safe to call twice."""
        procs = [rt.process for rt in self.pods.values() if rt.process is not None]
        for p in procs:
            p.signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT_WALL_S
        for p in procs:
            try:
                p.popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass  # killed below
            p.signal(signal.SIGKILL)
            p.popen.wait()
        for rt in self.pods.values():
            rt.process = None
        self.spares.close()
        self._probes.shutdown(wait=False, cancel_futures=True)
        self._http.close()
        if self._tmp_logs is not None:
            shutil.rmtree(self._tmp_logs, ignore_errors=True)
            self._tmp_logs = None
