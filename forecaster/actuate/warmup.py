"""Warm-up (lead time) of a replica, measured from the Deployment's pods when it can be.

Warm-up of one pod = its Ready condition's lastTransitionTime minus its creationTimestamp: the
time from "the scale went up" to "the replica takes traffic", including scheduling, image pull
and model load. Pods whose containers restarted are skipped, because a restart moves the Ready
time and would overstate warm-up; so are pods annotated ``promptedge.io/warmup-sample:
"false"`` (their start was no warm-up). With no usable pod the setting ``warmup_s`` is the lead time.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from kubernetes import client as k8s

from forecaster.actuate.errors import KubeApiError
from forecaster.actuate.kube import KubeScaleAPI, PodTimes, new_api_client
from forecaster.actuate.settings import ActuatorSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Warmup:
    """Lead time for the planner: ``seconds``; ``source`` is ``pods`` (measured over ``samples`` pods) or ``setting``; ``note`` says why."""

    seconds: float
    source: Literal["pods", "setting"]
    samples: int
    note: str


def warmup_from_pods(pods: Sequence[PodTimes], quantile: float) -> tuple[float, int] | None:
    """Nearest-rank ``quantile`` of creation->Ready seconds over pods that became Ready without restarts.

    Returns (seconds, number of pods used), or None when no pod qualifies. With few pods a high
    quantile is the slowest pod, which is the safe side for a lead time.
    """
    samples = sorted(
        (pod.ready_at - pod.created).total_seconds()
        for pod in pods
        if pod.sample and pod.ready_at is not None and pod.restarts == 0 and pod.ready_at >= pod.created
    )
    if not samples:
        return None
    rank = max(1, math.ceil(quantile * len(samples)))
    return samples[rank - 1], len(samples)


def measure_warmup(settings: ActuatorSettings, api_client: k8s.ApiClient | None = None) -> Warmup:
    """Lead time for the planner, in seconds: measured from the configured Deployment's pods, else ``settings.warmup_s``.

    Reads the scale subresource (for the pod selector) and lists pods: RBAC ``get`` on
    ``deployments/scale`` and ``list`` on ``pods``. When those calls fail the setting is used and
    a warning names the failure; the measurement never fails a run.
    """
    fallback = settings.warmup_s
    if not settings.deployment:
        return Warmup(fallback, "setting", 0, "no deployment configured")
    try:
        if api_client is not None:
            pods = _ready_times(api_client, settings)
        else:  # our own client: closed again, so a daemon calling this every run leaks no pools
            with new_api_client(settings) as own_client:
                pods = _ready_times(own_client, settings)
    except KubeApiError as exc:
        log.warning("warm-up not measured, using PROMPTEDGE_ACTUATOR_WARMUP_S=%s: %s", fallback, exc)
        return Warmup(fallback, "setting", 0, f"pods unreadable: {exc}")
    if isinstance(pods, str):
        return Warmup(fallback, "setting", 0, pods)
    selector, times = pods
    measured = warmup_from_pods(times, settings.warmup_quantile)
    if measured is None:
        return Warmup(fallback, "setting", 0, f"no Ready pod without restarts under {selector}")
    seconds, used = measured
    return Warmup(seconds, "pods", used, f"P{settings.warmup_quantile * 100:g} of {used} pods under {selector}")


def _ready_times(api_client: k8s.ApiClient, settings: ActuatorSettings) -> tuple[str, list[PodTimes]] | str:
    """(pod selector, pod times) of the configured Deployment, or why there are none."""
    assert settings.deployment, "measure_warmup checks settings.deployment first"
    api = KubeScaleAPI(api_client, settings.namespace, settings.deployment, settings.request_timeout_s)
    selector = api.read_scale().selector
    if not selector:
        return f"{settings.target} reports no pod selector"
    return selector, api.list_pod_times(selector)
