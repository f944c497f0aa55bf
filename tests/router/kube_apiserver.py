"""The real kube-apiserver of ``../shared/tools/kube`` (v1.20.2 + etcd) for integration tests.

``with running_apiserver(run_dir, authz="RBAC") as config:`` builds the binaries if needed
(cached by the tools), starts etcd and the apiserver on free ports, yields the kubeconfig as a
dict (``clusters[0].cluster.server`` / ``certificate-authority``, ``users[*].user.token``) and
wipes everything at exit. Skips the test when the tools, openssl or curl are missing; fails it
when building or starting fails.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
TOOLS = Path(os.environ.get("PROMPTEDGE_KUBE_TOOLS", ROOT.parent / "shared" / "tools" / "kube"))


@contextmanager
def running_apiserver(run_dir: Path, authz: str | None = None) -> Iterator[dict[str, Any]]:
    """A fresh apiserver whose state lives in run_dir; authz: the tools' AUTHZ mode (None: theirs)."""
    if not (TOOLS / "start.sh").is_file():
        pytest.skip(f"no kube-apiserver tools at {TOOLS} (set PROMPTEDGE_KUBE_TOOLS)")
    if shutil.which("openssl") is None or shutil.which("curl") is None:
        pytest.skip("kube-apiserver tools need openssl and curl")
    build = subprocess.run([str(TOOLS / "build.sh")], capture_output=True, text=True, timeout=1800)
    if build.returncode != 0:
        pytest.fail(f"{TOOLS}/build.sh failed: {build.stderr[-2000:]}")
    etcd = _free_port()
    while not all(_port_free(p) for p in (etcd + 1, etcd + 2)):  # etcd's peer and metrics ports
        etcd = _free_port()
    env = {**os.environ, "RUN": str(run_dir), "API_PORT": str(_free_port()), "ETCD_PORT": str(etcd)}
    if authz is not None:
        env["AUTHZ"] = authz
    try:
        start = subprocess.run([str(TOOLS / "start.sh")], env=env, capture_output=True, text=True, timeout=240)
        if start.returncode != 0:
            pytest.fail(f"start.sh failed: {start.stderr[-2000:]}")
        yield yaml.safe_load(Path(start.stdout.strip().splitlines()[-1]).read_text())
    finally:
        subprocess.run([str(TOOLS / "stop.sh"), "--wipe"], env=env, capture_output=True, timeout=60)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True
