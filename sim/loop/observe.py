"""Samples the Deployment and its Pods from the API while a policy runs (one thread)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError

from sim.loop.measure import ScaleSample
from sim.loop.world import PoolRef


def sample_pool(pool: PoolRef, t_s: float, selector: str) -> ScaleSample:
    """One :class:`ScaleSample`: ``desired`` = ``spec.replicas``; over the Pods matching
    ``selector``: ``ready`` (condition Ready), ``warming`` (bound to a node, not ready, not
    being deleted), ``holding_gpu`` (bound to a node, whatever their state). Raises
    ApiException / urllib3 HTTPError."""
    dep = pool.apps.read_namespaced_deployment(pool.deployment, pool.namespace, _request_timeout=5)
    pods = pool.core.list_namespaced_pod(pool.namespace, label_selector=selector, _request_timeout=5).items
    ready = warming = holding = 0
    for pod in pods:
        if not pod.spec.node_name:
            continue
        holding += 1
        is_ready = any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))
        if is_ready and pod.metadata.deletion_timestamp is None:
            ready += 1
        elif pod.metadata.deletion_timestamp is None:
            warming += 1
    return ScaleSample(t_s, int(dep.spec.replicas or 0), ready, warming, holding)


class Observer:
    """Calls :func:`sample_pool` every ``every_s`` wall seconds in a daemon thread;
    ``clock()`` gives the simulated seconds since the segment start. ``stop()`` returns the
    samples; failed samples are counted in ``errors``."""

    def __init__(self, pool: PoolRef, selector: str, clock: Callable[[], float], every_s: float) -> None:
        self.pool, self.selector, self.clock, self.every_s = pool, selector, clock, every_s
        self.samples: list[ScaleSample] = []
        self.errors: list[str] = []
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
        while not self._stop.is_set():
            tick = time.monotonic()
            try:
                self.samples.append(sample_pool(self.pool, self.clock(), self.selector))
            except (ApiException, HTTPError, OSError) as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}"[:200])
            self._stop.wait(max(0.0, self.every_s - (time.monotonic() - tick)))


def latest(samples: list[ScaleSample]) -> dict[str, Any] | None:
    s = samples[-1] if samples else None
    return None if s is None else {"desired": s.desired, "ready": s.ready, "warming": s.warming}
