"""Planner state persisted in Redis, so a restart or a failed run can hold the last decision.

One JSON string per scaled target under ``ForecasterSettings.state_key``. Every call is bounded
by ``timeout_s``; Redis errors raise SourceUnavailable (the runner logs them and goes on).
"""

from __future__ import annotations

import json

import redis

from forecaster.errors import SourceUnavailable
from forecaster.plan import PlannerState


class RedisStateStore:
    """Load / save the PlannerState of one target (key ``key``) in Redis at ``url``."""

    def __init__(self, url: str, key: str, timeout_s: float = 2.0) -> None:
        self._client = redis.Redis.from_url(
            url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s, decode_responses=True
        )
        self.key = key

    def load(self) -> PlannerState | None:
        """The last saved state, or None when none was saved."""
        try:
            raw = self._client.get(self.key)
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
            recent=tuple((float(t), int(r)) for t, r in data.get("recent", ())),
        )

    def save(self, state: PlannerState) -> None:
        """Persist ``state`` (no expiry: a held decision must survive quiet weeks)."""
        payload = json.dumps(
            {
                "replicas": state.replicas,
                "at": state.at,
                "last_up_at": state.last_up_at,
                "last_down_at": state.last_down_at,
                "recent": [list(x) for x in state.recent],
            }
        )
        try:
            self._client.set(self.key, payload)
        except redis.RedisError as exc:
            raise SourceUnavailable(f"planner state unwritable in Redis: {exc}") from None
