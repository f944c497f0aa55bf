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
        """Parse one stored member. Raises ValueError naming the field when it is no Observation:
        a missing or mistyped field, ``at`` not finite, a count (desired, ready, spec) not a whole
        number >= 0, lead_s not finite >= 0, capacity_per_replica not finite > 0, demand not
        finite >= 0 (null is unknown). Python's json reads NaN, Infinity and 1e400 (inf), so a
        stored member can hold them: they must not reach the report's arithmetic."""
        try:
            data = json.loads(raw)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            return cls(
                at=_number(data, "at", 0.0, allow_negative=True),
                desired=_count(data, "desired"),
                action=str(data.get("action", "")),
                ready=None if data.get("ready") is None else _count(data, "ready"),
                spec=None if data.get("spec") is None else _count(data, "spec"),
                demand=None if data.get("demand") is None else _number(data, "demand", 0.0),
                lead_s=_number(data, "lead_s", 0.0),
                capacity_per_replica=_number(data, "capacity_per_replica", 0.0, strict=True),
                unit=str(data.get("unit", "requests")),
                note=str(data.get("note", "")),
            )
        except (KeyError, TypeError, OverflowError) as exc:  # a missing field, a list for a number, inf to int
            raise ValueError(f"not an advisory observation: {exc!r}") from None


def _number(data: dict[str, Any], field: str, low: float, strict: bool = False, allow_negative: bool = False) -> float:
    """``data[field]`` as a finite float >= low (> low when strict; any sign when allow_negative)."""
    value = float(data[field])
    if not math.isfinite(value) or (not allow_negative and (value < low or (strict and value == low))):
        bound = "finite" if allow_negative else f"finite and {'>' if strict else '>='} {low:g}"
        raise ValueError(f"{field} must be {bound}, got {value!r}")
    return value


def _count(data: dict[str, Any], field: str) -> int:
    """``data[field]`` as a whole number >= 0 (2.0 is 2; 2.5, -1, NaN and inf are refused)."""
    value = _number(data, field, 0.0)
    if not value.is_integer():
        raise ValueError(f"{field} must be a whole number, got {value!r}")
    return int(value)


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
            except ValueError:  # from_json turns every malformed member into one
                bad += 1
        out.sort(key=lambda o: o.at)
        return out, bad
