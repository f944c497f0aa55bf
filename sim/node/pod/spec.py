"""Pure mapping of a Pod (the API's JSON, camelCase) to what the stand-in node runs for it.

A Pod written for the real ``vllm/vllm-openai`` image is read as vLLM would read it: the
container's ``command`` + ``args`` (Kubernetes ``$(VAR)`` references expanded from the
container's literal ``env`` values; a ``sh -c "..."`` script split as the shell would) give
``--model`` or ``vllm serve MODEL``, ``--served-model-name`` and ``--max-model-len``; the port is
the container's first ``containerPort`` (else ``--port``, else vLLM's 8000). The readiness probe
is the container's ``readinessProbe.httpGet`` (path, port by number or name, period, timeout,
thresholds, initial delay, with Kubernetes' defaults) or, without one, ``GET /health`` on the
port with the same defaults. Annotations ``promptedge.io/sim-profile`` and
``promptedge.io/sim-warmup-s`` choose the GPU profile and the warm-up (see ``warmup``); the
container's ``lifecycle.preStop`` is read by ``prestop``.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from typing import Any

from sim.node.pod.prestop import PreStopHook, pre_stop_hook

PROFILE_ANNOTATION = "promptedge.io/sim-profile"
WARMUP_ANNOTATION = "promptedge.io/sim-warmup-s"
DEFAULT_MODEL = "sim-llama-8b"  # the sim's default when the container names no model
VLLM_DEFAULT_PORT = 8000
DEFAULT_GRACE_S = 30.0  # Kubernetes' default terminationGracePeriodSeconds
_SHELLS = {"sh", "bash", "/bin/sh", "/bin/bash", "/usr/bin/env"}
_VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


class PodSpecError(ValueError):
    """The Pod cannot be run by the stand-in node (no container, no usable port, ...)."""


@dataclass(frozen=True)
class ProbeSpec:
    """A readiness probe: ``GET path`` on the Pod's IP and ``port``; durations in simulated seconds."""

    path: str
    port: int
    period_s: float = 10.0
    timeout_s: float = 1.0
    initial_delay_s: float = 0.0
    success_threshold: int = 1
    failure_threshold: int = 3


@dataclass(frozen=True)
class ReplicaSpec:
    """What one Pod's replica is: the container, the sim ``serve`` flags and the probe."""

    container: str
    image: str
    model: str  # the model path or name (vLLM's --model / positional)
    served_model_name: str  # what clients send as "model"
    max_model_len: str | None  # passed through to `sim serve --max-model-len` (validated there)
    port: int
    profile: str
    warmup: str  # a number of seconds or a distribution name (sim.node.pod.warmup)
    probe: ProbeSpec
    grace_s: float  # simulated seconds from the deletion to SIGKILL (preStop hook included)
    pre_stop: PreStopHook | None = None  # the container's lifecycle.preStop (sim.node.pod.prestop)


