"""Samples the Deployment and its Pods from the API, and scrapes each Ready Pod's vLLM
``/metrics``, while a policy runs (one thread)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError

from sim.loop.measure import ScaleSample
from sim.loop.queue_time import METRIC, Scrape, parse_histogram
from sim.loop.world import PoolRef

# Wall seconds per /metrics scrape: a replica that cannot answer within it is counted, not
# waited for, so one stuck Pod does not stretch the sampling period of the others.
SCRAPE_TIMEOUT_S = 1.0
VLLM_PORT = 8000


def read_pool(pool: PoolRef, selector: str) -> tuple[int, list[Any]]:
    """The Deployment's ``spec.replicas`` and the Pods matching ``selector``. Raises
    ApiException / urllib3 HTTPError."""
    dep = pool.apps.read_namespaced_deployment(pool.deployment, pool.namespace, _request_timeout=5)
    pods = pool.core.list_namespaced_pod(pool.namespace, label_selector=selector, _request_timeout=5).items
    return int(dep.spec.replicas or 0), pods


def _is_ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


def count_pods(desired: int, pods: list[Any], t_s: float) -> ScaleSample:
    """One :class:`ScaleSample`: ``ready`` (condition Ready), ``warming`` (bound to a node, not
    ready, not being deleted), ``holding_gpu`` (bound to a node, whatever their state)."""
    ready = warming = holding = 0
    for pod in pods:
        if not pod.spec.node_name:
            continue
        holding += 1
        if _is_ready(pod) and pod.metadata.deletion_timestamp is None:
            ready += 1
        elif pod.metadata.deletion_timestamp is None:
            warming += 1
    return ScaleSample(t_s, desired, ready, warming, holding)


def sample_pool(pool: PoolRef, t_s: float, selector: str) -> ScaleSample:
    """:func:`read_pool` counted by :func:`count_pods`. Raises ApiException / HTTPError."""
    return count_pods(*read_pool(pool, selector), t_s)


def metrics_targets(pods: list[Any]) -> list[tuple[str, str]]:
    """(Pod UID, ``/metrics`` URL) of every Pod whose Ready condition is true (a Pod being
    deleted included: it still finishes its requests) and that has an IP. The port is the
    first container's first ``containerPort``, else vLLM's 8000, as the stand-in node runs it."""
    targets: list[tuple[str, str]] = []
    for pod in pods:
        if not _is_ready(pod) or not pod.status.pod_ip:
            continue
        containers = pod.spec.containers or []
        ports = (containers[0].ports or []) if containers else []
        port = ports[0].container_port if ports else VLLM_PORT
        targets.append((pod.metadata.uid, f"http://{pod.status.pod_ip}:{port}/metrics"))
    return targets


def scrape_queue_time(http: httpx.Client, targets: list[tuple[str, str]], t_s: float) -> tuple[list[Scrape], list[str]]:
    """Each target's ``vllm:request_queue_time_seconds`` at ``t_s``, and one message per target
    that failed (no answer, a non-200, malformed text, no such histogram); never raises."""
    scrapes: list[Scrape] = []
    errors: list[str] = []
    for uid, url in targets:
        try:
            reply = http.get(url, timeout=SCRAPE_TIMEOUT_S)
            reply.raise_for_status()
            hist = parse_histogram(reply.text)
        except (httpx.HTTPError, ValueError) as exc:
            errors.append(f"{url}: {type(exc).__name__}: {exc}"[:200])
            continue
        if hist is None:
            errors.append(f"{url}: no {METRIC}")
        else:
            scrapes.append(Scrape(t_s, uid, hist))
    return scrapes, errors


class Observer:
    """Every ``every_s`` wall seconds in a daemon thread: one :class:`ScaleSample` of the pool
    and one :class:`Scrape` per Ready Pod; ``clock()`` gives the simulated seconds since the
    segment start. ``stop()`` scrapes once more (the requests finished since the last round)
    and returns the samples; ``scrapes`` holds the scrapes. Failures are counted in ``errors``
    (API) and ``scrape_errors`` (``/metrics``)."""

    def __init__(self, pool: PoolRef, selector: str, clock: Callable[[], float], every_s: float) -> None:
        self.pool, self.selector, self.clock, self.every_s = pool, selector, clock, every_s
        self.samples: list[ScaleSample] = []
        self.scrapes: list[Scrape] = []
        self.errors: list[str] = []
        self.scrape_errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="loop-observer", daemon=True)

    def start(self) -> Observer:
        self._thread.start()
        return self

    def stop(self) -> list[ScaleSample]:
        self._stop.set()
        self._thread.join(timeout=10)
        return list(self.samples)

    def _run(self) -> None:
        with httpx.Client() as http:
            while not self._stop.is_set():
                tick = time.monotonic()
                self._round(http, record_sample=True)
                self._stop.wait(max(0.0, self.every_s - (time.monotonic() - tick)))
            self._round(http, record_sample=False)

    def _round(self, http: httpx.Client, record_sample: bool) -> None:
        t_s = self.clock()
        try:
            desired, pods = read_pool(self.pool, self.selector)
        except (ApiException, HTTPError, OSError) as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}"[:200])
            return
        if record_sample:
            self.samples.append(count_pods(desired, pods, t_s))
        # the scrapes' own time: the histograms are read after the API calls above
        scrapes, errors = scrape_queue_time(http, metrics_targets(pods), self.clock())
        self.scrapes += scrapes
        self.scrape_errors += errors


def latest(samples: list[ScaleSample]) -> dict[str, Any] | None:
    s = samples[-1] if samples else None
    return None if s is None else {"desired": s.desired, "ready": s.ready, "warming": s.warming}
