"""The router's Prometheus series stay bounded while replicas come and go (issue 13, finding 5's
class: a label per thing that is gone)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from router import ReplicaSpec, RouterSettings, create_app
from router.discovery import DiscoveredReplica, Publish, StaticSource
from tests.router.conftest import MODEL, Served
from tests.router.test_cache_api import chat

pytestmark = pytest.mark.slow

URL = "/v1/chat/completions"


class _Pushed(StaticSource):
    """A replica source whose snapshots the test publishes, as discovery does when Pods come
    and go (the router's own reconcile path runs on each)."""

    async def start(self, publish: Publish) -> None:
        self.publish = publish
        await super().start(publish)


async def test_a_replica_that_left_leaves_no_request_series_behind(start_replica, servers, client, redis_url) -> None:
    # Found with finding 5: with autoscaling, every Pod that ever served kept its
    # promptedge_router_requests_total series for the router's lifetime.
    gone, staying = await start_replica(), await start_replica()
    source = _Pushed([ReplicaSpec(url=gone.url, model=MODEL), ReplicaSpec(url=staying.url, model=MODEL)])
    settings = RouterSettings(redis_url=redis_url, counters_flush_s=0.05, health_interval_s=0.05, policy="round_robin")
    router = await Served(create_app(settings, discovery=source)).start()
    servers.append(router)
    served_by = set()
    for i in range(40):
        response = await client.post(
            router.url + URL, json=chat(f"Question {i}?"), headers={"cache-control": "no-store"}
        )
        served_by.add(response.headers.get("x-promptedge-replica"))
        if served_by >= {gone.url, staying.url}:
            break
        await asyncio.sleep(0.05)
    assert served_by >= {gone.url, staying.url}
    assert f'replica="{gone.url}"' in _request_series(await client.get(router.url + "/metrics"))
    source.publish([DiscoveredReplica(ReplicaSpec(url=staying.url, model=MODEL))])
    series = _request_series(await client.get(router.url + "/metrics"))
    assert f'replica="{gone.url}"' not in series and f'replica="{staying.url}"' in series


def _request_series(metrics: httpx.Response) -> str:
    return "\n".join(line for line in metrics.text.splitlines() if line.startswith("promptedge_router_requests_total{"))
