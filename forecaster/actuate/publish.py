"""Desired replicas for KEDA or an HPA: a Redis record and the small HTTP endpoint that serves it.

The forecaster (cron or daemon) writes its latest decision to Redis; the endpoint reads it on
every poll, so the two can be separate processes. The endpoint keeps serving the last value when
the forecaster goes quiet (hold, never drop to a minimum) and says how old it is.

Redis key ``promptedge:forecaster:desired:{namespace}:{deployment}`` (hash: ``replicas``,
``reason``, ``decided_at`` = Unix seconds), no TTL.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import redis
import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from forecaster.actuate.errors import PublishUnavailable
from forecaster.actuate.settings import ActuatorSettings
from forecaster.sources.redis_errors import redis_failures
from opskit.redis_client import sync_redis

KEY_PREFIX = "promptedge:forecaster:desired"


@dataclass(frozen=True)
class Published:
    """A published decision: ``replicas``, its ``reason``, ``decided_at`` (Unix seconds, UTC)."""

    replicas: int
    reason: str
    decided_at: float


class DesiredStore:
    """The Redis record of one Deployment's published desired replicas; raises PublishUnavailable.

    client: a redis client, or a function that makes one (called on first use, inside the error
    handling: a Redis Cluster client connects as it is made). The key is one hash: no command
    touches two keys, so it needs no Redis Cluster hash tag."""

    def __init__(self, client: redis.Redis | Callable[[], redis.Redis], namespace: str, deployment: str) -> None:
        self._connect = client if callable(client) and not isinstance(client, redis.Redis) else None
        self._conn = None if self._connect is not None else client
        self.namespace = namespace
        self.deployment = deployment
        self.key = f"{KEY_PREFIX}:{namespace}:{deployment}"

    @property
    def _client(self) -> redis.Redis:
        if self._conn is None:
            assert self._connect is not None
            self._conn = self._connect()
        return self._conn  # type: ignore[return-value]

    @classmethod
    def from_settings(cls, settings: ActuatorSettings) -> DesiredStore:
        """Store on ``settings.redis_url`` (one server, Redis Cluster or Sentinel: opskit/_redis_url.py)
        with bounded socket timeouts (``request_timeout_s``)."""

        def connect() -> redis.Redis:
            return sync_redis(
                settings.redis_url,
                socket_timeout=settings.request_timeout_s,
                socket_connect_timeout=settings.request_timeout_s,
            )

        return cls(connect, settings.namespace, settings.deployment or "-")

    def publish(self, replicas: int, reason: str, decided_at: datetime) -> None:
        """Overwrite the record with a new decision."""
        mapping = {"replicas": replicas, "reason": reason, "decided_at": decided_at.timestamp()}
        with redis_failures(PublishUnavailable, f"cannot publish desired replicas to Redis key {self.key}"):
            self._client.hset(self.key, mapping=mapping)

    def read(self) -> Published | None:
        """The last published decision, or None when nothing was ever published."""
        with redis_failures(PublishUnavailable, f"cannot read Redis key {self.key}"):
            fields = self._client.hgetall(self.key)
        if not fields:
            return None
        return Published(
            replicas=int(fields[b"replicas"]),
            reason=fields[b"reason"].decode(),
            decided_at=float(fields[b"decided_at"]),
        )


class _DesiredCollector(Collector):
    """Prometheus gauges read from the store at scrape time (absent until something is published)."""

    def __init__(self, store: DesiredStore) -> None:
        self._store = store

    def collect(self) -> Iterator[GaugeMetricFamily]:
        published = self._store.read()
        if published is None:
            return
        labels = ["namespace", "deployment"]
        values = [self._store.namespace, self._store.deployment]
        replicas = GaugeMetricFamily(
            "promptedge_desired_replicas", "Replicas the forecaster wants (for an HPA external metric)", labels=labels
        )
        replicas.add_metric(values, published.replicas)
        age = GaugeMetricFamily(
            "promptedge_desired_age_seconds", "Seconds since the forecaster last published a decision", labels=labels
        )
        age.add_metric(values, max(0.0, time.time() - published.decided_at))
        yield replicas
        yield age


def _error(status: int, message: str, code: str) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": "service_unavailable", "param": None, "code": code}},
        status_code=status,
    )


def create_app(settings: ActuatorSettings | None = None, store: DesiredStore | None = None) -> FastAPI:
    """The endpoint: ``GET /desired`` (JSON for KEDA's metrics-api scaler, ``valueLocation: desiredReplicas``),
    ``GET /metrics`` (Prometheus gauges), ``GET /health``.

    ``/desired`` answers 503 with an error JSON when nothing was published yet or Redis is
    unreachable, so KEDA counts a scaler failure (and applies its ``fallback``) instead of reading 0.
    """
    settings = settings or ActuatorSettings()
    store = store or DesiredStore.from_settings(settings)
    registry = CollectorRegistry()
    registry.register(_DesiredCollector(store))
    app = FastAPI(title="PromptEdge desired replicas")

    @app.get("/desired")
    def desired() -> Response:
        try:
            published = store.read()
        except PublishUnavailable as exc:
            return _error(503, str(exc), "store_unavailable")
        if published is None:
            return _error(503, f"no decision published yet for {store.namespace}/{store.deployment}", "not_published")
        age = max(0.0, time.time() - published.decided_at)
        return JSONResponse(
            {
                "desiredReplicas": published.replicas,
                "reason": published.reason,
                "decidedAt": datetime.fromtimestamp(published.decided_at, UTC).isoformat(),
                "ageSeconds": round(age, 3),
                "stale": age > settings.stale_after_s,
                "target": f"{store.namespace}/{store.deployment}",
            }
        )

    @app.get("/metrics")
    def metrics() -> Response:
        try:
            body = generate_latest(registry)
        except PublishUnavailable as exc:
            return _error(503, str(exc), "store_unavailable")
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    return app


def serve_desired(settings: ActuatorSettings | None = None) -> None:
    """Run the endpoint on ``publish_host:publish_port`` until interrupted (blocking).

    uvicorn installs no logging of its own (``log_config=None``): its start-up, error and
    access lines go to the process's root logger, which ``python -m forecaster desired`` sets
    to the services' one format (opskit.configure)."""
    settings = settings or ActuatorSettings()
    uvicorn.run(
        create_app(settings), host=settings.publish_host, port=settings.publish_port, log_config=None, log_level="info"
    )
