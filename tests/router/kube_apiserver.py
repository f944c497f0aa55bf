"""The real kube-apiserver of ``../shared/tools/kube`` (v1.20.2 + etcd) for integration tests.

``with running_apiserver(run_dir, authz="RBAC") as config:`` builds the binaries if needed
(cached by the tools), starts etcd and the apiserver on free ports, yields the kubeconfig as a
dict (``clusters[0].cluster.server`` / ``certificate-authority``, ``users[*].user.token``) and
wipes everything at exit. ``control_plane=True`` also builds and starts the real
kube-controller-manager and kube-scheduler (on free ports, so several clusters can run at
once): Deployments then get ReplicaSets and Pods, Pods are bound to a Node, and EndpointSlices
are published; there is no kubelet (``sim node`` plays one). The kubeconfig's path is
``run_dir / "kubeconfig"`` (what the tools' ``start.sh`` printed). Skips the test when the
tools, openssl or curl are missing; fails it when building or starting fails.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from sim.stack import free_port, port_free

ROOT = Path(__file__).resolve().parents[2]
TOOLS = Path(os.environ.get("PROMPTEDGE_KUBE_TOOLS", ROOT.parent / "shared" / "tools" / "kube"))
BUILD_LOCK = "/tmp/promptedge-kube-build.lock"  # also taken by .ci/run


@contextmanager
def running_apiserver(run_dir: Path, authz: str | None = None, control_plane: bool = False) -> Iterator[dict[str, Any]]:
    """A fresh apiserver whose state lives in run_dir; authz: the tools' AUTHZ mode (None: theirs);
    control_plane: also the controller manager and the scheduler."""
    if not (TOOLS / "start.sh").is_file():
        pytest.skip(f"no kube-apiserver tools at {TOOLS} (set PROMPTEDGE_KUBE_TOOLS)")
    if shutil.which("openssl") is None or shutil.which("curl") is None:
        pytest.skip("kube-apiserver tools need openssl and curl")
    components = "kube-apiserver kube-controller-manager kube-scheduler" if control_plane else "kube-apiserver"
    # build.sh works in one fixed folder (/tmp/kube-build) and unpacks the source tree afresh:
    # two builds at once (two test processes) delete each other's files. One at a time.
    with open(BUILD_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        build = subprocess.run(
            [str(TOOLS / "build.sh")],
            env={**os.environ, "COMPONENTS": components},
            capture_output=True,
            text=True,
            timeout=2400,
        )
    if build.returncode != 0:
        pytest.fail(
            f"{TOOLS}/build.sh failed (rc {build.returncode}): {build.stderr[-2000:]}\nstdout: {build.stdout[-2000:]}"
        )
    etcd = free_port()
    while not all(port_free(p) for p in (etcd + 1, etcd + 2)):  # etcd's peer and metrics ports
        etcd = free_port()
    env = {**os.environ, "RUN": str(run_dir), "API_PORT": str(free_port()), "ETCD_PORT": str(etcd)}
    if authz is not None:
        env["AUTHZ"] = authz
    if control_plane:
        env.update(CONTROL_PLANE="1", CM_PORT=str(free_port()), SCHED_PORT=str(free_port()))
    try:
        start = subprocess.run([str(TOOLS / "start.sh")], env=env, capture_output=True, text=True, timeout=240)
        if start.returncode != 0:
            pytest.fail(f"start.sh failed: {start.stderr[-2000:]}")
        kubeconfig = Path(start.stdout.strip().splitlines()[-1])
        if kubeconfig != run_dir / "kubeconfig":
            (run_dir / "kubeconfig").write_text(kubeconfig.read_text())
        yield yaml.safe_load(kubeconfig.read_text())
    finally:
        subprocess.run([str(TOOLS / "stop.sh"), "--wipe"], env=env, capture_output=True, timeout=60)
