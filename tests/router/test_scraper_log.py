"""The scraper's log line when a replica's ``/health`` probes change its state: coming up is
normal operation (a new Pod, a restart done) and is logged at INFO; going down is WARNING."""

from __future__ import annotations

import logging

import httpx
import pytest

from router import ReplicaSpec
from router.fleet.health import HealthConfig
from router.fleet.replicas import Pools
from router.fleet.scraper import Scraper

URL = "http://10.0.0.7:8000"


async def test_up_is_info_and_down_is_warning(caplog: pytest.LogCaptureFixture) -> None:
    healthy = True

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200 if healthy else 503)

    pools = Pools([ReplicaSpec(url=URL, model="m", metrics_path=None)], HealthConfig(rise=1, fall=1))
    caplog.set_level(logging.DEBUG, logger="router.scraper")
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        scraper = Scraper(pools, client, scrape_interval_s=60, health_interval_s=60)
        await scraper.probe_all()  # starts down: the first 200 brings it up
        healthy = False
        await scraper.probe_all()
    records = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "router.scraper"]
    assert records == [
        (logging.INFO, f"replica {URL} of pool m is up (/health answered 200)"),
        (logging.WARNING, f"replica {URL} of pool m is down (/health answered 503)"),
    ]
