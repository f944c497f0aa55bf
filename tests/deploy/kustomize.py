"""Rendering deploy/ with kustomize (``kubectl kustomize``) for the deploy tests.

The overlays use kustomize v5 features (``labels``, components, replacements with
``options.create``), so a kubectl whose built-in kustomize is older than v5 (kubectl < 1.27,
e.g. Debian bookworm's kubernetes-client 1.20) counts as missing: the tests skip, saying why.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
OVERLAYS = sorted(p.parent for p in (DEPLOY / "overlays").glob("*/kustomization.yaml"))
MIN_KUSTOMIZE_MAJOR = 5


@functools.cache
def kubectl() -> str | None:
    """Path of a kubectl whose built-in kustomize is v5 or later, else None (see skip_reason)."""
    path = shutil.which("kubectl")
    if path is None:
        return None
    return path if _kustomize_major(path) >= MIN_KUSTOMIZE_MAJOR else None


def _kustomize_major(path: str) -> int:
    out = subprocess.run(
        [path, "version", "--client", "-o", "json"], capture_output=True, text=True, timeout=30, check=False
    ).stdout
    try:
        version = json.loads(out).get("kustomizeVersion", "")
    except json.JSONDecodeError:
        return 0
    match = re.match(r"v(\d+)", version)
    return int(match.group(1)) if match else 0


def skip_reason() -> str:
    """Why the render tests skip when :func:`kubectl` is None."""
    if shutil.which("kubectl") is None:
        return "no kubectl on PATH (install kubectl >= 1.27: its built-in kustomize v5 renders deploy/)"
    return "kubectl's built-in kustomize is older than v5 (kubectl < 1.27): it cannot render deploy/'s overlays"


needs_kustomize = pytest.mark.skipif(kubectl() is None, reason=skip_reason())


def render(directory: Path) -> list[dict[str, Any]]:
    """Objects of ``kubectl kustomize directory``; raises AssertionError with kustomize's message."""
    done = subprocess.run(
        [kubectl() or "kubectl", "kustomize", str(directory)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, f"kubectl kustomize {directory} failed: {done.stderr.strip()}"
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@functools.cache
def rendered(name: str) -> tuple[dict[str, Any], ...]:
    """The objects of ``deploy/overlays/<name>``, rendered once per test session (read-only)."""
    return tuple(render(DEPLOY / "overlays" / name))


def one(objects: tuple[dict[str, Any], ...] | list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """The object of ``kind`` whose name is ``name`` (or, for generated objects, starts with
    ``name-`` followed by kustomize's hash); fails unless exactly one matches."""
    found = [
        o
        for o in objects
        if o["kind"] == kind and re.fullmatch(re.escape(name) + r"(-[a-z0-9]{10})?", o["metadata"]["name"])
    ]
    assert len(found) == 1, f"{len(found)} objects {kind}/{name}"
    return found[0]
