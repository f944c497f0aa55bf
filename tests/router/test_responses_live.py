"""The Responses API through the real router in front of real sim replicas, which keep their
responses to themselves as vLLM does (issue 12, deliverable 3): a follow-up with
previous_response_id goes to the replica that holds it, stream or not; an unknown id, or one
whose replica left the pool or is down, gets a clear OpenAI error instead of the wrong replica's
404."""

from __future__ import annotations

import asyncio
import json

import pytest

from router import ReplicaSpec, RouterSettings, create_app
from router.discovery import DiscoveredReplica
from tests.router.conftest import MODEL, Served
from tests.router.test_metrics_series import _Pushed as PushedSource

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("exact_only")]
URL = "/v1/responses"


def ask(text: str, previous: str | None = None, **extra: object) -> dict[str, object]:
    body: dict[str, object] = {"model": MODEL, "input": text, "max_output_tokens": 4, **extra}
    if previous is not None:
        body["previous_response_id"] = previous
    return body


def stream_events(text: str) -> list[dict[str, object]]:
    return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]


@pytest.fixture()
async def pool(start_replica, servers, redis_url):  # type: ignore[no-untyped-def]
    replicas = [await start_replica(), await start_replica()]
    source = PushedSource([ReplicaSpec(url=r.url, model=MODEL) for r in replicas])
    settings = RouterSettings(redis_url=redis_url, counters_flush_s=0.05, health_interval_s=0.05, policy="round_robin")
    router = await Served(create_app(settings, discovery=source)).start()
    servers.append(router)
    return router, replicas, source


async def test_follow_ups_go_to_the_replica_holding_the_response(pool, client) -> None:
    router, replicas, _ = pool
    first = await client.post(router.url + URL, json=ask("Hello"))
    assert first.status_code == 200, first.text
    holder, previous = first.headers["x-promptedge-replica"], first.json()["id"]
    for turn in range(4):  # round robin would alternate replicas: every follow-up lands on the holder
        follow = await client.post(router.url + URL, json=ask(f"and then {turn}", previous))
        assert follow.status_code == 200 and follow.headers["x-promptedge-replica"] == holder
        assert follow.json()["previous_response_id"] == previous
        previous = follow.json()["id"]
    streamed = await client.post(router.url + URL, json=ask("stream on", previous, stream=True))
    assert streamed.status_code == 200 and streamed.headers["x-promptedge-replica"] == holder
    events = stream_events(streamed.text)
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
    after_stream = await client.post(router.url + URL, json=ask("after", events[0]["response"]["id"]))
    assert after_stream.status_code == 200 and after_stream.headers["x-promptedge-replica"] == holder
    assert {r.url for r in replicas} >= {holder}


async def test_unknown_gone_or_down_holders_are_clear_openai_errors(pool, client) -> None:
    router, replicas, source = pool
    unknown = await client.post(router.url + URL, json=ask("hi", "resp_never_made"))
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "previous_response_not_found"
    assert unknown.json()["error"]["param"] == "previous_response_id"
    first = await client.post(router.url + URL, json=ask("Hello"))
    holder, previous = first.headers["x-promptedge-replica"], first.json()["id"]
    other = next(r for r in replicas if r.url != holder)
    holder_server = next(r for r in replicas if r.url == holder)
    await holder_server.stop()  # down, still in the pool: retry later
    for _ in range(100):
        down = await client.post(router.url + URL, json=ask("again", previous))
        if down.status_code == 503:
            break
        await asyncio.sleep(0.05)
    assert down.status_code == 503 and down.json()["error"]["code"] == "replica_unavailable", down.text
    source.publish([DiscoveredReplica(ReplicaSpec(url=other.url, model=MODEL))])  # scaled down: gone
    gone = await client.post(router.url + URL, json=ask("again", previous))
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "previous_response_not_found"
    assert holder in gone.json()["error"]["message"]
    fresh = await client.post(router.url + URL, json=ask("a new conversation"))
    assert fresh.status_code == 200 and fresh.headers["x-promptedge-replica"] == other.url
    bad = await client.post(router.url + URL, json={"model": MODEL, "input": []})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input"
