"""Dispatch and in-flight accounting against real simulated replicas."""

from __future__ import annotations

import asyncio
import dataclasses

from router.dispatch.signals import parse_metrics
from tests.router.conftest import CHAT


def inflight(router) -> dict[str, int]:
    return {r.url: r.inflight for r in router.app.state.router.pools.all()}


async def running(client, replica) -> float:
    signals = parse_metrics((await client.get(replica.url + "/metrics")).content)
    return (signals.running or 0) + (signals.waiting or 0)


async def test_least_load_sends_new_work_away_from_a_loaded_replica(start_replica, start_router, client) -> None:
    busy = await start_replica()
    idle = await start_replica()
    router = await start_router([busy.url, idle.url], scrape_interval_s=0.05)
    # Load `busy` behind the router's back: only its scraped metrics show it.
    long = {**CHAT, "max_tokens": 120}
    background = [asyncio.create_task(client.post(busy.url + "/v1/chat/completions", json=long)) for _ in range(6)]
    while await running(client, busy) < 6:
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.2)  # a few scrape intervals
    fresh = [{**CHAT, "messages": [{"role": "user", "content": f"question {i}"}]} for i in range(4)]
    answers = await asyncio.gather(*(client.post(router.url + "/v1/chat/completions", json=b) for b in fresh))
    assert [a.headers["x-promptedge-replica"] for a in answers] == [idle.url] * 4
    for task in background:
        task.cancel()
    await asyncio.gather(*background, return_exceptions=True)


async def test_idle_pool_is_filled_evenly(start_replica, start_router, client) -> None:
    replicas = [await start_replica() for _ in range(3)]
    # One scrape at start (all idle), none during the test: a scrape taken while a request ran
    # would rightly make that replica look a little busier and break the tie.
    router = await start_router([r.url for r in replicas], scrape_interval_s=60)
    # Equal replicas, equal ties: the speed each learns from its answers (router/dispatch/speed.py) would
    # break ties by timing noise on a loaded test machine, so it is switched off here.
    state = router.app.state.router
    chooser = state.forwarder.chooser
    chooser.weights = dataclasses.replace(chooser.weights, speed=None)
    bodies = [{**CHAT, "messages": [{"role": "user", "content": f"q{i}"}]} for i in range(6)]
    served = [
        (await client.post(router.url + "/v1/chat/completions", json=b)).headers["x-promptedge-replica"] for b in bodies
    ]
    assert sorted(served.count(r.url) for r in replicas) == [2, 2, 2]


async def test_inflight_is_exact_after_streams_errors_and_disconnects(start_replica, start_router, client) -> None:
    replica = await start_replica()
    router = await start_router([replica.url])
    url = router.url + "/v1/chat/completions"
    await client.post(url, json={**CHAT, "stream": True})
    await client.post(url, json={**CHAT, "max_tokens": 3})
    await client.post(url, json={**CHAT, "temperature": "bad"})
    assert inflight(router) == {replica.url: 0}

    # A client that hangs up mid-stream: the count drops and the replica stops generating.
    slow = {**CHAT, "stream": True, "max_tokens": 400, "messages": [{"role": "user", "content": "long one"}]}
    async with client.stream("POST", url, json=slow) as response:
        async for _ in response.aiter_raw():
            assert inflight(router) == {replica.url: 1}
            break
    for _ in range(100):
        if inflight(router)[replica.url] == 0 and await running(client, replica) == 0:
            break
        await asyncio.sleep(0.02)
    assert inflight(router) == {replica.url: 0}
    assert await running(client, replica) == 0  # 400 tokens take 2 s: this is the abort, not the end


async def test_client_gone_during_a_non_stream_request_releases_and_cancels(
    start_replica, start_router, client
) -> None:
    replica = await start_replica(hang=True)  # never answers: only a cancel can end the request
    router = await start_router([replica.url])
    task = asyncio.create_task(client.post(router.url + "/v1/chat/completions", json=CHAT))
    while inflight(router)[replica.url] == 0:
        await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    for _ in range(100):
        if inflight(router)[replica.url] == 0:
            break
        await asyncio.sleep(0.02)
    assert inflight(router) == {replica.url: 0}
    text = (await client.get(router.url + "/metrics")).text
    assert 'status="499"' in text
