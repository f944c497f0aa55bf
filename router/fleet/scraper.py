"""Background polling of replicas: ``/metrics`` (load signals) and ``/health`` (probes).

Runs as two asyncio tasks in the app's lifespan. A failed scrape leaves the last snapshot in
place; its age then grows until dispatch distrusts it (``stale_after_s``). The first round of
both runs before the router takes traffic, so ready replicas are known at start.
"""

from __future__ import annotations

import asyncio
import logging
import time

import httpx

from router.dispatch.signals import Signals, parse_metrics
from router.fleet.replicas import Pools, Replica

log = logging.getLogger("router.scraper")


class Scraper:
    """Polls every replica's metrics every ``scrape_interval_s`` and health every ``health_interval_s``."""

    def __init__(
        self, pools: Pools, client: httpx.AsyncClient, scrape_interval_s: float, health_interval_s: float
    ) -> None:
        self.pools = pools
        self.client = client
        self.scrape_interval_s = scrape_interval_s
        self.health_interval_s = health_interval_s
        self.scrapes = 0
        self.scrape_errors = 0
        self._stuck: set[str] = set()  # replicas logged as stuck (router/fleet/progress.py)
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Run one round of probes and scrapes, then keep polling in the background."""
        await self.probe_all()
        await self.scrape_all()
        self._tasks = [
            asyncio.create_task(self._every(self.scrape_interval_s, self.scrape_all)),
            asyncio.create_task(self._every(self.health_interval_s, self.probe_all)),
        ]

    async def stop(self) -> None:
        """Cancel the polling tasks and wait for them."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _every(self, interval: float, job) -> None:  # type: ignore[no-untyped-def]
        task = asyncio.current_task()
        while True:
            await asyncio.sleep(interval)
            await job()
            # a library that swallows a cancel (redis-py did, cache/semantic/cache.py) must not keep
            # the loop going: stop() awaits it
            if task is not None and task.cancelling():
                raise asyncio.CancelledError

    async def scrape_all(self) -> None:
        """Scrape every replica once, concurrently."""
        await asyncio.gather(*(self._scrape(r) for r in self.pools.all()))

    async def probe_all(self) -> None:
        """Probe every replica's ``/health`` once, concurrently; log each replica that became
        stuck or progresses again since the last round."""
        replicas = self.pools.all()
        await asyncio.gather(*(self._probe(r) for r in replicas))
        now = time.monotonic()
        for replica in replicas:
            self._log_progress(replica, now)

    def _log_progress(self, replica: Replica, now: float) -> None:
        # /health says nothing of a hung engine: the operator learns from here why it is out
        progress, url = replica.health.progress, replica.url
        if progress.out(now) and url not in self._stuck:
            self._stuck.add(url)
            quiet = progress.quiet_s(now)
            log.warning(
                "replica %s of pool %s is stuck: %d requests open, no progress for %s s "
                "(stuck_after_s %s); out of rotation until it progresses",
                url,
                replica.spec.model,
                replica.inflight,
                "?" if quiet is None else f"{quiet:.1f}",
                progress.stuck_after_s,
            )
        elif url in self._stuck and not progress.out(now):
            self._stuck.discard(url)
            log.info("replica %s of pool %s progresses again: back in rotation", url, replica.spec.model)

    async def _scrape(self, replica: Replica) -> None:
        if replica.spec.metrics_path is None:
            return
        started = time.monotonic()
        try:
            signals = await self._fetch(replica.url + replica.spec.metrics_path)
            if replica.spec.gpu_metrics_url:
                signals = signals.merged(await self._fetch(replica.spec.gpu_metrics_url))
        except (httpx.HTTPError, ValueError) as exc:
            self.scrape_errors += 1
            log.debug("scrape of %s failed: %r", replica.url, exc)
            return
        self.scrapes += 1
        # a request sent a scrape interval before this scrape began has reached the replica
        replica.observe(signals, time.monotonic(), sent_before=started - self.scrape_interval_s)

    async def _fetch(self, url: str) -> Signals:
        response = await self.client.get(url)
        response.raise_for_status()
        return parse_metrics(response.content)

    async def _probe(self, replica: Replica) -> None:
        try:
            response = await self.client.get(replica.url + replica.spec.health_path)
            ok = response.status_code == 200
            detail = f"{replica.spec.health_path} answered {response.status_code}"
        except httpx.HTTPError as exc:
            ok = False
            detail = f"{replica.spec.health_path} failed: {exc!r}"
        was_up = replica.health.up
        replica.health.probe(ok)
        if replica.health.up != was_up:
            # an operator's first question when latency moves: which replica came or went, and when;
            # coming up is normal operation (a new Pod, a restart done), going down is not
            log.log(
                logging.INFO if replica.health.up else logging.WARNING,
                "replica %s of pool %s is %s (%s)",
                replica.url,
                replica.spec.model,
                "up" if replica.health.up else "down",
                detail,
            )
