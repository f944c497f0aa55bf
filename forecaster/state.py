"""Planner state persisted in Redis, so a restart or a failed run can hold the last decision.

One JSON string per scaled target under ``ForecasterSettings.state_key``. Every call is bounded
by ``timeout_s``; Redis errors raise SourceUnavailable (the runner logs them and goes on).

Next to it, each cycle publishes its forecast for the router's cache warming (issue 14 item 4)
under ``FORECAST_KEY`` (``forecast_document`` below is the whole contract: the router reads the
JSON, it imports nothing of the forecaster).
"""

from __future__ import annotations

import json
from typing import Any

import redis

from opskit.redis_client import sync_redis

from forecaster.errors import SourceUnavailable
from forecaster.plan import PlannerState, PlanStep, Recommendation

# The router's warmer reads this key (router/caching/warming.py); pool "*" when the forecast is the sum
# over every pool (no model_name).
FORECAST_KEY = "promptedge:forecaster:forecast:{pool}"
FORECAST_VERSION = 1


def forecast_document(pool: str, at: float, steps: list[PlanStep], capacity_per_replica: float,
                      replicas: int, unit: str) -> dict[str, Any]:
    """The published forecast (pure): ``{"v": 1, "pool", "at" (Unix s, the forecaster's clock),
    "unit" ("requests" or "tokens": demand per second, cache misses when the router counts
    them), "capacity_rps" (capacity_per_replica x decided replicas, same unit), "points":
    [[step start Unix s, mean demand], ...], "upper": [[start, upper quantile], ...]}``."""
    return {
        "v": FORECAST_VERSION,
        "pool": pool,
        "at": at,
        "unit": unit,
        "capacity_rps": capacity_per_replica * replicas,
        "points": [[s.start, s.forecast] for s in steps],
        "upper": [[s.start, s.upper] for s in steps],
    }


class RedisStateStore:
    """Load / save the PlannerState of one target (key ``key``) in Redis at ``url``."""

    def __init__(self, url: str, key: str, timeout_s: float = 2.0) -> None:
        self._url = url
        self._timeout_s = timeout_s
        self._conn: redis.Redis | None = None
        self.key = key

    def _client(self) -> redis.Redis:
        # one server, Redis Cluster or Sentinel (opskit/_redis_url.py), built on first use inside
        # the callers' error handling (a cluster client connects at once). One key per target,
        # no command touches two, so the key needs no Redis Cluster hash tag.
        if self._conn is None:
            self._conn = sync_redis(self._url, socket_connect_timeout=self._timeout_s,
                                    socket_timeout=self._timeout_s, decode_responses=True)
        return self._conn

    def load(self) -> PlannerState | None:
        """The last saved state, or None when none was saved."""
        try:
            raw = self._client().get(self.key)
        except redis.RedisError as exc:
            raise SourceUnavailable(f"planner state unreadable in Redis: {exc}") from None
        if raw is None:
            return None
        data = json.loads(raw)
        return PlannerState(
            replicas=int(data["replicas"]),
            at=float(data["at"]),
            last_up_at=data.get("last_up_at"),
            last_down_at=data.get("last_down_at"),
            recent=tuple(_recommendation(x) for x in data.get("recent", ())),
            observed_since=data.get("observed_since"),
        )

    def publish_forecast(self, document: dict[str, Any], ttl_s: int) -> None:
        """Write ``document`` (``forecast_document``) under its pool's ``FORECAST_KEY`` for
        ``ttl_s`` wall seconds (a few cycles: a forecaster that stopped leaves no stale
        forecast behind). Raises SourceUnavailable."""
        key = FORECAST_KEY.format(pool=document["pool"])
        try:
            self._client().set(key, json.dumps(document, separators=(",", ":")), ex=max(1, ttl_s))
        except redis.RedisError as exc:
            raise SourceUnavailable(f"forecast unwritable in Redis: {exc}") from None

    def save(self, state: PlannerState) -> None:
        """Persist ``state`` (no expiry: a held decision must survive quiet weeks)."""
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
        try:
            self._client().set(self.key, payload)
        except redis.RedisError as exc:
            raise SourceUnavailable(f"planner state unwritable in Redis: {exc}") from None


def _recommendation(item: list[Any]) -> Recommendation:
    """[at, replicas, base, band_until] as saved; [at, replicas] as saved before the band was
    told apart (it then stands whole for its window)."""
    at, replicas = float(item[0]), int(item[1])
    if len(item) < 4:
        return Recommendation(at, replicas, replicas)
    return Recommendation(at, replicas, int(item[2]), None if item[3] is None else float(item[3]))
