"""Planner state persisted in Redis, so a restart or a failed run can hold the last decision.

One JSON string per scaled target under ``ForecasterSettings.state_key``. Every call is bounded
by ``timeout_s``; Redis errors raise SourceUnavailable (the runner logs them and goes on).

Next to it, each cycle publishes its forecast for the router's cache warming (issue 14 item 4)
under ``FORECAST_KEY``; key and document are defined once in opskit, which the router's warming
imports too (the router imports nothing of the forecaster).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import redis

from forecaster.errors import SourceUnavailable
from forecaster.plan import PlannerState, PlanStep, Recommendation
from forecaster.sources.redis_errors import redis_failures
from opskit import FORECAST_KEY
from opskit import forecast_document as shared_forecast_document
from opskit.redis_client import sync_redis

log = logging.getLogger("forecaster")


def forecast_document(
    pool: str, at: float, steps: list[PlanStep], capacity_per_replica: float, replicas: int, unit: str
) -> dict[str, Any]:
    """The published forecast of ``steps`` (pure; the document's fields: opskit's
    ``forecast_document``, which the router's ``read_forecast`` reads back): the mean and the
    upper quantile of each step from its start (Unix s), capacity_per_replica x ``replicas``."""
    return shared_forecast_document(
        pool,
        at,
        capacity_per_replica * replicas,
        [(s.start, s.forecast) for s in steps],
        [(s.start, s.upper) for s in steps],
        unit,
    )


class RedisStateStore:
    """Load / save the PlannerState of one target (key ``key``) in Redis at ``url``."""

    def __init__(self, url: str, key: str, timeout_s: float = 2.0) -> None:
        self._url = url
        self._timeout_s = timeout_s
        self._conn: redis.Redis | None = None
        self.key = key
        # The state this store last read or wrote: a daemon keeps one store for its life
        # (forecaster.live.daemon_job), so a Redis outage does not make it forget its last
        # decision and hold at min replicas.
        self._last: PlannerState | None = None

    def _client(self) -> redis.Redis:
        # one server, Redis Cluster or Sentinel (opskit/_redis_url.py), built on first use inside
        # the callers' error handling (a cluster client connects at once). One key per target,
        # no command touches two, so the key needs no Redis Cluster hash tag.
        if self._conn is None:
            self._conn = sync_redis(
                self._url, socket_connect_timeout=self._timeout_s, socket_timeout=self._timeout_s, decode_responses=True
            )
        return self._conn

    def load(self) -> PlannerState | None:
        """The last saved state, or None when none was saved. While Redis is unreachable: the
        state this store last loaded or saved in this process, else SourceUnavailable."""
        try:
            with redis_failures(SourceUnavailable, "planner state unreadable in Redis"):
                raw = self._client().get(self.key)
        except SourceUnavailable as exc:
            if self._last is None:
                raise
            log.warning(
                "%s; planning on the last state this process read or wrote (decision %d)", exc, self._last.replicas
            )
            return self._last
        if raw is None:
            return None
        self._last = _state(json.loads(raw))
        return self._last

    def publish_forecast(self, document: dict[str, Any], ttl_s: int) -> None:
        """Write ``document`` (``forecast_document``) under its pool's ``FORECAST_KEY`` for
        ``ttl_s`` wall seconds (a few cycles: a forecaster that stopped leaves no stale
        forecast behind). Raises SourceUnavailable."""
        key = FORECAST_KEY.format(pool=document["pool"])
        with redis_failures(SourceUnavailable, "forecast unwritable in Redis"):
            self._client().set(key, json.dumps(document, separators=(",", ":")), ex=max(1, ttl_s))

    def save(self, state: PlannerState) -> None:
        """Persist ``state`` (no expiry: a held decision must survive quiet weeks); kept in
        memory first, so a failed write still leaves it for :meth:`load`."""
        self._last = state
        payload = json.dumps(
            {
                "replicas": state.replicas,
                "at": state.at,
                "last_up_at": state.last_up_at,
                "last_down_at": state.last_down_at,
                "recent": [[r.at, r.replicas, r.base, r.band_until] for r in state.recent],
                # a restarted forecaster resumes the cold-start guard where this one was
                "observed_since": state.observed_since,
            }
        )
        with redis_failures(SourceUnavailable, "planner state unwritable in Redis"):
            self._client().set(self.key, payload)


def _state(data: dict[str, Any]) -> PlannerState:
    """A PlannerState from its saved JSON document (:meth:`RedisStateStore.save`)."""
    return PlannerState(
        replicas=int(data["replicas"]),
        at=float(data["at"]),
        last_up_at=data.get("last_up_at"),
        last_down_at=data.get("last_down_at"),
        recent=tuple(_recommendation(x) for x in data.get("recent", ())),
        observed_since=data.get("observed_since"),
    )


def _recommendation(item: list[Any]) -> Recommendation:
    """[at, replicas, base, band_until] as saved; [at, replicas] as saved before the band was
    told apart (it then stands whole for its window)."""
    at, replicas = float(item[0]), int(item[1])
    if len(item) < 4:
        return Recommendation(at, replicas, replicas)
    return Recommendation(at, replicas, int(item[2]), None if item[3] is None else float(item[3]))
