"""The router counters of several POPs, each in its own Redis, summed per minute.

Every POP's router writes its counters into its own Redis (the layout of
``forecaster/sources/redis_counters.py``); the one central vLLM pool serves the demand of all of
them, so the forecaster plans from the sum.

Rules (forecaster/README.md, "Several POPs"):

- A minute is known only when **every** configured POP has a field for it; otherwise it is
  missing (NaN). A POP without a field for a minute was down (or not started yet): adding only
  the POPs that counted would read its outage as a demand drop, and the planner would scale down
  on it. Missing data makes the planner hold instead. Within the known minutes the sum is what
  one Redis would hold if every router wrote into it (a counter one POP never wrote in the span,
  e.g. misses where all were cache hits, is 0 there).
- A POP whose Redis does not answer (connection refused, timeout) or answers with an error
  (WRONGTYPE, ACL NOPERM, ...: named by its class) makes the whole source unavailable
  (SourceUnavailable naming the POP, never its URL): the run holds, it never reads the
  remaining POPs as all the demand.
- The POPs are read concurrently, one thread each. Each POP's Redis calls are bounded by
  ``timeout_s`` (connect and every read, as for one Redis); the whole read is bounded by
  ``deadline_s`` (default ``READ_CALLS * timeout_s``: a POP's read is at most a connect, the
  model list and one pipeline), so a run waits for the slowest POP, never for the sum of all.
  A POP still reading at the deadline counts as unavailable; its thread ends at its own socket
  timeout.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait

import numpy as np

from forecaster.errors import ConfigError, SourceUnavailable
from forecaster.series import Traffic
from forecaster.settings import NO_HOST, POP_NAME, has_host
from forecaster.sources.redis_counters import MinuteCounts, RedisCounterSource
from opskit import RedisURLError
from opskit.redis_client import check_redis_url

# Redis calls of one POP's read: connect, SMEMBERS of the model list, the HGETALL pipeline.
READ_CALLS = 3


def sum_counts(counts: Sequence[MinuteCounts]) -> MinuteCounts:
    """The per-minute sum of several POPs' counts on one grid (pure).

    Every element must cover the same minutes (same ``first``, same length; ValueError
    otherwise). ``sums`` are added; ``seen`` is True only where every POP saw the minute;
    ``present`` is the union (a field one POP never wrote in the span counts 0 there, as it
    would in one shared Redis); ``open`` where any POP is still counting the minute, so the
    sum ends where every POP finished."""
    if not counts:
        raise ValueError("no POP counts to sum")
    first, n = counts[0].first, counts[0].seen.shape[0]
    if any(c.first != first or c.seen.shape[0] != n for c in counts):
        raise ValueError("POP counts on different minute grids")
    fields = counts[0].sums.keys()
    return MinuteCounts(
        first=first,
        sums={field: np.sum([c.sums[field] for c in counts], axis=0) for field in fields},
        seen=np.logical_and.reduce([c.seen for c in counts]),
        present=frozenset().union(*(c.present for c in counts)),
        open=np.logical_or.reduce([np.zeros(n, dtype=bool) if c.open is None else c.open for c in counts]),
    )


class PopsCounterSource:
    """Reads the router counters of every POP in ``pops`` (POP name -> Redis URL, any topology
    of opskit/_redis_url.py) for one model (None: the sum over all models) and sums them per
    minute (module doc). ``fetch(now)`` returns Traffic with step 60 s in requests/s (tokens/s);
    raises SourceUnavailable naming each POP that could not be read within ``timeout_s`` per call
    and ``deadline_s`` in all. The constructor raises ConfigError for an empty mapping, a bad
    POP name, a URL without a host or one no client can be built from (naming the POP, never
    the URL)."""

    step = 60.0

    def __init__(
        self,
        pops: Mapping[str, str],
        model: str | None,
        history_s: float,
        timeout_s: float = 2.0,
        deadline_s: float | None = None,
    ) -> None:
        if not pops:
            raise ConfigError("PROMPTEDGE_FORECASTER_POPS: no POP to read")
        for name, url in pops.items():
            if not POP_NAME.fullmatch(name):
                raise ConfigError(
                    f"PROMPTEDGE_FORECASTER_POPS: bad POP name {name[:40]!r} "
                    "(letters, digits, '.', '_', '-'; at most 63)"
                )
            try:
                check_redis_url(url)
            except RedisURLError as exc:  # the message never repeats the URL
                raise ConfigError(f"PROMPTEDGE_FORECASTER_POPS: POP {name}: {exc}") from None
            if not has_host(url):
                raise ConfigError(f"PROMPTEDGE_FORECASTER_POPS: POP {name}: {NO_HOST}")
        self._sources = {name: RedisCounterSource(url, model, history_s, timeout_s) for name, url in pops.items()}
        self.deadline_s = READ_CALLS * timeout_s if deadline_s is None else deadline_s
        self._what = f"redis:{model or 'all models'}"
        self.name = f"{self._what} at POPs {', '.join(pops)}"

    @property
    def pops(self) -> list[str]:
        """The POP names, in the configured order."""
        return list(self._sources)

    def fetch(self, now: float | None = None) -> Traffic:
        """Every POP's counters for minutes [now - history, now) summed per minute, as rates per
        second (``now``: Unix s, None = wall clock, the same for every POP). The Traffic is named
        as the source, or, when some POPs counted no minute at all (so no minute is known), after
        those POPs only: "redis:all models at POP nyc" (what a no-data hold names)."""
        now = time.time() if now is None else now
        pool = ThreadPoolExecutor(max_workers=len(self._sources), thread_name_prefix="pop")
        try:
            futures = {name: pool.submit(source.read_counts, now) for name, source in self._sources.items()}
            wait(futures.values(), timeout=self.deadline_s)  # one deadline for all POPs
            counts, failed = self._collect(futures)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        if failed:
            raise SourceUnavailable("; ".join(f"POP {name}: {why}" for name, why in failed.items()))
        silent = [name for name, c in counts.items() if not c.seen.any()]
        return sum_counts(list(counts.values())).to_traffic(self._named(silent) if silent else self.name)

    def _named(self, pops: list[str]) -> str:
        return f"{self._what} at POP{'s' if len(pops) > 1 else ''} {', '.join(pops)}"

    def _collect(self, futures: dict[str, Future[MinuteCounts]]) -> tuple[dict[str, MinuteCounts], dict[str, str]]:
        counts: dict[str, MinuteCounts] = {}
        failed: dict[str, str] = {}
        for name, future in futures.items():
            if not future.done():
                failed[name] = f"Redis counters not read within {self.deadline_s:g} s"
                continue
            try:
                counts[name] = future.result()
            except SourceUnavailable as exc:
                failed[name] = str(exc)
        return counts, failed
