"""The loop's world: a real control plane (../shared/tools/kube, CONTROL_PLANE=1) on free
ports, the pool's manifests applied through the API, and the Deployment read and scaled.

Everything goes through the official ``kubernetes`` client with the admin kubeconfig that
``start.sh`` writes; ``stop()`` runs ``stop.sh --wipe`` (idempotent), also on error.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import utils as k8s_utils
from kubernetes.client.rest import ApiException

from sim.stack.processes import free_port, port_free

START_TIMEOUT_S = 240.0
START_ATTEMPTS = 2


class WorldError(RuntimeError):
    """The control plane did not start, or a manifest was refused."""


class ToolsMissing(WorldError):
    """The Kubernetes tools are not where the loop looks: raised before anything starts (so
    there are no logs to point at)."""


def require_tools(tools: Path) -> None:
    """Raise ToolsMissing naming ``tools`` unless it holds ../shared/tools/kube's start.sh."""
    if not (tools / "start.sh").is_file():
        raise ToolsMissing(f"no Kubernetes tools at {tools} (set PROMPTEDGE_KUBE_TOOLS)")


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler from ``tools``
    (start.sh / stop.sh), state in ``run_dir``. Context manager; ``kubeconfig`` after start."""

    def __init__(self, tools: Path, run_dir: Path, nice: int = 0) -> None:
        self.tools, self.run_dir = tools, run_dir.resolve()  # start.sh writes absolute paths from it
        self.nice = nice  # > 0: etcd and the control plane run at this lower CPU priority
        self.kubeconfig: Path | None = None
        self._env: dict[str, str] | None = None

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self, attempts: int = START_ATTEMPTS) -> Path:
        """Start it (a failed start is retried on fresh ports up to ``attempts`` times in all:
        on a loaded machine the controller manager can miss start.sh's 60 s health wait);
        returns the kubeconfig path. Raises WorldError with start.sh's stderr and log tails."""
        require_tools(self.tools)
        for attempt in range(1, attempts + 1):
            try:
                return self._start_once()
            except WorldError:
                if attempt == attempts:
                    raise
        raise AssertionError("unreachable")

    def _log_tails(self) -> str:
        tails = []
        for log in sorted(self.run_dir.glob("kube-*.log")):
            lines = log.read_text(errors="replace").splitlines()[-5:]
            tails.append(f"--- {log.name}\n" + "\n".join(lines))
        return "\n".join(tails)

    def _start_once(self) -> Path:
        etcd = free_port()
        while not all(port_free(p) for p in (etcd + 1, etcd + 2)):
            etcd = free_port()
        self._env = {
            **os.environ,
            "RUN": str(self.run_dir),
            "ETCD_PORT": str(etcd),
            "API_PORT": str(free_port()),
            "CONTROL_PLANE": "1",
            "CM_PORT": str(free_port()),
            "SCHED_PORT": str(free_port()),
        }
        try:
            prefix = ["nice", "-n", str(self.nice)] if self.nice else []
            done = subprocess.run(
                [*prefix, str(self.tools / "start.sh")],
                env=self._env,
                capture_output=True,
                text=True,
                timeout=START_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            self.stop()
            raise WorldError(f"start.sh did not finish in {START_TIMEOUT_S:.0f} s") from None
        except BaseException:
            # an interrupt (Ctrl-C, SIGTERM) kills start.sh, not the servers it started in the
            # background, and __exit__ never runs for a failed __enter__
            self.stop()
            raise
        if done.returncode != 0:
            tails = self._log_tails()
            self.stop()
            raise WorldError(f"start.sh failed ({done.returncode}): {done.stderr[-1500:]}\n{tails}")
        self.kubeconfig = Path(done.stdout.strip().splitlines()[-1])
        return self.kubeconfig

    def stop(self) -> None:
        """Stop every component and remove the run folder; safe to call twice."""
        if self._env is None:
            return
        env, self._env = self._env, None
        subprocess.run([str(self.tools / "stop.sh"), "--wipe"], env=env, capture_output=True, timeout=60)


@dataclass(frozen=True)
class PoolRef:
    """The Deployment the policies scale and the API clients to reach it."""

    namespace: str
    deployment: str
    apps: k8s.AppsV1Api
    core: k8s.CoreV1Api


def connect(kubeconfig: Path, namespace: str, deployment: str) -> PoolRef:
    """API clients from the kubeconfig (context ``local``: admin)."""
    api = k8s_config.new_client_from_config(config_file=str(kubeconfig), context="local")
    return PoolRef(namespace, deployment, k8s.AppsV1Api(api), k8s.CoreV1Api(api))


def apply_manifest(
    pool: PoolRef, manifest: Path, replicas: int | None = None, annotations: dict[str, str] | None = None
) -> list[str]:
    """Create every object of the YAML file (as ``kubectl create -f`` would); returns
    ``Kind/name`` of each. The pool's Deployment gets ``replicas`` and the pod-template
    ``annotations`` set before it is created (so no first rollout of the file's values).
    Raises WorldError naming a refused object."""
    created = []
    docs = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    for doc in docs:
        if doc.get("kind") == "Deployment" and doc["metadata"].get("name") == pool.deployment:
            if replicas is not None:
                doc["spec"]["replicas"] = replicas
            template_meta = doc["spec"]["template"].setdefault("metadata", {})
            template_meta.setdefault("annotations", {}).update(annotations or {})
        try:
            k8s_utils.create_from_dict(pool.apps.api_client, doc)
        except k8s_utils.FailToCreateError as exc:
            raise WorldError(
                f"{manifest}: {doc.get('kind')}/{doc['metadata'].get('name')} refused: "
                f"{'; '.join(str(e.reason) for e in exc.api_exceptions)}"
            ) from None
        created.append(f"{doc.get('kind')}/{doc['metadata'].get('name')}")
    return created


def scale(pool: PoolRef, replicas: int) -> None:
    """Write ``spec.replicas`` through the scale subresource."""
    pool.apps.patch_namespaced_deployment_scale(pool.deployment, pool.namespace, {"spec": {"replicas": replicas}})


def wait_ready(pool: PoolRef, replicas: int, timeout_s: float) -> None:
    """Until the Deployment reports ``replicas`` ready (current generation observed).
    Raises WorldError with the Pods' phases on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            dep = pool.apps.read_namespaced_deployment(pool.deployment, pool.namespace)
            if (
                (dep.status.observed_generation or 0) >= (dep.metadata.generation or 0)
                and (dep.status.ready_replicas or 0) == replicas
                and (dep.status.replicas or 0) == replicas
            ):
                return
        except ApiException:
            pass
        time.sleep(0.5)
    raise WorldError(f"{pool.deployment}: not {replicas} ready after {timeout_s:.0f} s; pods: {pod_phases(pool)}")


WARMUP_SAMPLE_ANNOTATION = "promptedge.io/warmup-sample"  # read by the forecaster's warm-up measurement


def start_warm(pool: PoolRef, selector: str, replicas: int, annotation: str, timeout_s: float) -> list[str]:
    """Annotate the pool's first ``replicas`` Pods (label ``selector``) with a warm-up of 0 s
    (``annotation``): they stand for replicas that were serving before the segment begins, so
    the run does not spend a warm-up of wall time on them, and with ``promptedge.io/warmup-sample:
    "false"``, so the forecaster does not take their start for a warm-up. Pods created later keep the
    template's warm-up. Call before the node starts (it reads the annotation when it starts a
    replica). Returns the Pods' names; raises WorldError when they do not appear in
    ``timeout_s`` wall seconds."""
    deadline = time.monotonic() + timeout_s
    while True:
        pods = pool.core.list_namespaced_pod(pool.namespace, label_selector=selector).items
        if len(pods) >= replicas:
            break
        if time.monotonic() > deadline:
            raise WorldError(f"{pool.deployment}: {len(pods)} of {replicas} Pods after {timeout_s:.0f} s")
        time.sleep(0.2)
    names = sorted(p.metadata.name for p in pods)[:replicas]
    # Their start is no warm-up: the forecaster must not measure its lead time on them
    # (forecaster/actuate/kube.py WARMUP_SAMPLE_ANNOTATION; measured, they gave a lead time of
    # under a minute against the template's 2-minute warm-up, and the step came before Ready).
    marks = {annotation: "0", WARMUP_SAMPLE_ANNOTATION: "false"}
    for name in names:
        pool.core.patch_namespaced_pod(name, pool.namespace, {"metadata": {"annotations": marks}})
    return names


def pod_phases(pool: PoolRef) -> dict[str, Any]:
    """Pod name -> (phase, ready, node) for error messages."""
    try:
        pods = pool.core.list_namespaced_pod(pool.namespace).items
    except ApiException as exc:
        return {"error": f"{exc.status} {exc.reason}"}
    return {p.metadata.name: (p.status.phase, _ready(p), p.spec.node_name) for p in pods}


def _ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))