def replica_spec(pod: dict[str, Any], default_profile: str, default_warmup: str) -> ReplicaSpec:
    """The replica for ``pod`` (a Pod as JSON). Raises PodSpecError when it has no container,
    a port cannot be resolved or its shell script cannot be split."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    containers = spec.get("containers") or []
    if not containers:
        raise PodSpecError("the Pod has no container")
    c = containers[0]
    tokens = container_tokens(c)
    model = _flag(tokens, "--model") or _positional_model(tokens) or DEFAULT_MODEL
    served = _flag(tokens, "--served-model-name") or model
    port = _container_port(c, tokens)
    annotations = meta.get("annotations") or {}
    grace = meta.get("deletionGracePeriodSeconds")
    if grace is None:
        grace = spec.get("terminationGracePeriodSeconds")
    return ReplicaSpec(
        container=str(c.get("name", "")),
        image=str(c.get("image", "")),
        model=model,
        served_model_name=served,
        max_model_len=_human_int(_flag(tokens, "--max-model-len")),
        port=port,
        profile=str(annotations.get(PROFILE_ANNOTATION) or default_profile),
        warmup=str(annotations.get(WARMUP_ANNOTATION) or default_warmup),
        probe=_probe(c, port),
        grace_s=float(DEFAULT_GRACE_S if grace is None else grace),
        pre_stop=pre_stop_hook(c),
    )


def container_tokens(container: dict[str, Any]) -> list[str]:
    """``command + args`` with ``$(VAR)`` expanded from the container's literal env values;
    a shell's ``-c SCRIPT`` is split into words (no other shell syntax is interpreted).
    Raises PodSpecError for a script that cannot be split (an open quote)."""
    env = {e["name"]: str(e["value"]) for e in container.get("env") or [] if "value" in e and "name" in e}
    raw = [*(container.get("command") or []), *(container.get("args") or [])]
    tokens = [_VAR_REF.sub(lambda m: env.get(m.group(1), m.group(0)), str(t)) for t in raw]
    if tokens and tokens[0] in _SHELLS and "-c" in tokens:
        script = tokens[tokens.index("-c") + 1] if tokens.index("-c") + 1 < len(tokens) else ""
        try:
            return shlex.split(script)
        except ValueError as exc:  # an open quote: the container's shell would fail too
            raise PodSpecError(f"cannot split the container's shell script {script!r}: {exc}") from None
    return tokens


def _flag(tokens: list[str], name: str) -> str | None:
    """The value of ``--name VALUE`` or ``--name=VALUE`` (the last one wins, as argparse)."""
    value = None
    for i, tok in enumerate(tokens):
        if tok == name and i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            value = tokens[i + 1]
        elif tok.startswith(name + "="):
            value = tok[len(name) + 1 :]
    return value


def _positional_model(tokens: list[str]) -> str | None:
    """``vllm serve MODEL ...``: the first word after ``serve`` when it is not a flag."""
    for i, tok in enumerate(tokens[:-1]):
        if tok == "serve" and i > 0 and tokens[i - 1].rsplit("/", 1)[-1] == "vllm":
            nxt = tokens[i + 1]
            return None if nxt.startswith("-") else nxt
    return None


def _human_int(value: str | None) -> str | None:
    """vLLM's human-readable ints: ``32k`` = 32,000, ``32K`` = 32,768 (``m``/``M`` alike); other
    values pass through unchanged for ``sim serve`` to accept or refuse."""
    if value is None:
        return None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmM])", value.strip())
    if not m:
        return value
    number, unit = float(m.group(1)), m.group(2)
    factor = {"k": 1000, "K": 1024, "m": 1_000_000, "M": 1024 * 1024}[unit]
    if not math.isfinite(number * factor):  # hundreds of digits: ``sim serve`` refuses it
        return value
    return str(int(number * factor))


def _container_port(container: dict[str, Any], tokens: list[str]) -> int:
    ports = container.get("ports") or []
    if ports:
        return int(ports[0]["containerPort"])
    flag = _flag(tokens, "--port")
    if flag is not None:
        try:
            return int(flag)
        except ValueError:
            raise PodSpecError(f"--port {flag!r} is not a number") from None
    return VLLM_DEFAULT_PORT


def _resolve_port(container: dict[str, Any], port: Any, default: int) -> int:
    if port is None:
        return default
    if isinstance(port, int) or (isinstance(port, str) and port.isdigit()):
        return int(port)
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return int(p["containerPort"])
    raise PodSpecError(f"readinessProbe port {port!r} names no container port")


def _probe(container: dict[str, Any], port: int) -> ProbeSpec:
    probe = container.get("readinessProbe") or {}
    http = probe.get("httpGet") or {}
    return ProbeSpec(
        path=str(http.get("path") or ("/" if http else "/health")),
        port=_resolve_port(container, http.get("port"), port),
        period_s=float(probe.get("periodSeconds") or 10),
        timeout_s=float(probe.get("timeoutSeconds") or 1),
        initial_delay_s=float(probe.get("initialDelaySeconds") or 0),
        success_threshold=int(probe.get("successThreshold") or 1),
        failure_threshold=int(probe.get("failureThreshold") or 3),
    )
