"""The router's per-minute traffic counters in Redis, as Traffic.

Layout (written by the router, defined once in opskit's ``TRAFFIC_*``): hash
``promptedge:traffic:{model}:{day}`` with ``day`` = Unix minute // 1440 and fields
``{minute}:requests``, ``{minute}:misses``, ``{minute}:prompt_tokens``,
``{minute}:completion_tokens``; set ``promptedge:traffic:models``.

The router marks every minute it is up with a ``{minute}:requests`` field, 0 when it saw no
request. So a minute with a field is counted (possibly 0); a minute without any field is
missing (NaN): the router was down, and the planner must not read an outage as a quiet period.
The minute that contains ``now`` is still being counted and is left out.

Whole minutes only (issue 31): each router process also brackets every minute it counts with
``{minute}:open`` (+1 when it starts writing the minute, -1 once the minute ended on its clock
and its last counts are written) and ``{minute}:partial`` (+1 when it counted only part of it:
its first minute after a start, its last before a stop); router/observe/counters.py. A minute
with an ``open`` field is demand only when ``open`` is 0 and there is no ``partial``:

- ``partial`` (a router restarted in it): missing (NaN), never a drop;
- ``open`` > 0: some router is still counting it (flush lag, a router clock behind the
  forecaster's) or was killed in it. At the end of the span such minutes are late, not
  missing: they are cut from the series, which ends at the last minute every router finished
  (so a run just after a minute boundary does not hold); before that they are missing.

A minute with counts but no ``open`` field was written by a router from before the markers (or
``sim``'s history seeding): read as before, counted.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import redis

from forecaster.errors import SourceUnavailable
from forecaster.series import Traffic
from opskit import TRAFFIC_FIELDS as FIELDS
from opskit import TRAFFIC_KEY, TRAFFIC_MARKERS
from opskit import TRAFFIC_MODELS_KEY as MODELS_KEY
from opskit.redis_client import REDIS_ERRORS, sync_redis

MARKERS = TRAFFIC_MARKERS  # the writers' bracket of each minute (module doc)


class RedisCounterSource:
    """Reads ``history_s`` seconds of 1-minute counters before ``now`` for one model (or the sum
    over all models when ``model`` is None). Every Redis call is bounded by ``timeout_s``;
    any Redis error (unreachable, timeout, or a refused command: WRONGTYPE, ACL NOPERM, ...)
    raises SourceUnavailable."""

    step = 60.0

    def __init__(self, url: str, model: str | None, history_s: float, timeout_s: float = 2.0) -> None:
        self._url = url
        self._timeout_s = timeout_s
        self._conn: redis.Redis | None = None
        self._model = model
        self._history_s = history_s
        self.name = f"redis:{model or 'all models'}"

    def _client(self) -> redis.Redis:
        # one server, Redis Cluster or Sentinel (opskit/_redis_url.py), built on first use inside
        # fetch's error handling (a cluster client connects at once); the read is a plain
        # pipeline of one-key reads, which a cluster client splits by node (no hash tag needed)
        if self._conn is None:
            self._conn = sync_redis(
                self._url, socket_connect_timeout=self._timeout_s, socket_timeout=self._timeout_s, decode_responses=True
            )
        return self._conn

    def fetch(self, now: float | None = None) -> Traffic:
        """Counters for minutes [now - history, now) as rates per second (Traffic, step 60 s)."""
        return self.read_counts(now).to_traffic(self.name)

    def read_counts(self, now: float | None = None) -> MinuteCounts:
        """The raw counts of minutes [now - history, now) (``now``: Unix s, None = wall clock),
        summed over the models read; raises SourceUnavailable on any Redis error, naming its
        class (redis-py's messages name the host and port or the command, never the password)."""
        now = time.time() if now is None else now
        last = math.floor(now / 60) - 1  # the current minute is incomplete
        first = last - math.ceil(self._history_s / 60) + 1
        try:
            client = self._client()
            models = [self._model] if self._model else sorted(client.smembers(MODELS_KEY))
            pipe = client.pipeline(transaction=False)
            for model in models:
                for day in range(first // 1440, last // 1440 + 1):
                    pipe.hgetall(TRAFFIC_KEY.format(model=model, day=day))
            hashes = pipe.execute()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise SourceUnavailable(f"Redis counters unreachable: {exc}") from None
        except REDIS_ERRORS as exc:  # Redis answered with an error: unreadable data is missing data, a hold
            raise SourceUnavailable(f"Redis counters not readable: {type(exc).__name__}: {str(exc)[:200]}") from None
        return parse_counts(hashes, first, last - first + 1)


def parse_counts(hashes: list[dict[str, str]], first: int, n: int) -> MinuteCounts:
    """The counts of minutes ``first`` .. ``first + n - 1`` (Unix minutes) from counter hashes
    (field -> value, as HGETALL returns them), summed over the hashes; which minutes are demand,
    missing or still open: module doc (pure)."""
    sums = {field: np.zeros(n) for field in FIELDS}
    marks = {field: np.zeros(n) for field in MARKERS}
    marked = np.zeros(n, dtype=bool)
    written = np.zeros(n, dtype=bool)
    present: set[str] = set()
    for fields in hashes:
        for key, value in fields.items():
            minute_s, _, field = key.partition(":")
            if not minute_s.isdigit():
                continue
            idx = int(minute_s) - first
            if not 0 <= idx < n:
                continue
            if field in sums:
                sums[field][idx] += float(value)
                written[idx] = True
                present.add(field)
            elif field in marks:
                marks[field][idx] += float(value)
                marked[idx] |= field == "open"
    still_open = marked & (marks["open"] > 0)
    whole = ~marked | ((marks["open"] == 0) & (marks["partial"] == 0))
    return MinuteCounts(first, sums, written & whole, frozenset(present), still_open)


@dataclass(frozen=True)
class MinuteCounts:
    """Raw counts per Unix minute, as the routers wrote them.

    first: Unix minute (Unix s // 60) of index 0; sums: field (``FIELDS``) -> counts per minute,
    shape (n,) each (not rates); seen: shape (n,), True where the minute is demand (counted
    whole, possibly 0: module doc); present: the fields written at least once in the span;
    open: shape (n,), True where some router is still counting the minute (None: none is).
    Several sources' counts stay on one grid (``forecaster.sources.pops.sum_counts``); the
    open minutes at the end are cut only by ``to_traffic``.
    """

    first: int
    sums: dict[str, np.ndarray]
    seen: np.ndarray
    present: frozenset[str]
    open: np.ndarray | None = None

    def settled(self) -> int:
        """How many minutes from ``first`` are settled: all but the run of open ones at the end."""
        n = self.seen.shape[0]
        if self.open is None:
            return n
        closed = np.flatnonzero(~self.open)
        return int(closed[-1]) + 1 if closed.size else 0

    def to_traffic(self, name: str) -> Traffic:
        """Rates per second (step 60 s) of the settled minutes (``settled``), NaN where not
        ``seen``; a counter never written in the span (no token counts) is None."""
        n = self.settled()
        seen = self.seen[:n]
        rates = {field: values[:n] / 60.0 for field, values in self.sums.items()}
        for values in rates.values():
            values[~seen] = np.nan
        present = self.present
        return Traffic(
            start=self.first * 60.0,
            step=60.0,
            requests=rates["requests"],
            misses=rates["misses"] if "misses" in present else None,
            tokens=(
                rates["prompt_tokens"] + rates["completion_tokens"]
                if present & {"prompt_tokens", "completion_tokens"}
                else None
            ),
            name=name,
        )
