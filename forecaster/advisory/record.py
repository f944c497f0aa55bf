"""What advisory mode records each cycle, kept in Redis for the what-if report.

One sorted set per target, ``promptedge:forecaster:advisory:{namespace}/{deployment}[:model]``,
scored by the cycle's time (Unix s, the forecaster's clock); each member is one JSON object
(:class:`Observation`). Entries older than the retention are trimmed on every write. Every
call is bounded by the store's timeout; Redis errors raise SourceUnavailable.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Any

import redis

from forecaster.errors import SourceUnavailable
from forecaster.sources.redis_errors import redis_failures
from opskit.redis_client import sync_redis

KEY_PREFIX = "promptedge:forecaster:advisory"


@dataclass(frozen=True)
class Observation:
    """One advisory cycle.

    at: Unix s the decision was made for; desired: the forecaster's replicas; action: the
    decision's action (``hold`` when its inputs were missing); ready: the Deployment's Ready
    replicas (``status.readyReplicas``) or None when unknown; spec: its ``spec.replicas`` or
    None; demand: the last complete bucket's demand (demand unit per s) or None; lead_s: the
    lead time the planner used (s); capacity_per_replica: demand unit per s; unit: the demand
    unit; note: why ready/spec are unknown ("" when known)."""

    at: float
    desired: int
    action: str
    ready: int | None
    spec: int | None
    demand: float | None
    lead_s: float
    capacity_per_replica: float
    unit: str
    note: str = ""

    def to_json(self) -> str:
        """Compact JSON (NaN demand written as null)."""
        data = asdict(self)
        if data["demand"] is not None and not math.isfinite(data["demand"]):
            data["demand"] = None
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> Observation:
        """Parse one stored member; raises ValueError (KeyError, TypeError included) when it is no Observation."""
        data: dict[str, Any] = json.loads(raw)
        return cls(
            at=float(data["at"]),
            desired=int(data["desired"]),
            action=str(data.get("action", "")),
            ready=None if data.get("ready") is None else int(data["ready"]),
            spec=None if data.get("spec") is None else int(data["spec"]),
            demand=None if data.get("demand") is None else float(data["demand"]),
            lead_s=float(data["lead_s"]),
            capacity_per_replica=float(data["capacity_per_replica"]),
            unit=str(data.get("unit", "requests")),
            note=str(data.get("note", "")),
        )


def advisory_key(target: str) -> str:
    """The sorted set of ``target`` (``namespace/deployment`` plus ``:model`` when one is named)."""
    return f"{KEY_PREFIX}:{target}"


class AdvisoryLog:
    """The advisory observations of one target in Redis at ``url`` (one server, Cluster or Sentinel)."""

    def __init__(self, url: str, key: str, timeout_s: float = 2.0, retention_s: float = 14 * 86400.0) -> None:
        self._url = url
        self._timeout_s = timeout_s
        self._conn: redis.Redis | None = None
        self.key = key
        self.retention_s = retention_s

    def _client(self) -> redis.Redis:
        if self._conn is None:  # built inside the callers' error handling (a cluster client connects at once)
            self._conn = sync_redis(self._url, socket_connect_timeout=self._timeout_s, socket_timeout=self._timeout_s)
        return self._conn

    def append(self, observation: Observation) -> None:
        """Add one observation and trim those older than the retention. Raises SourceUnavailable."""
        with redis_failures(SourceUnavailable, f"advisory record unwritable in Redis key {self.key}"):
            pipe = self._client().pipeline(transaction=False)
            pipe.zadd(self.key, {observation.to_json(): observation.at})
            pipe.zremrangebyscore(self.key, "-inf", f"({observation.at - self.retention_s}")
            pipe.execute()

    def read(self, since: float, until: float) -> tuple[list[Observation], int]:
        """Observations with since <= at < until, oldest first, and how many stored members
        could not be parsed (skipped). Raises SourceUnavailable."""
        with redis_failures(SourceUnavailable, f"advisory record unreadable in Redis key {self.key}"):
            members = self._client().zrangebyscore(self.key, since, f"({until}")
        out: list[Observation] = []
        bad = 0
        for raw in members:
            try:
                out.append(Observation.from_json(raw))
            except (ValueError, KeyError, TypeError):
                bad += 1
        out.sort(key=lambda o: o.at)
        return out, bad
