"""Shadow verification's calls: one asyncio task per verified hit, started after the client's
answer is sent, at most ``max_inflight`` open per worker (router/caching/shadow.py decides which).

The replica call (``fetch``) and the label (``label``) are given by the caller
(router/forward/service.py, through the Forwarder: the same dispatch, lease and timeouts as a
forwarded request; the cache's ``verify_hit``), so this module holds only the budget, the tasks
and their counting. A call's
failure is counted ``error`` and logged at INFO, never raised: no client waits for it.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from prometheus_client import Counter

from cache import judgeable
from router.caching.shadow import Outcome, decide
from router.errors import APIError

log = logging.getLogger(__name__)

Fetch = Callable[[], Awaitable[dict[str, Any] | None]]
Label = Callable[[dict[str, Any]], Awaitable[bool | None]]


class ShadowVerifier:
    """Starts and counts shadow calls of one worker. ``rate``: share of served semantic hits
    verified (0..1); ``max_inflight``: shadow calls open at once, past which a drawn hit is
    skipped (``skipped_budget``); ``counter``: Prometheus counter labelled (pool, outcome)."""

    def __init__(self, rate: float, max_inflight: int, counter: Counter, rng: random.Random | None = None) -> None:
        self.rate = rate
        self.max_inflight = max_inflight
        self._counter = counter
        self._rng = rng or random.Random()
        self._tasks: set[asyncio.Task[None]] = set()  # strong references: the loop keeps only weak ones

    @property
    def inflight(self) -> int:
        """Shadow calls open now."""
        return len(self._tasks)

    def offer(
        self, pool: str, body: Mapping[str, Any], fetch: Fetch, label: Label, room: Callable[[], bool]
    ) -> str | None:
        """One served semantic hit of ``pool`` on the request ``body``: draw, and when drawn
        either start ``fetch`` (the replica's answer to the same request; raises APIError on
        failure) then ``label`` (its label from that answer; None: no label) in a task, or count
        why not. ``room()``: the pool still takes its lowest class. Returns ``run``, the
        skipping outcome, or None (not drawn). Call from the event loop; never raises."""
        decision = decide(self.rate, self._rng.random(), judgeable(body), len(self._tasks), self.max_inflight)
        if decision is None:
            return None
        if decision == "run":
            if room():
                task = asyncio.get_running_loop().create_task(self._verify(pool, fetch, label))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                return decision
            skipped: Outcome = "skipped_load"
        else:
            skipped = decision
        self._count(pool, skipped)
        return skipped

    async def _verify(self, pool: str, fetch: Fetch, label: Label) -> None:
        try:
            fresh = await fetch()
            right = None if fresh is None else await label(fresh)
        except APIError as exc:  # replica error, timeout, no replica: the hit stays unlabelled
            log.info("shadow verification in pool %s got no answer: %s (%s)", pool, exc.code, exc.message)
            self._count(pool, "error")
            return
        except Exception:  # a bug, in a task no request awaits: logged here or nowhere
            log.exception("shadow verification in pool %s failed", pool)
            self._count(pool, "error")
            return
        self._count(pool, "no_label" if right is None else "right" if right else "wrong")

    def _count(self, pool: str, outcome: Outcome) -> None:
        self._counter.labels(pool, outcome).inc()

    async def drain(self) -> None:
        """Wait until the calls open now have ended (tests, benchmarks)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def aclose(self) -> None:
        """Cancel the open calls and wait for them (their leases are released as they unwind)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
